"""What each family's result becomes as files, and which files can hold it (bpy-free).

The policy, the same for Blender and the command line, single images and sequences:

- a cut-out (BEN2) needs alpha: a format without it (JPEG, BMP) is refused before anything runs;
- depth (DA3) defaults to EXR (float). A float TIFF keeps it too. An 8/16-bit format (PNG, JPEG)
  gets the depth normalised to 0..1, and the range it was mapped from is returned with the image
  so the writer can record it (report, and the file's metadata where the format has it);
- geometry (MoGe-2) is a mesh file (PLY, in Blender's camera axes: x right, y up, -z forward),
  a JSON file beside it with the camera intrinsics, and the normal map as an EXR beside it;
- an upscaled image is written like its source (alpha kept where the format has it).

Output type, when the user named no file format (:func:`default_suffix`): it follows the input. A
float input (EXR, HDR, float TIFF) gives a float EXR (with alpha for a cut-out; the TIFF writers
here and in Blender keep float in one grey channel only, so EXR is the float file that holds
colour and alpha everywhere); an 8- or 16-bit input gives PNG. Bits follow the input frame by
frame (:func:`output_bits`): 16-bit and float sources give 16-bit PNG/TIFF where the writer can,
and a note says where bits were dropped.

Where results go when no OUTPUT is given: one image gives ``<stem>_<kind>.<ext>`` beside it; a
folder or a pattern gives the folder ``<input folder>_<kind>`` beside the input folder
(:func:`default_folder`), each frame named ``<name>_<kind>_<number>.<ext>`` with its own number, so
results never land among the inputs and a re-run finds them where it left them. Listing the
inputs leaves out any file this command would write (:func:`written_by`), so an OUTPUT that is the
input folder still never feeds earlier results back in as frames.

The front-end encodes the images (Blender with its own writers, the command line with Pillow and
OpenEXR); this module decides what is written and writes the non-image files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.errors import LeanImageError
from . import files, frame_lists
from .frame_lists import output_paths, shard_slice
from .moge2_mesh import mesh_arrays, normal_map

FLOAT_SUFFIXES = frozenset({".exr", ".tif", ".tiff", ".hdr"})  # Pillow/OpenEXR keep floats in these
BLENDER_FLOAT_SUFFIXES = frozenset({".exr", ".hdr"})  # Blender's TIFF writer is 8/16-bit
NO_ALPHA_SUFFIXES = frozenset({".jpg", ".jpeg", ".bmp", ".hdr"})
MESH_SUFFIXES = frozenset({".ply"})

DEFAULT_SUFFIX = {"ben2": ".png", "da3": ".exr", "moge2": ".ply", "upscale": ".png"}
NAME_TAG = {"ben2": "cutout", "da3": "depth", "moge2": "geometry", "upscale": "upscaled"}


@dataclass
class ImageProduct:
    pixels: np.ndarray  # HxW (one channel) or HxWxC float32
    is_data: bool  # values, not colour: no colour transform, linear
    value_range: tuple[float, float] | None = None  # what 0..1 stands for when normalised
    bits: str = "8-bit"  # what the file keeps: "8-bit", "16-bit" or "float" (output_bits)
    input_kind: str = "8-bit"  # what the source's samples were


INPUT_KINDS = ("8-bit", "16-bit", "float")  # what an input image's samples are


def default_suffix(family_id: str, input_kind: str = "8-bit") -> str:
    """The output format when the user named none: it follows the input (module doc)."""
    if family_id in ("ben2", "upscale") and input_kind == "float":
        return ".exr"
    return DEFAULT_SUFFIX[family_id]


def output_bits(suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
    """What a file of ``suffix`` keeps of an ``input_kind`` source: "float", "16-bit" or "8-bit"."""
    suffix = suffix.lower()
    if suffix in float_suffixes and suffix not in (".tif", ".tiff"):
        return "float"
    if input_kind != "8-bit" and suffix in SIXTEEN_BIT_SUFFIXES:
        return "16-bit"
    return "8-bit"


SIXTEEN_BIT_SUFFIXES = frozenset({".png", ".tif", ".tiff"})


def describe_output(family_id: str, suffix: str, input_kind: str, float_suffixes=FLOAT_SUFFIXES) -> str:
    """How the report names what is written, e.g. "float EXR (follows the float input)"."""
    if family_id == "moge2":
        return "PLY mesh, JSON camera, float EXR normals"
    bits = "float" if family_id == "da3" and suffix.lower() in float_suffixes else output_bits(
        suffix, input_kind, float_suffixes
    )
    if family_id == "da3" and bits != "float":
        bits = "16-bit normalised" if suffix.lower() in SIXTEEN_BIT_SUFFIXES else "8-bit normalised"
    text = f"{bits} {suffix.lstrip('.').upper()}"
    if family_id != "da3" and bits != "8-bit" and input_kind != "8-bit":
        text += f" (follows the {input_kind} input)"
    return text


def default_name(family_id: str, stem: str, number: int | None = None, suffix: str | None = None) -> str:
    tag, suffix = NAME_TAG[family_id], suffix or DEFAULT_SUFFIX[family_id]
    return f"{stem}_{tag}{suffix}" if number is None else f"{stem}_{tag}_{number:04d}{suffix}"


def default_name_for(
    family_id: str, path: Path, number: int, *, in_sequence: bool, suffix: str | None = None
) -> str:
    """The default output name for one input file: ``<stem>_<kind>.<ext>``, or for a frame of a
    sequence ``<name>_<kind>_####.<ext>`` with the frame digits moved to the end."""
    if not in_sequence:
        return default_name(family_id, path.stem, suffix=suffix)
    match = re.match(r"^(.*?)\d+$", path.stem)
    stem = match.group(1).rstrip("_.-") if match else path.stem
    return default_name(family_id, stem or "frame", number, suffix)


