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

A frame's files (PLY mesh, JSON camera, float EXR normal map) are written in one call
(:func:`write_geometry`: the command line, the farm) or made a band per call of Blender's main thread
and written together in the last (:class:`GeometryFiles`: Process Sequence), the same bytes either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime.errors import LeanImageError
from .. import file_formats, files
from ..file_bytes import BandedSteps, ExrFile
from ..result_images import ImageProduct

MAX_GRID_SIDE = 512
PLY_COMMENT = "made by Lean Image AI (MoGe-2)"


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
    grid = MeshGrid(points, mask, discontinuity=discontinuity, max_side=max_side)
    vertices, uv, quads = grid.add_rows(0, len(grid.rows))
    return MeshArrays(vertices, quads, uv, grid.stride)


class MeshGrid:
    """The mesh of a point map made a band of grid rows at a time (:meth:`add_rows`, the bands in
    order): the vertices, UVs and quads one pass over the whole grid gives, in its order, each band
    the part of them it adds (Process Sequence makes a frame's mesh over several timer calls)."""

    def __init__(self, points, mask, *, discontinuity: float, max_side: int = MAX_GRID_SIDE):
        self.height, self.width = mask.shape
        self.stride = max(1, math.ceil(max(self.height, self.width) / max_side))
        self.rows = np.arange(0, self.height, self.stride)
        self.cols = np.arange(0, self.width, self.stride)
        self._points, self._mask, self._discontinuity = points, mask, float(discontinuity)
        self.count = 0  # vertices so far
        self._seam = None  # (index, depth) of the grid row before the next band: its cells span both

    def add_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Grid rows ``start`` to ``stop``: their vertices, UVs and the quads that end on them."""
        picked = slice(start * self.stride, (stop - 1) * self.stride + 1, self.stride)
        grid_points = self._points[picked, :: self.stride]
        depth = grid_points[..., 2]
        valid = self._mask[picked, :: self.stride] & np.isfinite(depth) & (depth > 0)
        index = np.full(valid.shape, -1, np.int64)
        count = int(valid.sum())
        index[valid] = np.arange(self.count, self.count + count)
        self.count += count

        vertices = opencv_to_blender(grid_points[valid]).astype(np.float32)
        vv, uu = np.meshgrid((self.rows[start:stop] + 0.5) / self.height, (self.cols + 0.5) / self.width, indexing="ij")
        uv = np.stack([uu[valid], 1.0 - vv[valid]], axis=1).astype(np.float32)
        if self._seam is not None:
            index, depth = np.concatenate([self._seam[0], index]), np.concatenate([self._seam[1], depth])
        self._seam = (index[-1:].copy(), depth[-1:].copy())
        return vertices, uv, _quads(index, depth, self._discontinuity)


def _quads(index: np.ndarray, depth: np.ndarray, discontinuity: float) -> np.ndarray:
    """The quads of the cells between the rows of ``index``, row by row."""
    # corners of each cell: top-left, bottom-left, bottom-right, top-right (image rows go down),
    # which is counter-clockwise seen from the camera once y points up: faces face the camera
    corners = [(slice(None, -1), slice(None, -1)), (slice(1, None), slice(None, -1))]
    corners += [(slice(1, None), slice(1, None)), (slice(None, -1), slice(1, None))]
    corner_index = np.stack([index[r, c] for r, c in corners], axis=-1)
    corner_depth = np.stack([depth[r, c] for r, c in corners], axis=-1)
    ok = (corner_index >= 0).all(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        jump = corner_depth.max(axis=-1) / corner_depth.min(axis=-1) - 1.0
    ok &= jump < discontinuity
    return corner_index[ok].astype(np.int32)


def normal_map(normal, mask) -> np.ndarray:
    """Normals (OpenCV axes) as an RGBA normal map in Blender camera space, 0..1 (alpha 1).
    Pixels without geometry get the flat, camera-facing normal."""
    n = opencv_to_blender(normal)
    n[~mask] = (0.0, 0.0, 1.0)
    rgba = np.empty((*mask.shape, 4), np.float32)
    rgba[..., :3] = np.clip(n * 0.5 + 0.5, 0.0, 1.0)
    rgba[..., 3] = 1.0
    return rgba


def camera_of(result, stride: int) -> dict:
    """The camera file's contents (JSON) of a result whose mesh samples every ``stride``-th pixel."""
    height, width = result.mask.shape
    return {
        "image_size": [int(width), int(height)],
        "intrinsics_px": np.asarray(result.intrinsics, float).round(6).tolist(),
        "fov_x_deg": round(float(np.degrees(result.fov_x)), 6),
        "fov_y_deg": round(float(np.degrees(result.fov_y)), 6),
        "metric_scale": float(result.metric_scale),
        "axes": "x right, y up, camera looking down -z (Blender/OpenGL camera)",
        "mesh_stride_px": int(stride),
    }


