"""The model catalog: built-in entries are sane, user models register and persist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lean_image_ai.models import families
from lean_image_ai.models.store import library
from lean_image_ai.models.store.catalog import BUILTIN_ENTRIES, Catalog, CatalogEntry, register_user_model
from lean_image_ai.runtime.errors import LeanImageError, ModelFileError

FAMILIES = families.IDS

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _fake_onnx(tmp_path: Path, name: str = "my_sr_x4.onnx", size: int = 64) -> Path:
    path = tmp_path / name
    path.write_bytes(b"\x08\x07" + bytes(range(size - 2)))
    return path


# -- built-in entries -----------------------------------------------------------------------


def test_every_family_has_a_builtin_entry():
    assert {e.family for e in BUILTIN_ENTRIES} == set(FAMILIES)


@pytest.mark.parametrize("entry", BUILTIN_ENTRIES, ids=lambda e: e.id)
def test_builtin_entry_is_sane(entry: CatalogEntry):
    assert entry.family in FAMILIES
    assert entry.sha256 is None or HEX64.match(entry.sha256)
    assert entry.size_bytes is None or (isinstance(entry.size_bytes, int) and entry.size_bytes > 0)
    if entry.url is not None:
        assert entry.url.startswith("https://huggingface.co/")
        assert "/resolve/" in entry.url
        assert entry.url.endswith(".onnx")
    assert entry.filename.endswith(".onnx") and "/" not in entry.filename
    assert entry.license and entry.source and entry.title
    assert not entry.is_user and entry.path is None
    # A checksum is only given together with the exact size it was taken from.
    if entry.sha256 is not None:
        assert entry.size_bytes is not None
    # Whatever is unknown must be said so in the notes.
    if entry.sha256 is None or entry.size_bytes is None:
        assert "unknown" in entry.notes.lower()
    if entry.url is None:
        assert "register" in entry.notes.lower()


def test_builtin_ids_and_filenames_are_unique():
    ids = [e.id for e in BUILTIN_ENTRIES]
    names = [e.filename for e in BUILTIN_ENTRIES]
    assert len(ids) == len(set(ids))
    assert len(names) == len(set(names)), "two entries would overwrite each other's file"


def entry_fields(**overrides) -> dict:
    fields = dict(
        id="x",
        family="upscale",
        variant="v",
        title="t",
        filename="x.onnx",
        url=None,
        size_bytes=None,
        sha256=None,
        license="MIT",
        source="s",
    )
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    "family, settings, problem",
    [
        ("upscale", {"tile": 128}, "unknown upscale setting 'tile'"),  # read by no code: gone
        ("upscale", {"tile_overlap": -1}, "tile_overlap"),
        ("ben2", {"mean": (0.5, 0.5)}, "mean"),
        ("da3", {"process_res": "504"}, "process_res"),
        ("moge2", {"num_tokens_range": (3600, 1200)}, "num_tokens_range"),
        ("moge2", {"mask_threshold": 2}, "mask_threshold"),
    ],
)
def test_entry_settings_are_checked_against_the_family(family, settings, problem):
    with pytest.raises(ValueError, match=re.escape(problem)) as err:
        CatalogEntry(**entry_fields(id="bad-entry", family=family, settings=settings))
    assert "bad-entry" in str(err.value)  # the message names the entry


def test_settings_become_the_adapters_keywords():
    """Each built-in entry's settings map onto keywords its adapter's run() really takes, with
    the artist's adapter options added and front-end-only options left out."""
    import inspect

    c = Catalog()
    for entry in c.entries():
        family = families.get(entry.family)
        accepted = set(inspect.signature(family.run).parameters)
        values = {o.name: o.default for o in family.options}
        kwargs = entry.adapter_kwargs(**values)
        assert set(kwargs) <= accepted, (entry.id, set(kwargs) - accepted)
        assert not {o.name for o in family.options if not o.to_adapter} & set(kwargs)
    # the two BEN2 exports keep their different normalisations apart
    assert c.get("ben2-fp16").adapter_kwargs()["mean"] == (0.485, 0.456, 0.406)
    assert c.get("ben2-base").adapter_kwargs()["mean"] == (0.0, 0.0, 0.0)
    assert c.get("da3-metric-large").adapter_kwargs()["multiple"] == 14  # renamed keyword


def test_settings_mapping_is_read_only():
    entry = BUILTIN_ENTRIES[0]
    with pytest.raises(TypeError):
        entry.settings["mean"] = (0, 0, 0)  # type: ignore[index]
    hash(entry)  # frozen entries stay hashable despite the mapping


