"""Export the real architectures, with seeded weights, from their upstream code (a dev tool).

    python tools/reference_models.py                      # every model, into the cache folder
    python tools/reference_models.py --only compact-x4 rrdb-x4plus
    python tools/reference_models.py --list               # what the manifest holds

The public model files cannot be downloaded here, but their architectures can be rebuilt from the
upstream Python packages and exported: the graphs, operators, sizes and I/O are those of the
public files; only the weights differ (seeded random). Tests and benchmarks run the product on
these (tests/test_real_models.py, bench/). Needs the `reference` extra (torch, spandrel,
dlr-moge); DA3-SMALL also `depth-anything-3` (installed without its requirements: see
`Reference.optional`), exported only when it is installed. The add-on itself never imports torch.

Where: `$LEAN_IMAGE_AI_REFERENCE_DIR`, else `~/.cache/lean_image_ai/reference_models` (outside
the repository: a 67 MB RRDBNet has no place in git). `manifest.json` there lists per model its
family, parameter count, file size and sha256, opset, inputs and outputs (names, shapes, dtypes),
export seconds, the upstream package and version and how the weights were initialised. A model
already in the manifest whose file still matches (size and sha256) is not exported again; one
whose recipe changed is. Files and the manifest are written to a temporary name and renamed, so
an interrupted export never leaves a half-written model under its final name. What each model
is and how its weights are initialised (so the signal survives depth): tools/reference_builds.py.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, also when loaded by path
from da3_dynamic_export import DynamicSizes  # noqa: E402
from reference_builds import REFERENCES, CartesianProdAsMeshgrid, Reference  # noqa: E402

OPSET = 17


def reference_dir() -> Path:
    configured = os.environ.get("LEAN_IMAGE_AI_REFERENCE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "lean_image_ai" / "reference_models"


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


# ---- export and manifest -------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _value_info(values) -> list[dict]:
    import onnx

    out = []
    for value in values:
        tensor = value.type.tensor_type
        shape = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor.shape.dim]
        out.append({"name": value.name, "shape": shape, "dtype": onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})
    return out


def _describe(path: Path) -> dict:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"opset": opset, "inputs": _value_info(model.graph.input), "outputs": _value_info(model.graph.output)}


def _export(reference: Reference, directory: Path) -> dict:
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = reference.build().eval()
    params = sum(p.numel() for p in model.parameters())
    target = directory / f"{reference.name}.onnx"
    partial = target.with_suffix(".onnx.part")
    started = time.perf_counter()
    sizes = DynamicSizes() if reference.traced_sizes else contextlib.nullcontext()
    with torch.no_grad(), CartesianProdAsMeshgrid(), sizes:
        # the TorchScript exporter: the one that made the public Real-ESRGAN/MoGe-2 files
        torch.onnx.export(
            model, reference.sample(), str(partial), dynamo=False, opset_version=OPSET,
            input_names=list(reference.input_names), output_names=list(reference.output_names),
            dynamic_axes=reference.dynamic_axes, do_constant_folding=True,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    os.replace(partial, target)
    return {
        "name": reference.name,
        "family": reference.family,
        "file": target.name,
        "public_file": reference.public_file,
        "params": params,
        "file_bytes": target.stat().st_size,
        "sha256": _sha256(target),
        **_describe(target),
        "export_seconds": round(seconds, 2),
        "init": reference.init,
        "config": reference.config,
        "source": {
            reference.package: reference.vendored_from or _package_version(reference.package),
            "torch": torch.__version__,
        },
        "recipe": reference.recipe,
    }


def load_manifest(directory: Path | None = None) -> dict:
    path = (directory or reference_dir()) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"models": {}}


def _still_valid(entry: dict | None, reference: Reference, directory: Path) -> bool:
    if not entry or entry.get("recipe") != reference.recipe:
        return False
    path = directory / entry["file"]
    return path.is_file() and path.stat().st_size == entry["file_bytes"] and _sha256(path) == entry["sha256"]


def _write_manifest(directory: Path, manifest: dict) -> None:
    partial = directory / "manifest.json.part"
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, directory / "manifest.json")


def ensure(names=None, directory: Path | None = None, force: bool = False, log=print) -> dict:
    """Export every named model (all by default) not already in the manifest; the manifest."""
    directory = Path(directory or reference_dir())
    directory.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(directory)
    for name in names or default_names():
        if name not in REFERENCES:
            raise SystemExit(f"unknown reference model {name!r}: choose from {', '.join(REFERENCES)}")
        if not force and _still_valid(manifest["models"].get(name), REFERENCES[name], directory):
            continue
        log(f"exporting {name} ...")
        manifest["models"][name] = _export(REFERENCES[name], directory)
        _write_manifest(directory, manifest)  # after each model: a later failure keeps the earlier ones
    return manifest


def default_names() -> list[str]:
    """Every model, less the optional ones whose package is not installed."""
    return [n for n, r in REFERENCES.items() if not r.optional or importlib.util.find_spec(r.package.replace("-", "_"))]


def model_path(name: str, directory: Path | None = None) -> Path:
    """The exported file of one reference model (exported first if missing)."""
    directory = Path(directory or reference_dir())
    manifest = ensure([name], directory, log=lambda _: None)
    return directory / manifest["models"][name]["file"]


def _table(manifest: dict, names) -> str:
    rows = [f"{'model':<17} {'family':<8} {'params':>11} {'MB':>8} {'export s':>9} opset"]
    for name in names:
        e = manifest["models"].get(name)
        if e:
            rows.append(
                f"{name:<17} {e['family']:<8} {e['params']:>11,} {e['file_bytes'] / 1e6:>8.1f} "
                f"{e['export_seconds']:>9.1f} {e['opset']}"
            )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(REFERENCES), help="export only these")
    parser.add_argument("--dir", type=Path, help="cache folder (default: $LEAN_IMAGE_AI_REFERENCE_DIR or ~/.cache/...)")
    parser.add_argument("--force", action="store_true", help="export again even when the cached file matches")
    parser.add_argument("--list", action="store_true", help="print the manifest's table and export nothing")
    args = parser.parse_args(argv)
    directory = args.dir or reference_dir()
    names = args.only or default_names()
    manifest = load_manifest(directory) if args.list else ensure(names, directory, force=args.force)
    print(f"reference models in {directory}")
    print(_table(manifest, names))
    summary = {
        n: {k: manifest["models"][n][k] for k in ("params", "file_bytes", "export_seconds", "opset")}
        for n in names
        if n in manifest["models"]
    }
    print(json.dumps({"directory": str(directory), "models": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
