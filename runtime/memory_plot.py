"""A picture of memory during one job, drawn with numpy (no plotting library: Blender has none,
and Pillow is not in Blender either), written as PNG with zlib + struct.

The picture: time left to right over the job; process RAM (RSS) in blue and, on a GPU, this
process's VRAM (NVML) in green, each scaled between its own lowest and highest value (the panel
and the command line print those figures); a vertical line for each mark: grey for before and
after, orange for each model run, red for the release. Marks closer than ``MARK_GAP`` pixels are
nudged apart (keeping their order), so every run stays visible and countable.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .memory_report import LABELS, mb

WIDTH, HEIGHT = 480, 200
PAD = 8  # pixels around the plot area
MARK_GAP = 3  # at least this many columns between two marks

COLOURS = {
    "background": (255, 255, 255),
    "frame": (120, 120, 120),
    "edge": (150, 150, 150),  # before / after
    "run": (245, 140, 0),
    "release": (220, 30, 30),
    "ram": (40, 100, 220),
    "vram": (30, 160, 60),
}
COLOUR_NAMES = {"ram": "blue", "vram": "green"}


def _series(timeline: dict, key: str) -> list[tuple[float, int]]:
    points = [(t, v[key]) for t, v in timeline.get("samples", ()) if v.get(key) is not None]
    points += [(t, v[key]) for t, _, v in timeline.get("marks", ()) if v.get(key) is not None]
    return sorted(points)


def figures_in(timeline: dict) -> list[str]:
    """The figures the timeline has values for, RAM first."""
    return [key for key in ("ram", "vram") if _series(timeline, key)]


def mark_kind(label: str) -> str:
    return "run" if label.startswith("run ") else "release" if label == "release" else "edge"


def render(timeline: dict, width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """The picture as an RGBA uint8 array (height x width x 4), first row at the top."""
    image = np.empty((height, width, 4), np.uint8)
    image[:, :, :3] = COLOURS["background"]
    image[:, :, 3] = 255
    left, top, right, bottom = PAD, PAD, width - 1 - PAD, height - 1 - PAD
    image[top : bottom + 1, [left, right], :3] = COLOURS["frame"]
    image[[top, bottom], left : right + 1, :3] = COLOURS["frame"]
    marks = timeline.get("marks", ())
    times = [t for t, _ in timeline.get("samples", ())] + [t for t, _, _ in marks]
    span = max(times, default=0.0) or 1.0

    def column(t: float) -> int:
        return left + 1 + int(round(t / span * (right - left - 2)))

    ordered = sorted(marks, key=lambda m: m[0])
    xs = [column(t) for t, _, _ in ordered]
    for i in range(1, len(xs)):  # nudged right to keep them apart, then back from the right edge
        xs[i] = max(xs[i], xs[i - 1] + MARK_GAP)
    for i in range(len(xs) - 1, -1, -1):
        xs[i] = min(xs[i], (right - 1) if i == len(xs) - 1 else xs[i + 1] - MARK_GAP)
    for x, (_, label, _) in zip(xs, ordered, strict=True):
        image[top + 1 : bottom, max(left + 1, x), :3] = COLOURS[mark_kind(label)]
    for key in figures_in(timeline):
        points = _series(timeline, key)
        values = np.array([v for _, v in points], np.float64)
        low, high = values.min(), values.max()
        scale = (high - low) or 1.0
        xs = np.array([column(t) for t, _ in points], np.float64)
        ys = bottom - 2 - (values - low) / scale * (bottom - top - 4)
        _polyline(image, xs, ys, COLOURS[key])
    return image


def _polyline(image: np.ndarray, xs: np.ndarray, ys: np.ndarray, colour) -> None:
    """Segments between consecutive points, two pixels thick (each segment sampled per pixel)."""
    if len(xs) == 1:
        xs, ys = np.repeat(xs, 2), np.repeat(ys, 2)
    for x0, y0, x1, y1 in zip(xs[:-1], ys[:-1], xs[1:], ys[1:], strict=True):
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        px = np.rint(np.linspace(x0, x1, steps)).astype(int)
        py = np.rint(np.linspace(y0, y1, steps)).astype(int)
        for dy in (0, 1):
            rows = np.clip(py + dy, 0, image.shape[0] - 1)
            image[rows, np.clip(px, 0, image.shape[1] - 1), :3] = colour


def png_bytes(rgba: np.ndarray) -> bytes:
    """An 8-bit RGBA PNG of ``rgba`` (height x width x 4 uint8, first row at the top)."""
    height, width = rgba.shape[:2]
    raw = np.zeros((height, 1 + width * 4), np.uint8)  # filter byte 0 (none) before each row
    raw[:, 1:] = np.ascontiguousarray(rgba, np.uint8).reshape(height, width * 4)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit, colour type 6: RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b"")


def legend(timeline: dict) -> list[str]:
    """What the picture shows, in words (the panel's and the command line's caption)."""
    lines = []
    for key in figures_in(timeline):
        values = [v for _, v in _series(timeline, key)]
        name = LABELS[key].split(" (")[0]
        lines.append(f"{name} ({COLOUR_NAMES[key]}): {mb(min(values))} to {mb(max(values))}")
    runs = sum(mark_kind(label) == "run" for _, label, _ in timeline.get("marks", ()))
    lines.append(f"marks: {runs} run(s) orange, release red, before/after grey")
    return lines
