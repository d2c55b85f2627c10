"""Make docs/upscale-before-after.png: what `python -m lean_image_ai upscale` really gives.

    .venv/bin/python tools/upscale_picture.py [--output docs/upscale-before-after.png]

A small test card is generated (no outside image), upscaled by the real command line with the
embedded bicubic x2 model, and a crop is shown side by side: the input's pixels enlarged 2x by
repeating them (what the input looks like at the output's size) and the model's result. Needs
Pillow (the `cli` extra).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
CROP = (40, 20, 200, 140)  # left, top, right, bottom in input pixels
ZOOM = 2  # how many screen pixels each output pixel gets in the picture
LABEL_HEIGHT = 18


def test_card(width: int = 240, height: int = 160) -> np.ndarray:
    """A deterministic card with the edges where upscalers differ: text-like bars, a ring, a disc, stripes."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / (width - 1), y / (height - 1)
    image = np.stack([0.25 + 0.5 * u, 0.35 + 0.4 * v, 0.8 - 0.4 * u], axis=2)
    image[np.hypot(x - 70, y - 80) < 30] = (0.95, 0.8, 0.15)
    image[np.abs(np.hypot(x - 160, y - 70) - 28) < 2.5] = (0.08, 0.08, 0.1)
    stripes = (x > 110) & (x < 200) & (y > 110) & (y < 140)
    image[stripes] = np.where((x[stripes].astype(int) // 2) % 2 == 0, 0.95, 0.05)[:, None]
    for k in range(5):  # bars one to three pixels thick
        top = 30 + k * 8
        image[top : top + 1 + k // 2, 45 : 45 + 30 + 10 * k] = 0.02
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


def labelled(image: Image.Image, text: str) -> Image.Image:
    canvas = Image.new("RGB", (image.width, image.height + LABEL_HEIGHT), "white")
    canvas.paste(image, (0, LABEL_HEIGHT))
    ImageDraw.Draw(canvas).text((4, 3), text, fill="black")
    return canvas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "upscale-before-after.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source, result = Path(folder) / "card.png", Path(folder) / "card_x2.png"
        Image.fromarray(test_card()).save(source)
        env = dict(os.environ, PYTHONPATH=str(ROOT.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run(
            [sys.executable, "-m", ROOT.name, "upscale", str(source), str(result)], env=env, capture_output=True, text=True
        )
        print(done.stdout + done.stderr, end="")
        if done.returncode != 0:
            return done.returncode
        before = Image.open(source).convert("RGB").crop(CROP)
        after = Image.open(result).convert("RGB").crop(tuple(2 * c for c in CROP))
    side = (after.width * ZOOM, after.height * ZOOM)
    left = labelled(before.resize(side, Image.NEAREST), "input, pixels repeated")
    right = labelled(after.resize(side, Image.NEAREST), "upscale x2 (embedded bicubic model)")
    picture = Image.new("RGB", (left.width + right.width + 8, left.height), "white")
    picture.paste(left, (0, 0))
    picture.paste(right, (left.width + 8, 0))
    picture.save(args.output, optimize=True)
    print(f"wrote {args.output} ({picture.width}x{picture.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