@pytest.mark.parametrize(
    "bad",
    [
        {"family": "sam"},
        {"sha256": "ABC"},
        {"sha256": "g" * 64},
        {"size_bytes": 0},
        {"url": "ftp://example.org/x.onnx"},
        {"filename": "sub/dir.onnx"},
    ],
)
def test_entry_validation_rejects_bad_fields(bad):
    with pytest.raises(ValueError):
        CatalogEntry(**entry_fields(**bad))


def test_get_unknown_id_raises_keyerror():
    with pytest.raises(KeyError, match="nope"):
        Catalog().get("nope")


def test_entries_filters_by_family():
    c = Catalog()
    assert [e.id for e in c.entries("moge2")] == ["moge2-vits", "moge2-vitb", "moge2-vitl"]
    assert len(c.entries()) == len(BUILTIN_ENTRIES)
    with pytest.raises(ValueError):
        c.entries("nope")


# -- user models ----------------------------------------------------------------------------


def test_register_user_model_makes_a_path_entry(tmp_path):
    path = _fake_onnx(tmp_path)
    entry = register_user_model("upscale", path, title="My 4x", settings={"tile_overlap": 34})
    assert entry.is_user and entry.url is None and entry.sha256 is None
    assert Path(entry.path) == path.resolve()
    assert entry.filename == "my_sr_x4.onnx"
    assert entry.title == "My 4x"
    assert dict(entry.settings) == {"tile_overlap": 34}
    assert entry.id.startswith("user-upscale-")
    # The same path gives the same id (stable across sessions); another path another id.
    assert register_user_model("upscale", path).id == entry.id
    other = _fake_onnx(tmp_path, "other.onnx")
    assert register_user_model("upscale", other).id != entry.id


def test_register_user_model_rejects_bad_input(tmp_path):
    with pytest.raises(ModelFileError, match="no file"):
        register_user_model("upscale", tmp_path / "missing.onnx")
    path = _fake_onnx(tmp_path)
    with pytest.raises(ValueError, match="family"):
        register_user_model("segment", path)
    with pytest.raises(ValueError, match="unknown ben2 setting 'tile_overlap'"):
        register_user_model("ben2", path, settings={"tile_overlap": 4})


def test_catalog_add_get_remove_user_model(tmp_path):
    c = Catalog()
    entry = c.add_user_model("upscale", _fake_onnx(tmp_path), title="Mine")
    assert c.get(entry.id) is entry
    assert entry in c.entries("upscale")
    assert entry not in c.entries("ben2")
    assert entry.id in c
    with pytest.raises(ValueError, match="built-in"):
        c.remove_user_model("ben2-fp16")
    assert c.remove_user_model(entry.id) == entry
    assert entry.id not in c
    with pytest.raises(KeyError):
        c.remove_user_model(entry.id)
    # Removing a user model never deletes the user's file.
    assert Path(entry.path).exists()


def test_user_models_json_round_trip(tmp_path):
    c = Catalog()
    a = c.add_user_model("upscale", _fake_onnx(tmp_path, "a.onnx"), title="A")
    b = c.add_user_model(
        "ben2", _fake_onnx(tmp_path, "b.onnx"), settings={"mean": (0.5, 0.5, 0.5), "std": (1, 1, 1)}
    )
    store = tmp_path / "prefs" / "user_models.json"
    c.save_user_models(store)
    data = json.loads(store.read_text())
    assert data["format"] == 2 and len(data["user_models"]) == 2
    assert not list(store.parent.glob("*.tmp")), "atomic save leaves no temp file"

    fresh = Catalog()
    loaded = fresh.load_user_models(store)
    assert sorted(e.id for e in loaded) == sorted([a.id, b.id])
    assert fresh.get(a.id) == a
    assert fresh.get(b.id) == b
    assert fresh.get(b.id).settings["mean"] == (0.5, 0.5, 0.5)
    # Built-ins are untouched, and loading again replaces rather than duplicates.
    fresh.load_user_models(store)
    assert len(fresh.entries()) == len(BUILTIN_ENTRIES) + 2


def test_load_keeps_entries_whose_file_vanished(tmp_path):
    c = Catalog()
    path = _fake_onnx(tmp_path)
    entry = c.add_user_model("da3", path)
    store = c.save_user_models(tmp_path / "u.json")
    path.unlink()
    fresh = Catalog()
    fresh.load_user_models(store)
    assert fresh.get(entry.id).path == entry.path


