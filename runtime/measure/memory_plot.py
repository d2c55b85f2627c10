"""A picture of memory during one job that explains itself, drawn with numpy (no plotting library:
Blender has none, and Pillow is not in Blender either; text from runtime/measure/bitmap_font.py), written as
PNG with zlib + struct. The same image is the panel's "Lean Image AI Memory" and `--memory-plot`.

What it shows: a title with the job, its device and how long it took; process RAM (RSS) in blue
against the left axis in MiB and, on a GPU, this process's VRAM (NVML) in green against the right
axis; time in seconds along the bottom; a vertical line per mark: orange for each model run, red
for the release, dashed grey for before and after; dashed level lines with the RSS before and after
the job; a legend along the bottom. Marks closer than ``MARK_GAP`` pixels are nudged apart
(keeping their order), so every run stays visible and countable; more runs than fit that way are
short ticks along the bottom at their own times (the legend counts them).
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

from .bitmap_font import draw_text, text_height, text_width
from .memory_report import LABELS, mb

WIDTH, HEIGHT = 800, 420
SCALE = 2  # text size: 10x14 pixel glyphs
MARK_GAP = 3  # at least this many columns between two marks
RUG = 12  # rows of a run's tick when there are too many runs to draw apart
MIB = 2**20

COLOURS = {
    "background": (255, 255, 255),
    "frame": (90, 90, 90),
    "grid": (232, 232, 232),
    "text": (30, 30, 30),
    "edge": (110, 110, 110),  # before / after (dashed)
    "run": (245, 140, 0),
    "release": (220, 30, 30),
    "ram": (40, 100, 220),
    "vram": (30, 160, 60),
    "ram_level": (140, 170, 235),  # each figure before / after the job (dashed, across the plot)
    "vram_level": (130, 205, 145),
}
COLOUR_NAMES = {"ram": "blue", "vram": "green"}
SHORT = {"ram": "RSS", "vram": "VRAM"}


def _series(timeline: dict, key: str) -> list[tuple[float, int]]:
    points = [(t, v[key]) for t, v in timeline.get("samples", ()) if v.get(key) is not None]
    points += [(t, v[key]) for t, _, v in timeline.get("marks", ()) if v.get(key) is not None]
    return sorted(points)


def figures_in(timeline: dict) -> list[str]:
    """The figures the timeline has values for, RAM first."""
    return [key for key in ("ram", "vram") if _series(timeline, key)]


def mark_kind(label: str) -> str:
    return "run" if label.startswith("run ") else "release" if label == "release" else "edge"


def run_count(timeline: dict) -> int:
    """The job's model runs: counted by the worker where it thinned a long sequence's run marks."""
    return timeline.get("run_count") or sum(mark_kind(label) == "run" for _, label, _ in timeline.get("marks", ()))


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not high > low:
        low, high = low - 1.0, high + 1.0
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step) * step, math.ceil(high / step) * step
    return [first + i * step for i in range(int(round((last - first) / step)) + 1)]


def _tick_text(value: float, step: float) -> str:
    return f"{value:.0f}" if step >= 1 else f"{value:.{max(1, -math.floor(math.log10(step)))}f}"


def plot_box(timeline: dict, width: int = WIDTH, height: int = HEIGHT) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the plot area inside the picture: marks are drawn only there."""
    glyph = text_height(SCALE)
    left = 14 + text_width("00000", SCALE)
    right = width - 1 - (14 + text_width("00000", SCALE) if "vram" in figures_in(timeline) else 20)
    top = 12 + glyph + 14 + glyph  # the title, then the axes' unit labels
    bottom = height - 1 - (8 + glyph + 14 + glyph + 14)  # x tick labels, then the legend
    return left, top, right, bottom


def job_peak(timeline: dict, key: str) -> int | None:
    """The job's peak as its text report says it (operation.py hands it over: it includes the
    kernel's high-water mark between two samples); the highest sample for a timeline without it."""
    peak = (timeline.get("peaks") or {}).get(key)
    values = [v for _, v in _series(timeline, key)]
    return peak if peak is not None else max(values, default=None)