def default_folder(family_id: str, input_folder: Path) -> Path:
    """Where a folder's or a pattern's results go when no OUTPUT is given: ``<folder>_<kind>``
    beside the input folder (``plates/`` -> ``plates_depth/``)."""
    return input_folder.parent / f"{input_folder.name or 'frames'}_{NAME_TAG[family_id]}"


def written_by(family_id: str, output: str | os.PathLike | None) -> Callable[[Path], bool]:
    """Whether a file met while listing the inputs is one this command writes for ``output``
    (a pattern's frames, a folder's default names and their companions, or the one file named):
    such files are left out of the listing, so earlier results are never taken for frames."""
    if output is None:  # the default folder is beside the inputs, never among them
        return lambda path: False
    text = str(output)
    target = Path(text).expanduser().resolve()
    if frame_lists.is_pattern(text):
        companion = "_normal.exr" if family_id == "moge2" else None

        def in_pattern(path: Path) -> bool:
            name = path.name
            if companion and name.endswith(companion):
                name = name[: -len(companion)] + target.suffix
            return path.resolve().parent == target.parent and frame_lists.frame_number(target, name) is not None

        return in_pattern
    names = re.compile(rf"^.+_{NAME_TAG[family_id]}_\d+(_normal)?\.[^.]+$")
    folder_given = target.is_dir() or text.endswith(("/", "\\")) or not target.suffix

    def written(path: Path) -> bool:
        path = path.resolve()
        if folder_given:
            return path.parent == target and names.match(path.name) is not None
        return path == target

    return written


def check_output(family_id: str, path: Path) -> None:
    """Refuse, before any model runs, a file that could not hold the family's result."""
    suffix = path.suffix.lower()
    if family_id == "moge2":
        if suffix not in MESH_SUFFIXES:
            raise LeanImageError(
                f"Cannot write geometry to '{path.name}': give a .ply mesh file (the camera goes to "
                "a .json file and the normal map to an .exr file beside it)."
            )
    elif family_id == "ben2" and suffix in NO_ALPHA_SUFFIXES:
        raise LeanImageError(
            f"Cannot write a cut-out to '{path.name}': {suffix} has no alpha channel, and the cut-out "
            "is the alpha. Use .png, .tif, .webp or .exr."
        )


def companion_paths(family_id: str, path: Path) -> list[Path]:
    """Every file one result writes (checked up front like the main one)."""
    if family_id == "moge2":
        return [path, path.with_suffix(".json"), path.with_name(f"{path.stem}_normal.exr")]
    return [path]