def no_geometry(path: Path) -> LeanImageError:
    return LeanImageError(f"MoGe-2 found no geometry for '{path.name}'; nothing was written.")


def write_geometry(
    path: Path, result, *, discontinuity: float, write_normals: Callable[[Path, ImageProduct], None] | None = None
) -> tuple[list[Path], ImageProduct | None]:
    """The mesh (PLY) and camera (JSON) of a MoGe-2 result; returns the files written and the
    normal map still to be written by the front-end (None when the model gives no normals, or when
    ``write_normals(path, product)`` wrote it here). The mesh is written last: skip-existing looks at
    it, so a run killed half-way through a frame never leaves a mesh whose companions are missing."""
    arrays = mesh_arrays(result.points, result.mask, discontinuity=discontinuity)
    if len(arrays.vertices) == 0:
        raise no_geometry(path)
    camera_path = path.with_suffix(".json")
    file_formats.find(".json").write(camera_path, camera_of(result, arrays.stride))
    normals = None
    if result.normal is not None:
        normals = ImageProduct(normal_map(result.normal, result.mask)[..., :3], is_data=True)
        if write_normals is not None:
            write_normals(normals_path(path), normals)
            normals = None
    file_formats.find(".ply").write(path, arrays.vertices, arrays.quads, arrays.uv, comment=PLY_COMMENT)
    return [path, camera_path], normals


def normals_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}_normal.exr")


class _PlySteps(BandedSteps):
    """The PLY file of a :class:`MeshGrid`, a band of grid rows per call (its bytes put together in
    a call of their own): the bytes :func:`write_geometry` writes of the same result."""

    def __init__(self, grid: MeshGrid, path: Path):
        super().__init__(len(grid.rows), len(grid.cols), lambda start, stop: (start, stop))
        self.grid, self.path = grid, path
        self._vertices: list[bytes] = []
        self._faces: list[bytes] = []
        self._face_count = 0
        self.data: bytes | None = None

    def _write(self, band, start: int) -> None:
        vertices, uv, quads = self.grid.add_rows(*band)
        self._vertices.append(file_formats.ply_vertex_bytes(vertices, uv))
        self._faces.append(file_formats.ply_face_bytes(quads))
        self._face_count += len(quads)

    def _close(self) -> None:
        if self.grid.count == 0:
            raise no_geometry(self.path)
        header = file_formats.ply_header(self.grid.count, self._face_count, comment=PLY_COMMENT)
        self.data = b"".join((header, *self._vertices, *self._faces))
        self._vertices, self._faces = [], []


class GeometryFiles:
    """A result's mesh, camera and normal map (the files of :func:`write_geometry`, the normal map
    as a float EXR: what Blender's writer saves of it) made a band per :meth:`pump` call, then
    written together in the last call by the atomic writer, the mesh last (Skip Existing looks at
    it): a frame stopped before that call leaves none of its files, one that fails there none
    written in it. Process Sequence in Blender (issue #37 item 3): its main thread spent 0.15 s
    of CPU and more in one call on a 1920x1080 frame's files."""

    def __init__(self, path: Path, result, *, discontinuity: float):
        grid = MeshGrid(result.points, result.mask, discontinuity=discontinuity)
        self.mesh = _PlySteps(grid, path)
        self.camera = camera_of(result, grid.stride)
        self.normals = None
        if result.normal is not None:
            normal, mask = result.normal, result.mask
            height, width = mask.shape
            self.normals = ExrFile(height, width, lambda start, stop: normal_map(normal[start:stop], mask[start:stop]))
        self.path = path
        self.paths = [path, path.with_suffix(".json")] + ([normals_path(path)] if self.normals is not None else [])
        self._steps: list[BandedSteps] = [step for step in (self.mesh, self.normals) if step is not None]

    def pump(self, budget: float) -> bool:
        """One step (a band, or a file's bytes put together) per call; True once the files are written."""
        if self._steps:
            if self._steps[0].pump(budget):
                self._steps.pop(0)
            return False
        self._write_all()
        return True

    def _write_all(self) -> None:
        written: list[Path] = []
        try:
            written.append(file_formats.write_json(self.path.with_suffix(".json"), self.camera))
            if self.normals is not None:
                written.append(files.write_bytes(normals_path(self.path), self.normals.data))
            files.write_bytes(self.path, self.mesh.data)
        except OSError as exc:
            for path in written:  # the frame's files are there together or not at all
                files.remove_if_present(path)
            raise LeanImageError(f"Could not save '{self.path}' and its camera and normal map: {exc}") from exc
