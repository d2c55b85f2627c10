"""Small real ONNX models and helpers for the tiling / upscale / CLI tests (onnx helper API)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from lean_image_ai.runtime.providers import CPU, SHRINK_CONFIG_KEY
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph, path) -> Path:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lean_image_ai-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def resize_model(path, *, factor=2.0, channels=3, tile=None, out_shape=None, nan=False) -> Path:
    """Nearest-neighbour Resize by `factor` (1.5 gives a non-integer scale).

    `tile` fixes the input size (then `out_shape` is the declared output size); `nan` adds
    log(-1) to every output value, so the model returns NaN everywhere.
    """
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    initializers = [scales]
    nodes = [helper.make_node("Resize", ["input", "", "scales"], ["r"], mode="nearest")]
    if nan:
        initializers.append(numpy_helper.from_array(np.array([-1.0], np.float32), "minus_one"))
        nodes += [
            helper.make_node("Log", ["minus_one"], ["nan"]),
            helper.make_node("Add", ["r", "nan"], ["output"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["output"]))
    in_shape = [1, channels, tile or "H", tile or "W"]
    out_shape = out_shape or [1, channels, "OH", "OW"]
    graph = helper.make_graph(
        nodes,
        "resize",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
        initializers,
    )
    return _save(graph, path)


class RecordingSession:
    """A real CPU InferenceSession that records the shrink entry and input shape of each run()."""

    def __init__(self, real, log: list):
        self.real = real
        self.log = log

    def get_providers(self):
        return self.real.get_providers()

    def get_provider_options(self):
        return self.real.get_provider_options()

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def run(self, names, feeds, run_options=None):
        try:
            entry = run_options.get_run_config_entry(SHRINK_CONFIG_KEY)
        except Exception:  # ORT raises for a key that was never set
            entry = ""
        shape = next(iter(feeds.values())).shape
        record = {"session": id(self), "shrink": entry, "shape": list(shape), "ok": False}
        self.log.append(record)
        outputs = self.real.run(names, feeds, run_options)
        record["ok"] = True
        return outputs


class RecordingFactory:
    """Session factory for Runtime(session_factory=...): real sessions, every run recorded in order."""

    def __init__(self):
        self.runs: list[dict] = []

    def __call__(self, model_path, session_options, providers):
        real = ort.InferenceSession(model_path, sess_options=session_options, providers=[CPU])
        return RecordingSession(real, self.runs)

    @property
    def shrink_entries(self) -> list[str]:
        return [r["shrink"] for r in self.runs]