def plan_outputs(
    family_id: str,
    inputs: list[Path],
    outputs: list[Path],
    *,
    overwrite: bool,
    skip_existing: bool,
    check_format: Callable[[Path], None],
) -> set[int]:
    """Check every output before any model runs, then make the output folders not there yet;
    returns the indices to skip (existing outputs
    kept with ``skip_existing``). LeanImageError saying what is wrong and what to do."""
    skip = set()
    to_make: set[Path] = set()
    sources = {os.path.normcase(str(p.resolve())) for p in inputs}
    for index, out in enumerate(outputs):
        check_output(family_id, out)
        for path in companion_paths(family_id, out):
            check_format(path)
            if os.path.normcase(str(path)) in sources:
                raise LeanImageError(f"Output {path} is an input image; choose another name or folder.")
            if path.is_dir():
                raise LeanImageError(f"Output path {path} is a folder; give a file name such as result.png.")
            folder = path.parent
            if not folder.is_dir():
                to_make.add(folder)
                while not folder.is_dir() and folder.parent != folder:  # where it would be made
                    folder = folder.parent
            if not os.access(folder, os.W_OK):
                raise LeanImageError(f"Output folder {folder} is not writable.")
        if out.exists() and not overwrite:
            if not skip_existing:
                raise LeanImageError(
                    f"{out} exists. Ask to overwrite it (--overwrite, overwrite=True), or to skip existing "
                    "outputs and do the rest (--skip-existing, skip_existing=True)."
                )
            skip.add(index)
    # as Blender does for render output, once every check has passed: farm tasks and scripts name
    # folders still to be made (exist_ok: a sibling task may make the same one at the same moment)
    for folder in sorted(to_make):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LeanImageError(f"Output folder {folder} cannot be made ({exc.strerror}); choose another.") from exc
    return skip


def plan_batch(
    family_id: str,
    refs: list,
    output: str | os.PathLike | None,
    *,
    in_sequence: bool,
    shard: tuple[int, int] | None,
    overwrite: bool,
    skip_existing: bool,
    check_format: Callable[[Path], None],
    inputs_are_files: bool = True,
    suffix: str | None = None,
) -> tuple[list, list[Path], set]:
    """(this task's frames, their output files, the frames to skip): output names from the whole
    frame list (so N shards write what one run would), then this shard's part, then every check
    of :func:`plan_outputs`, all before any model runs. ``suffix``: the default names' format
    (:func:`default_suffix`); no ``output`` for a sequence: :func:`default_folder`."""
    def default(ref):
        return default_name_for(family_id, ref.path, ref.number, in_sequence=in_sequence, suffix=suffix)

    if output is None and in_sequence and refs and inputs_are_files:
        output = f"{default_folder(family_id, refs[0].path.parent)}{os.sep}"
    outputs = [p.resolve() for p in output_paths(refs, output, default)]
    claimed: dict[str, object] = {}
    for ref, out in zip(refs, outputs, strict=True):
        earlier = claimed.setdefault(os.path.normcase(str(out)), ref)
        if earlier is not ref:
            raise LeanImageError(
                f"Frames {earlier.number} ({earlier.path.name}) and {ref.number} ({ref.path.name}) would both "
                f"be written to {out}; give a pattern with the frame number (out_####.png) or rename one input."
            )
    inputs = [r.path for r in refs] if inputs_are_files else []
    part = shard_slice(len(refs), shard)
    refs, outputs = refs[part], outputs[part]
    skipped = plan_outputs(
        family_id, inputs, outputs, overwrite=overwrite, skip_existing=skip_existing, check_format=check_format
    )
    return refs, outputs, {refs[i] for i in skipped}


