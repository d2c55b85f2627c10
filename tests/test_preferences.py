"""ui/preferences.py and operators/prefs.py with real bpy: device list from onnxruntime, device
strings, fallbacks, the models folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
P = bh.import_submodule("ui.preferences")
R = bh.import_submodule("operators.prefs")  # what operators read of the preferences
from lean_image_ai.models.store import library  # noqa: E402

EXPECTED_PROVIDER = {
    "CUDA": "CUDAExecutionProvider",
    "DIRECTML": "DmlExecutionProvider",
    "COREML": "CoreMLExecutionProvider",
}


@pytest.fixture
def registered():
    with bh.registered_addon() as package:
        yield package


def test_root_package_name():
    assert P.ADDON_ID == "lean_image_ai"
    assert P.LeanImageAIPreferences.bl_idname == "lean_image_ai"


def test_device_items_match_what_can_run_here(registered):
    """onnxruntime's providers, less the NVIDIA ones where the driver sees no GPU."""
    onnxruntime = pytest.importorskip("onnxruntime")
    from lean_image_ai.runtime.measure.memory import nvidia_gpu_count

    providers = onnxruntime.get_available_providers()
    if nvidia_gpu_count() == 0:
        providers = [p for p in providers if p not in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    items = P.device_items(None, bpy.context)
    idents = [item[0] for item in items]
    assert idents[:2] == ["AUTO", "CPU"]
    for ident, provider in EXPECTED_PROVIDER.items():
        assert (ident in idents) == (provider in providers), (ident, providers)
    assert len(set(idents)) == len(idents)
    # the callback hands out the same, module-held list (Blender needs the strings kept alive)
    assert P.device_items(None, bpy.context) is items is P._device_items
    # stable numbers: what Blender stores must not depend on which providers exist
    numbers = {item[0]: item[4] for item in items}
    assert numbers["AUTO"] == 0 and numbers["CPU"] == 1
    assert numbers.get("CUDA", 2) == 2


@pytest.mark.parametrize(
    "providers, expected",
    [
        (["CPUExecutionProvider"], ["AUTO", "CPU"]),
        ([], ["AUTO", "CPU"]),
        (["CUDAExecutionProvider", "CPUExecutionProvider"], ["AUTO", "CPU", "CUDA"]),
        (["DmlExecutionProvider", "CPUExecutionProvider"], ["AUTO", "CPU", "DIRECTML"]),
        (["CoreMLExecutionProvider", "CPUExecutionProvider"], ["AUTO", "CPU", "COREML"]),
        (
            [
                "TensorrtExecutionProvider",
                "CUDAExecutionProvider",
                "DmlExecutionProvider",
                "CoreMLExecutionProvider",
            ],
            ["AUTO", "CPU", "CUDA", "DIRECTML", "COREML"],
        ),
    ],
)
def test_compute_device_items(providers, expected):
    assert [item[0] for item in P.compute_device_items(providers)] == expected


def test_missing_onnxruntime_still_offers_auto_and_cpu(monkeypatch):
    # what `doctor --providers` answers where onnxruntime cannot be imported (ui/runtime_probe.py)
    probe = bh.import_submodule("ui.runtime_probe")
    monkeypatch.setitem(probe._state, "answer", {"onnxruntime_error": "no", "installed": [], "runnable": []})
    monkeypatch.setattr(P, "_offered", [])
    assert probe.installed() == ["CPUExecutionProvider"]
    assert [i[0] for i in P.compute_device_items()] == ["AUTO", "CPU"]


@pytest.mark.parametrize(
    "device, index, expected",
    [
        ("AUTO", 0, "auto"),
        ("CPU", 3, "cpu"),
        ("CUDA", 0, "cuda:0"),
        ("CUDA", 2, "cuda:2"),
        ("DIRECTML", 1, "directml"),
        ("COREML", 0, "coreml"),
        ("", 0, "auto"),  # a stored choice this onnxruntime no longer offers
    ],
)
def test_get_device_string_for_every_choice(device, index, expected):
    prefs = R.DefaultPreferences(device=device, cuda_device_index=index)
    assert R.device_string(prefs) == expected


def test_device_strings_are_understood_by_the_runtime():
    providers = pytest.importorskip("lean_image_ai.runtime.providers")
    for ident, *_ in P.DEVICE_CHOICES:
        text = R.device_string(R.DefaultPreferences(device=ident, cuda_device_index=1))
        assert str(providers.parse_device(text)).split(":")[0] == text.split(":")[0]


def test_get_prefs_falls_back_to_defaults_when_not_an_enabled_addon(registered):
    assert P.LeanImageAIPreferences.is_registered
    assert P.ADDON_ID not in bpy.context.preferences.addons
    prefs = R.get_prefs(bpy.context)
    assert isinstance(prefs, R.DefaultPreferences)
    assert prefs.device == "AUTO" and prefs.models_dir == ""
    assert (
        prefs.release_cpu_memory is True and prefs.gpu_memory_budget_mb == 0 and prefs.cuda_device_index == 0
    )
    assert R.device_string(prefs) == "auto"
    assert R.memory_budget_bytes(prefs) is None
    assert R.memory_budget_bytes(R.DefaultPreferences(gpu_memory_budget_mb=3)) == 3 * 1024 * 1024


def test_defaults_mirror_the_blender_properties():
    annotations = P.LeanImageAIPreferences.__annotations__
    defaults = R.DefaultPreferences()
    for name in ("models_dir", "device", "cuda_device_index", "gpu_memory_budget_mb", "ram_budget_mb",
                 "release_cpu_memory", "ram_release_delay_s", "idle_unload_minutes", "cudnn_max_workspace",
                 "keep_models_loaded_on_dml_coreml", "coreml_compute_units"):
        assert name in annotations and hasattr(defaults, name)
        prop = annotations[name]
        if name != "device":  # dynamic enum: default is the item number 0 == AUTO
            assert prop.keywords["default"] == getattr(defaults, name), name
    assert annotations["device"].keywords["default"] == 0 and P.DEVICE_CHOICES[0][0] == defaults.device
    assert annotations["models_dir"].keywords["subtype"] == "DIR_PATH"


def test_real_preferences_object_when_enabled(registered, monkeypatch):
    # Pretend the add-on is enabled: an AddonPreferences instance behind context.preferences.addons.
    addon = bpy.context.preferences.addons.new()
    addon.module = P.ADDON_ID
    try:
        prefs = R.get_prefs(bpy.context)
        assert isinstance(prefs, P.LeanImageAIPreferences)
        assert prefs.device == "AUTO" and prefs.release_cpu_memory is True
        prefs.device = "CPU"
        assert R.device_string(R.get_prefs(bpy.context)) == "cpu"
        if "CUDA" in [i[0] for i in P.device_items()]:
            prefs.device = "CUDA"
            prefs.cuda_device_index = 1
            assert R.device_string(prefs) == "cuda:1"
        missing = [c[0] for c in P.DEVICE_CHOICES if c[0] not in [i[0] for i in P.device_items()]]
        if missing:
            with pytest.raises(TypeError):
                prefs.device = missing[0]  # not offered by this onnxruntime
    finally:
        bpy.context.preferences.addons.remove(addon)


def test_models_dir_resolution(registered, tmp_path, monkeypatch):
    chosen = tmp_path / "chosen"
    monkeypatch.delenv(library.MODELS_DIR_ENV, raising=False)
    addon = bpy.context.preferences.addons.new()
    addon.module = R.ADDON_ID
    try:
        prefs = R.get_prefs(bpy.context)
        # the explicit preference wins, and is created on request
        prefs.models_dir = str(chosen)
        assert R.models_folder(bpy.context, create=True) == chosen and chosen.is_dir()
        # the environment variable next; nothing is created by asking
        prefs.models_dir = ""
        monkeypatch.setenv(library.MODELS_DIR_ENV, str(tmp_path / "env"))
        assert R.models_folder(bpy.context) == tmp_path / "env"
        assert not (tmp_path / "env").exists()
        # default: the per-user data folder the command line uses too, outside Blender's folders;
        # a library in the old default (Blender's user datafiles) is moved there once
        monkeypatch.delenv(library.MODELS_DIR_ENV)
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
        old = Path(bpy.utils.user_resource("DATAFILES", path="lean_image_ai/models", create=False))
        old.mkdir(parents=True, exist_ok=True)
        (old / "kept.onnx").write_bytes(b"weights")
        R._migrated.clear()
        default = R.models_folder(bpy.context)
        assert default == tmp_path / "data" / "lean_image_ai" / "models" == library.models_dir()
        assert (default / "kept.onnx").read_bytes() == b"weights" and not (old / "kept.onnx").exists()
    finally:
        bpy.context.preferences.addons.remove(addon)


class _RecordingLayout:
    def __init__(self, log):
        self.log = log
        self.enabled = True

    def column(self, **_kw):
        return _RecordingLayout(self.log)

    def row(self, **_kw):
        return _RecordingLayout(self.log)

    def prop(self, data, name, **_kw):
        self.log.append(("prop", name))

    def label(self, text="", **_kw):
        self.log.append(("label", text))

    def separator(self, **_kw):
        self.log.append(("separator", ""))


def test_draw_shows_every_property_and_calls_the_catalog_hook(registered, monkeypatch):
    log = []
    hook = []
    monkeypatch.setattr(P, "draw_model_catalog", lambda layout, context: hook.append(layout))
    monkeypatch.setattr(P, "draw_gpu_runtime", lambda layout, context: hook.append(layout))
    monkeypatch.setattr(P, "draw_doctor", lambda layout: hook.append(layout))
    # an NVIDIA GPU here: CUDA's index and cuDNN's choice are drawn too (without one they are not:
    # tests/test_prefs_doctor.py)
    monkeypatch.setattr(P, "offered_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    fake = R.DefaultPreferences()
    fake.layout = _RecordingLayout(log)
    P.LeanImageAIPreferences.draw(fake, bpy.context)
    drawn = {name for kind, name in log if kind == "prop"}
    assert drawn == {
        "models_dir",
        "device",
        "cuda_device_index",
        "gpu_memory_budget_mb",
        "ram_budget_mb",
        "release_cpu_memory",
        "ram_release_delay_s",
        "idle_unload_minutes",
        "cudnn_max_workspace",
        "keep_models_loaded_on_dml_coreml",  # CoreML's compute units: only where CoreML is offered
    }
    assert hook == [fake.layout] * 3  # the GPU runtime box, the doctor and the model list
    assert any(text.startswith("Can run on: ") for kind, text in log if kind == "label")


@pytest.mark.parametrize(
    "pref, setting, default, chosen",
    [
        # off by default: cuDNN may otherwise take most free VRAM; the artist may turn it on
        ("cudnn_max_workspace", "cudnn_max_workspace", False, True),
        # 0 by default (RAM back at each job's end); seconds without a job once the artist sets it
        ("ram_release_delay_s", "cpu_release_delay", 0.0, 2.5),
        # DirectML/CoreML: the job's models unloaded at its end unless the artist keeps them
        ("keep_models_loaded_on_dml_coreml", "keep_models_loaded_on_dml_coreml", False, True),
        ("coreml_compute_units", "coreml_compute_units", "ALL", "CPUAndNeuralEngine"),
    ],
)
def test_preference_reaches_the_runtime(registered, pref, setting, default, chosen):
    """The preference goes with each job to the model worker's runtime (Blender's process has
    none): the worker client keeps it, and a job without a runtime of its own sends it."""
    from lean_image_ai.models.base import RunOptions
    from lean_image_ai.models.worker import client as worker_client

    addon = bpy.context.preferences.addons.new()
    addon.module = P.ADDON_ID
    worker = worker_client.shared()
    saved = worker.settings
    try:
        prefs = R.get_prefs(bpy.context)
        R.configure_runtime(bpy.context)
        assert getattr(prefs, pref) == default and worker.settings[setting] == default
        setattr(prefs, pref, chosen)
        R.configure_runtime(bpy.context)
        assert worker.job_settings(RunOptions())[setting] == chosen
    finally:
        worker.settings = saved
        bpy.context.preferences.addons.remove(addon)


def test_preferences_name_the_release_rule_and_the_device_the_last_job_got(registered):
    from lean_image_ai.models.worker import host_record

    saved = host_record.last_job_memory
    try:
        host_record.last_job_memory = None
        prefs = R.DefaultPreferences(device="DIRECTML")
        assert R.release_rule_lines(prefs, ["DmlExecutionProvider", "CPUExecutionProvider"]) == [
            "Memory on DirectML: the job's sessions are unloaded when it ends; the next job loads the model again"
        ]
        kept = R.DefaultPreferences(device="AUTO", keep_models_loaded_on_dml_coreml=True)
        assert R.release_rule_lines(kept, ["CoreMLExecutionProvider", "CPUExecutionProvider"])[0] == (
            "Memory on CoreML: nothing is given back at the job's end (models stay loaded)"
        )
        cpu = R.DefaultPreferences(device="AUTO")
        host_record.last_job_memory = {"release_rules": ["CPU: shrink (the arena shrinks in the job's last run)"]}
        assert R.release_rule_lines(cpu, ["CPUExecutionProvider"]) == [
            "Memory on CPU: the arena shrinks in the job's last run; weights stay loaded",
            "Last job ran on CPU: shrink (the arena shrinks in the job's last run)",
        ]
    finally:
        host_record.last_job_memory = saved


def test_the_device_menu_is_the_device_table_with_stable_numbers():
    """Saved preferences store the enum's number: the menu made from the device table keeps the
    numbers the add-on has always used, one per device, and every table row is in it."""
    from lean_image_ai.runtime.providers import DEVICES

    numbers = {ident: number for ident, _label, _text, _provider, number in P.DEVICE_CHOICES}
    assert {k: numbers[k] for k in ("AUTO", "CPU", "CUDA", "DIRECTML", "COREML")} == {
        "AUTO": 0, "CPU": 1, "CUDA": 2, "DIRECTML": 3, "COREML": 4,
    }  # fmt: skip
    assert len(set(numbers.values())) == len(numbers) == len(DEVICES) + 1
    assert "CUDA, then DirectML, then CoreML, else CPU" in P.DEVICE_CHOICES[0][2]
