"""Build the ONNX files embedded in the add-on (models/assets/), byte for byte reproducibly.

    python tools/build_assets.py          # rewrite the stored files
    python tools/build_assets.py --check  # exit 1 when a stored file differs from a fresh build

bicubic_x2.onnx is the default upscaler, so the add-on and `python -m lean_image_ai upscale` work
with nothing downloaded: one Resize op, cubic with a = -0.5 (Keys, the kernel PIL and
`models.imaging.resize(kernel="cubic")` use, so a cubic-resized alpha matches the colour),
half-pixel centres, edge clamping, dynamic height and width. Needs the `onnx` package (a dev
dependency); the add-on itself only loads the stored file.
"""

from __future__ import annotations

import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "models" / "assets"
OPSET = 13  # Resize-13: cubic_coeff_a and half_pixel; onnxruntime has run it since 1.7
IR_VERSION = 7


def bicubic_x2_model():
    import numpy as np
    from onnx import TensorProto, checker, helper, numpy_helper

    scales = numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "scales")
    resize = helper.make_node(
        "Resize",
        ["input", "", "scales"],  # no roi: only used by tf_crop_and_resize
        ["output"],
        mode="cubic",
        cubic_coeff_a=-0.5,
        coordinate_transformation_mode="half_pixel",
        exclude_outside=0,
    )
    graph = helper.make_graph(
        [resize],
        "bicubic_x2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "height_x2", "width_x2"])],
        [scales],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lean_image_ai"
    )
    model.ir_version = IR_VERSION
    checker.check_model(model)
    return model


BUILDERS = {"bicubic_x2.onnx": bicubic_x2_model}


def build(name: str) -> bytes:
    return BUILDERS[name]().SerializeToString()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    status = 0
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name in BUILDERS:
        data = build(name)
        path = ASSETS / name
        if check:
            same = path.is_file() and path.read_bytes() == data
            print(f"{name}: {'up to date' if same else 'DIFFERS from a fresh build'}")
            status |= 0 if same else 1
        else:
            path.write_bytes(data)
            print(f"wrote {path} ({len(data)} bytes)")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