def image_product(family_id: str, result, suffix: str, float_suffixes=FLOAT_SUFFIXES) -> ImageProduct:
    """The image a family's result is written as, for a file with ``suffix`` (the writer keeps
    floats in ``float_suffixes``)."""
    if family_id in ("ben2", "upscale"):
        pixels = result.rgba if family_id == "ben2" else result.image
        kind = getattr(result, "input_kind", "8-bit")
        return ImageProduct(pixels, is_data=False, bits=output_bits(suffix, kind, float_suffixes), input_kind=kind)
    if family_id == "da3":
        depth = np.asarray(result.depth, np.float32)
        if suffix.lower() in float_suffixes:
            return ImageProduct(depth, is_data=True, bits="float")
        low, high = float(depth.min()), float(depth.max())
        span = high - low
        normalised = (depth - low) / span if span > 0 else np.zeros_like(depth)
        bits = output_bits(suffix, "float", float_suffixes)  # normalised depth: as many bits as the file holds
        return ImageProduct(normalised.astype(np.float32), is_data=True, value_range=(low, high), bits=bits)
    raise ValueError(f"{family_id} results are not one image")


def range_notes(path: Path, product: ImageProduct) -> list[str]:
    """What the file does not keep of the result, for the report."""
    if product.input_kind != "8-bit" and product.bits == "8-bit":
        return [
            f"{path.name}: the input has {product.input_kind} samples but {path.suffix.lstrip('.').upper()} "
            "holds 8 bits; write .png (16-bit) or .exr (float) to keep them."
        ]
    if product.value_range is None:
        return []
    low, high = product.value_range
    return [f"{path.name}: values {low:.6g}..{high:.6g} were mapped to 0..1 (write .exr to keep them)."]


def write_geometry(
    path: Path, result, *, discontinuity: float, write_normals: Callable[[Path, ImageProduct], None] | None = None
) -> tuple[list[Path], ImageProduct | None]:
    """The mesh (PLY) and camera (JSON) of a MoGe-2 result; returns the files written and the
    normal map still to be written by the front-end (None when the model gives no normals, or when
    ``write_normals(path, product)`` wrote it here). The mesh is written last: skip-existing looks at
    it, so a run killed half-way through a frame never leaves a mesh whose companions are missing."""
    arrays = mesh_arrays(result.points, result.mask, discontinuity=discontinuity)
    if len(arrays.vertices) == 0:
        raise LeanImageError(f"MoGe-2 found no geometry for '{path.name}'; nothing was written.")
    height, width = result.mask.shape
    camera = {
        "image_size": [int(width), int(height)],
        "intrinsics_px": np.asarray(result.intrinsics, float).round(6).tolist(),
        "fov_x_deg": round(float(np.degrees(result.fov_x)), 6),
        "fov_y_deg": round(float(np.degrees(result.fov_y)), 6),
        "metric_scale": float(result.metric_scale),
        "axes": "x right, y up, camera looking down -z (Blender/OpenGL camera)",
        "mesh_stride_px": int(arrays.stride),
    }
    camera_path = path.with_suffix(".json")
    files.write_text(camera_path, json.dumps(camera, indent=2))
    normals = None
    if result.normal is not None:
        normals = ImageProduct(normal_map(result.normal, result.mask)[..., :3], is_data=True)
        if write_normals is not None:
            write_normals(path.with_name(f"{path.stem}_normal.exr"), normals)
            normals = None
    _write_ply(path, arrays.vertices, arrays.quads, arrays.uv)
    return [path, camera_path], normals


def _write_ply(path: Path, vertices: np.ndarray, quads: np.ndarray, uv: np.ndarray) -> None:
    """Binary little-endian PLY: float xyz + uv per vertex, quads as 4-index faces."""
    header = (
        "ply\nformat binary_little_endian 1.0\ncomment made by Lean Image AI (MoGe-2)\n"
        f"element vertex {len(vertices)}\nproperty float x\nproperty float y\nproperty float z\n"
        "property float s\nproperty float t\n"
        f"element face {len(quads)}\nproperty list uchar int vertex_indices\nend_header\n"
    ).encode("ascii")
    vertex = np.empty(len(vertices), [("xyz", "<f4", 3), ("uv", "<f4", 2)])
    vertex["xyz"], vertex["uv"] = vertices, uv
    face = np.empty(len(quads), [("n", "u1"), ("v", "<i4", 4)])
    face["n"], face["v"] = 4, quads
    with files.atomic_path(path) as temp:
        with open(temp, "wb") as stream:
            stream.write(header)
            stream.write(vertex.tobytes())
            stream.write(face.tobytes())
