"""MoGe-2's point map as a mesh (numpy only): the vertices, quads and UVs Blender builds its mesh
from, and the command line writes as PLY.

- one vertex per valid pixel. Images larger than ``MAX_GRID_SIDE`` pixels on their long side
  are sampled every n-th pixel (n = ceil(long side / MAX_GRID_SIDE)), which keeps a 4K photo
  near 512 x 288 = 147k vertices instead of 8.8M; the UVs still address the full image;
- a quad wherever all four corners are valid and the depth jump is small:
  ``max(depth) / min(depth) - 1 < discontinuity`` over the four corners (no sheets stretched
  between a foreground edge and the background behind it);
- MoGe-2's camera axes (OpenCV: x right, y down, z forward) become Blender's camera axes
  (x right, y up, looking down -z): (x, y, z) -> (x, -y, -z). With the camera at the origin and
  unrotated, the mesh sits in front of it exactly as in the photo.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime.errors import LeanImageError
from .. import file_formats
from ..result_images import ImageProduct

MAX_GRID_SIDE = 512


@dataclass
class MeshArrays:
    vertices: np.ndarray  # N x 3 float32, Blender camera space
    quads: np.ndarray  # M x 4 int32, counter-clockwise seen from the camera
    uv: np.ndarray  # N x 2 float32, source pixel centres (0..1, v up)
    stride: int  # 1: every pixel; n: every n-th pixel in both directions


def opencv_to_blender(xyz: np.ndarray) -> np.ndarray:
    """Camera axes: OpenCV (x right, y down, z forward) -> Blender (x right, y up, -z forward)."""
    out = np.array(xyz, dtype=np.float32, copy=True)
    out[..., 1:] *= -1.0
    return out


def mesh_arrays(points, mask, *, discontinuity: float, max_side: int = MAX_GRID_SIDE) -> MeshArrays:
    """Vertices, quads and UVs from a point map (H x W x 3, OpenCV axes) and its valid mask."""
    height, width = mask.shape
    stride = max(1, math.ceil(max(height, width) / max_side))
    rows = np.arange(0, height, stride)
    cols = np.arange(0, width, stride)
    grid_points = points[rows][:, cols]
    depth = grid_points[..., 2]
    valid = mask[rows][:, cols] & np.isfinite(depth) & (depth > 0)
    index = np.full(valid.shape, -1, np.int64)
    count = int(valid.sum())
    index[valid] = np.arange(count)

    vertices = opencv_to_blender(grid_points[valid])
    vv, uu = np.meshgrid((rows + 0.5) / height, (cols + 0.5) / width, indexing="ij")
    uv = np.stack([uu[valid], 1.0 - vv[valid]], axis=1).astype(np.float32)

    # corners of each cell: top-left, bottom-left, bottom-right, top-right (image rows go down),
    # which is counter-clockwise seen from the camera once y points up: faces face the camera
    corners = [(slice(None, -1), slice(None, -1)), (slice(1, None), slice(None, -1))]
    corners += [(slice(1, None), slice(1, None)), (slice(None, -1), slice(1, None))]
    corner_index = np.stack([index[r, c] for r, c in corners], axis=-1)
    corner_depth = np.stack([depth[r, c] for r, c in corners], axis=-1)
    ok = (corner_index >= 0).all(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        jump = corner_depth.max(axis=-1) / corner_depth.min(axis=-1) - 1.0
    ok &= jump < float(discontinuity)
    quads = corner_index[ok].astype(np.int32)
    return MeshArrays(vertices.astype(np.float32), quads, uv, stride)


def normal_map(normal, mask) -> np.ndarray:
    """Normals (OpenCV axes) as an RGBA normal map in Blender camera space, 0..1 (alpha 1).
    Pixels without geometry get the flat, camera-facing normal."""
    n = opencv_to_blender(normal)
    n[~mask] = (0.0, 0.0, 1.0)
    rgba = np.empty((*mask.shape, 4), np.float32)
    rgba[..., :3] = np.clip(n * 0.5 + 0.5, 0.0, 1.0)
    rgba[..., 3] = 1.0
    return rgba


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
    file_formats.find(".json").write(camera_path, camera)
    normals = None
    if result.normal is not None:
        normals = ImageProduct(normal_map(result.normal, result.mask)[..., :3], is_data=True)
        if write_normals is not None:
            write_normals(path.with_name(f"{path.stem}_normal.exr"), normals)
            normals = None
    file_formats.find(".ply").write(path, arrays.vertices, arrays.quads, arrays.uv, comment="made by Lean Image AI (MoGe-2)")
    return [path, camera_path], normals