def title(timeline: dict) -> str:
    job = timeline.get("operation") or "job"
    devices = ", ".join(timeline.get("devices") or ()) or "no model run"
    times = [t for t, _ in timeline.get("samples", ())] + [t for t, _, _ in timeline.get("marks", ())]
    outcome = timeline.get("outcome")
    tail = f" ({outcome})" if outcome and outcome != "success" else ""
    peaks = [f"{SHORT[key]} {mb(job_peak(timeline, key))}" for key in figures_in(timeline)]
    figures = f" - job peak {', '.join(peaks)}" if peaks else ""
    return f"memory of {job} on {devices} for {max(times, default=0.0):.1f} s{tail}{figures}"


def render(timeline: dict, width: int = WIDTH, height: int = HEIGHT, *, layout: dict | None = None) -> np.ndarray:
    """The picture as an RGBA uint8 array (height x width x 4), first row at the top; ``layout``,
    when given, gets what :func:`label_layout` returns."""
    image = np.empty((height, width, 4), np.uint8)
    image[:, :, :3] = COLOURS["background"]
    image[:, :, 3] = 255
    marks = sorted(timeline.get("marks", ()), key=lambda m: m[0])
    times = [t for t, _ in timeline.get("samples", ())] + [t for t, _, _ in marks]
    end = max(times, default=0.0) or 1.0
    plot = _Plot(image, plot_box(timeline, width, height), end * 1.03)  # a margin: the last marks off the frame
    heading = title(timeline)
    size = SCALE if text_width(heading, SCALE) <= width - 16 else 1  # a long one in small type
    draw_text(image, max(8, (width - text_width(heading, size)) // 2), 10, heading, COLOURS["text"], size)
    _time_axis(plot, [t for t in nice_ticks(0.0, end, 6) if t <= plot.span])
    scales = _figure_axes(plot, timeline)
    levels = _levels(plot, marks, scales)
    _marks(plot, marks)
    curves = {key: _curve(plot, _series(timeline, key), *scales[key], COLOURS[key]) for key in scales}
    labels = place_labels(levels, curves, plot.box)
    if layout is not None:
        layout.update(title=heading, labels=labels, curves=curves, plot=plot.box)
    glyph = text_height(SCALE)
    for text, (x, y_text, _, _), key in labels:
        w = text_width(text, SCALE)
        image[y_text - 2 : y_text + glyph + 2, x - 3 : x + w + 3, :3] = COLOURS["background"]
        draw_text(image, x, y_text, text, COLOURS[key], SCALE)
    left, top, right, bottom = plot.box
    image[top : bottom + 1, [left, right], :3] = COLOURS["frame"]
    image[[top, bottom], left : right + 1, :3] = COLOURS["frame"]
    _legend(image, timeline, height - 8 - glyph, left)
    return image


class _Plot:
    """The picture being drawn, its plot box and the seconds its width spans."""

    def __init__(self, image: np.ndarray, box: tuple[int, int, int, int], span: float):
        self.image, self.box, self.span = image, box, span
        self.width = image.shape[1]

    def column(self, t: float) -> int:
        left, _, right, _ = self.box
        return left + 1 + int(round(t / self.span * (right - left - 2)))


def _time_axis(plot: _Plot, seconds: list[float]) -> None:
    """Grid, ticks and labels in seconds."""
    left, top, _, bottom = plot.box
    for value in seconds:
        x = plot.column(value)
        plot.image[top + 1 : bottom, x, :3] = COLOURS["grid"]
        label = _tick_text(value, seconds[1] - seconds[0]) if len(seconds) > 1 else f"{value:g}"
        if value == seconds[-1]:
            label += " s"
            x -= text_width(" s", SCALE) // 2
        x = min(max(x - text_width(label, SCALE) // 2, left), plot.width - 4 - text_width(label, SCALE))
        draw_text(plot.image, x, bottom + 8, label, COLOURS["text"], SCALE)


def _figure_axes(plot: _Plot, timeline: dict) -> dict:
    """One value axis per figure (left, then right), with its caption; figure -> (low, high) MiB."""
    image, (left, top, right, bottom) = plot.image, plot.box
    glyph = text_height(SCALE)
    scales = {}
    for side, key in zip(("left", "right"), figures_in(timeline), strict=False):
        values = np.array([v for _, v in _series(timeline, key)], np.float64) / MIB
        ticks = nice_ticks(float(values.min()), float(values.max()), 5)
        scales[key] = (ticks[0], ticks[-1])
        for value in ticks:
            y = _row(value, ticks[0], ticks[-1], top, bottom)
            if side == "left":
                image[y, left + 1 : right, :3] = COLOURS["grid"]
            label = _tick_text(value, ticks[1] - ticks[0])
            x = left - 6 - text_width(label, SCALE) if side == "left" else right + 6
            draw_text(image, x, y - glyph // 2, label, COLOURS[key], SCALE)
        caption = f"{SHORT[key]}, MiB"
        x = 6 if side == "left" else plot.width - 6 - text_width(caption, SCALE)
        draw_text(image, x, top - glyph - 8, caption, COLOURS[key], SCALE)
    return scales


def _levels(plot: _Plot, marks: list, scales: dict) -> list[tuple]:
    """Each figure before and after the job as a dashed level; its labels, drawn last (over the
    lines, on a white ground), as (before/after, row, text, figure)."""
    left, top, right, bottom = plot.box
    dashes = [x for x in range(left + 1, right) if (x // 6) % 2 == 0]
    levels = []
    for key in scales:
        for _, label, v in marks:
            if label not in ("before", "after") or v.get(key) is None:
                continue
            y = _row(v[key] / MIB, *scales[key], top, bottom)
            plot.image[y, dashes, :3] = COLOURS[f"{key}_level"]
            levels.append((label, y, f"{SHORT[key]} {label} {mb(v[key])}", key))
    return levels


def _marks(plot: _Plot, marks: list) -> None:
    left, top, right, bottom = plot.box
    xs, apart = _mark_columns([plot.column(t) for t, _, _ in marks], left, right)
    for x, (_, label, _) in zip(xs, marks, strict=True):
        kind = mark_kind(label)
        rows = np.arange(top + 1, bottom) if apart or kind != "run" else np.arange(bottom - RUG, bottom)
        if kind == "edge":
            rows = rows[(rows // 5) % 2 == 0]
        x = max(left + 1, x)
        plot.image[rows, x : x + (2 if kind == "release" else 1), :3] = COLOURS[kind]


def _curve(plot: _Plot, points: list, low: float, high: float, colour) -> tuple[np.ndarray, np.ndarray]:
    """Draw one figure's curve; its pixels (columns, rows)."""
    _, top, _, bottom = plot.box
    height, width = plot.image.shape[:2]
    px = np.array([plot.column(t) for t, _ in points], np.float64)
    py = np.array([_row(v / MIB, low, high, top, bottom) for _, v in points], np.float64)
    cols, rows = _curve_pixels(px, py)
    plot.image[np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1), :3] = colour
    return cols, rows


def _mark_columns(xs: list[int], left: int, right: int) -> tuple[list[int], bool]:
    """Each mark's column, and whether the marks are drawn apart: nudged ``MARK_GAP`` apart (in
    order) while they all fit, so every run stays countable; when they cannot, each stays on its
    own column (marks closer than a pixel merge) and the runs are drawn as short ticks along the
    bottom, so many runs never cover the lines as a solid band."""
    if len(xs) * MARK_GAP > right - left - 2:
        return xs, False
    xs = list(xs)
    for i in range(1, len(xs)):  # nudged right to keep them apart, then back from the right edge
        xs[i] = max(xs[i], xs[i - 1] + MARK_GAP)
    for i in range(len(xs) - 1, -1, -1):
        xs[i] = min(xs[i], (right - 1) if i == len(xs) - 1 else xs[i + 1] - MARK_GAP)
    return xs, True


def _row(value: float, low: float, high: float, top: int, bottom: int) -> int:
    scale = (high - low) or 1.0
    return int(round(bottom - 2 - (value - low) / scale * (bottom - top - 4)))


def _legend(image: np.ndarray, timeline: dict, y: int, x: int) -> None:
    runs = run_count(timeline)
    items = [(key, f"{SHORT[key]}") for key in figures_in(timeline)]
    items += [("run", f"model runs ({runs})"), ("release", "release"), ("edge", "before / after")]
    glyph = text_height(SCALE)
    for kind, text in items:
        if x + 24 + text_width(text, SCALE) > image.shape[1]:
            break  # a picture too narrow for the whole legend keeps what fits
        if kind in ("ram", "vram"):
            image[y + glyph // 2 - 1 : y + glyph // 2 + 1, x : x + 18, :3] = COLOURS[kind]
            x += 24
        else:
            rows = np.arange(y, y + glyph)
            if kind == "edge":
                rows = rows[(rows // 3) % 2 == 0]
            image[rows, x + 1, :3] = COLOURS[kind]
            image[rows, x + 2, :3] = COLOURS[kind]
            x += 10
        x = draw_text(image, x, y, text, COLOURS["text"], SCALE) + 22


def _curve_pixels(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(columns, rows) of the curve through the points, two pixels thick (each segment sampled
    per pixel): what is drawn, and what a label must stay clear of."""
    if len(xs) == 1:
        xs, ys = np.repeat(xs, 2), np.repeat(ys, 2)
    cols, rows = [], []
    for x0, y0, x1, y1 in zip(xs[:-1], ys[:-1], xs[1:], ys[1:], strict=True):
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        px = np.rint(np.linspace(x0, x1, steps)).astype(int)
        py = np.rint(np.linspace(y0, y1, steps)).astype(int)
        for dy in (0, 1):
            cols.append(px)
            rows.append(py + dy)
    if not cols:
        return np.zeros(0, int), np.zeros(0, int)
    return np.concatenate(cols), np.concatenate(rows)


def _hits(box, curves: dict, margin: int = 3) -> bool:
    x0, y0, x1, y1 = box
    for cols, rows in curves.values():
        if np.any((cols >= x0 - margin) & (cols <= x1 + margin) & (rows >= y0 - margin) & (rows <= y1 + margin)):
            return True
    return False


def place_labels(levels, curves: dict, plot: tuple[int, int, int, int]) -> list[tuple[str, tuple, str]]:
    """(text, (x0, y0, x1, y1), figure) of each level's label: next to its line (before: at the
    left, after: at the right), moved along and across the line until it covers neither a curve
    nor a label placed before it; where no place is clear, the first one that misses the labels."""
    glyph = text_height(SCALE)
    placed: list[tuple[str, tuple, str]] = []
    for label, y, text, key in levels:
        w = text_width(text, SCALE)
        rows, columns = _label_spots(label, y, w, plot)
        boxes = [(x, y_text, x + w, y_text + glyph) for y_text in rows for x in columns]
        free = [box for box in boxes if not _overlaps(box, placed)]
        chosen = next((box for box in free if not _hits(box, curves)), None)
        placed.append((text, chosen or (free[0] if free else boxes[0]), key))
    return placed


def _label_spots(label: str, y: int, w: int, plot: tuple[int, int, int, int]) -> tuple[list[int], list[int]]:
    """The rows and columns a level's label may go, best first: beside its line (before: at the
    left, after: at the right), then further along and across."""
    left, top, right, bottom = plot
    glyph = text_height(SCALE)
    rows = [y + 5, y - glyph - 5] if label == "before" else [y - glyph - 5, y + 5]
    rows += [y + 5 + k * (glyph + 6) for k in range(1, 4)] + [y - glyph - 5 - k * (glyph + 6) for k in range(1, 4)]
    rows = [min(max(r, top + 3), bottom - glyph - 3) for r in rows]  # inside the plot
    span = max(1, right - left - 16 - w)
    steps = [i * span // 8 for i in range(9)]
    columns = [left + 8 + d for d in steps] if label == "before" else [right - 8 - w - d for d in steps]
    return rows, columns


def _overlaps(box, placed) -> bool:
    return any(
        b[0] < box[2] + 4 and box[0] < b[2] + 4 and b[1] < box[3] + 4 and box[1] < b[3] + 4 for _, b, _ in placed
    )


def label_layout(timeline: dict, width: int = WIDTH, height: int = HEIGHT) -> dict:
    """The picture's words and where they go, as :func:`render` draws them: its title, each
    level's label with its box, and each curve's pixels (for checks without reading pixels)."""
    found = {}
    render(timeline, width, height, layout=found)
    return found


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
        lines.append(f"{name} ({COLOUR_NAMES[key]}): {mb(min(values))} to a job peak of {mb(job_peak(timeline, key))}")
    runs = run_count(timeline)
    lines.append(f"marks: {runs} run(s) orange, release red, before/after grey")
    return lines