def test_load_missing_or_broken_file(tmp_path):
    c = Catalog()
    assert c.load_user_models(tmp_path / "none.json") == []
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(LeanImageError, match="broken.json"):
        c.load_user_models(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": 99, "user_models": []}))
    with pytest.raises(LeanImageError, match="format"):
        c.load_user_models(wrong)
    typo = tmp_path / "typo.json"
    item = c.add_user_model("da3", _fake_onnx(tmp_path)).to_dict()
    item["settings"]["proces_res"] = 518
    typo.write_text(json.dumps({"format": 2, "user_models": [item]}))
    with pytest.raises(LeanImageError, match="proces_res"):  # never silently dropped
        Catalog().load_user_models(typo)


def test_format_1_files_load_without_the_retired_keys(tmp_path):
    """Models registered before the settings schema still load: format 1 saved every family
    default under 'preprocess', keys no code read included."""
    path = _fake_onnx(tmp_path)
    item = register_user_model("upscale", path).to_dict()
    del item["settings"]
    item["preprocess"] = {"channels": "RGB", "rescale": 1 / 255, "scale": 4, "tile": 256, "tile_overlap": 24}
    store = tmp_path / "user_models.json"
    store.write_text(json.dumps({"format": 1, "user_models": [item]}))
    (loaded,) = Catalog().load_user_models(store)
    assert dict(loaded.settings) == {"tile_overlap": 24}


# -- models folder --------------------------------------------------------------------------


def test_models_dir_order(monkeypatch, tmp_path):
    """An explicit choice, then the one environment variable, then the shared per-user data folder
    (per OS: tests/test_cli_models.py)."""
    monkeypatch.setenv("LEAN_IMAGE_AI_MODELS_DIR", str(tmp_path / "env"))
    assert library.models_dir(tmp_path / "chosen") == tmp_path / "chosen"
    assert library.models_dir("") == tmp_path / "env"
    monkeypatch.delenv("LEAN_IMAGE_AI_MODELS_DIR")
    assert library.models_dir("") == library.shared_models_dir()


@pytest.mark.parametrize("name", ["..", ".", "../x.onnx", "a\\\\b.onnx"])
def test_catalog_file_name_must_stay_in_the_models_folder(name):
    from model_server import loopback_entry

    with pytest.raises(ValueError, match="must be a bare file name .*fix the entry"):
        loopback_entry(None, None, filename=name)


def _ben2_entry(entry_id: str, dtype):
    return CatalogEntry(
        id=entry_id, family="ben2", variant=entry_id, title=entry_id, filename=f"{entry_id}.onnx", url=None,
        size_bytes=None, sha256=None, license="MIT", source="test", weight_dtype=dtype,
    )


def test_off_cuda_an_fp32_export_is_picked_before_an_fp16_one():
    from lean_image_ai.models.store.library import format_size, prefer_for_device

    fp16, fp32, unknown = _ben2_entry("half", "float16"), _ben2_entry("full", "float32"), _ben2_entry("mine", None)
    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], "cpu")] == ["full", "mine", "half"]
    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], "auto")] == ["full", "mine", "half"]
    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], "cuda:0")] == ["half", "full", "mine"]
    # the device string is read by the runtime's one rule (runtime/providers.py parse_device)
    from lean_image_ai.runtime import parse_device

    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], " CUDA:1 ")] == ["half", "full", "mine"]
    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], parse_device("cuda"))] == ["half", "full", "mine"]
    assert [e.id for e in prefer_for_device([fp16, fp32, unknown], "dml")] == ["full", "mine", "half"]
    assert "fp16 weights (slower on CPU)" in format_size(fp16) and "fp16" not in format_size(unknown)
    assert "1.22x" in fp16.fp16_on_cpu_note and fp32.fp16_on_cpu_note == ""
    with pytest.raises(ValueError, match="weight_dtype"):
        _ben2_entry("bad", "int8")


def test_the_builtin_fp16_files_say_so():
    """The design notes (issue #20): both public BEN2 files hold fp16 weights; DA3 METRIC-LARGE's
    ~0.7 GB file can only hold its 334 M parameters as fp16 (fp32 would be 1.34 GB)."""
    by_id = {e.id: e for e in BUILTIN_ENTRIES}
    assert by_id["ben2-fp16"].weight_dtype == by_id["ben2-base"].weight_dtype == "float16"
    da3 = by_id["da3-metric-large"]
    assert da3.weight_dtype == "float16" and da3.approx_size_bytes < 334_000_000 * 4 / 1.5
    assert "ReLU" in da3.notes and "1.34 GB" in da3.notes
