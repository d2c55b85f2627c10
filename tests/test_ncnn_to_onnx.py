"""tools/ncnn_to_onnx.py on `.param` files it cannot read (issue #39 item 16): one line on stderr
and exit 2 for each, the previous output kept. The small valid file first proves each broken one
differs from a convertible file only by its defect."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from trained_weights import TOOL, converter

HEAD = "7767517\n3 3\n"
INPUT = "Input data 0 1 data 0=3\n"
CONV = "Convolution conv 1 1 data c 0=12 1=1 5=1 6=36\n"
SHUFFLE = "PixelShuffle up 1 1 c out 0=2\n"
VALID = HEAD + INPUT + CONV + SHUFFLE
WEIGHTS = struct.pack("<I", 0) + np.arange(36, dtype=np.float32).tobytes() + np.zeros(12, np.float32).tobytes()

BROKEN = {
    "empty": "",
    "blank": "\n  \n\t\n",
    "only the magic": "7767517\n",
    "a layer line with too few fields": HEAD + INPUT + "Convolution conv 1\n" + SHUFFLE,
    "fewer blobs than it names": HEAD + INPUT + "Convolution conv 2 1 data\n",
    "a parameter that is not KEY=NUMBER": HEAD + INPUT + CONV.replace("0=12", "0=twelve") + SHUFFLE,
    "Convolution without 0=": HEAD + INPUT + CONV.replace("0=12 ", "") + SHUFFLE,
    "Convolution without 6=": HEAD + INPUT + CONV.replace(" 6=36", "") + SHUFFLE,
    "PixelShuffle without 0=": HEAD + INPUT + CONV + SHUFFLE.replace(" 0=2", ""),
    "Interp without 1=": HEAD + INPUT + CONV + "Interp up 1 1 c out 0=2 2=2.0\n",
    "BinaryOp op 9": HEAD + INPUT + CONV + "Split s 1 2 c c1 c2\nBinaryOp b 2 1 c1 c2 out 0=9\n",
    "no Input layer": "7767517\n2 2\n" + CONV + SHUFFLE,
    "an undefined blob": HEAD + INPUT + CONV + SHUFFLE.replace(" c ", " nowhere "),
}

WORDS = {
    "empty": "empty",
    "blank": "empty",
    "only the magic": "no Input layer",
    "a layer line with too few fields": "line 4",
    "fewer blobs than it names": "names 2 input",
    "a parameter that is not KEY=NUMBER": "'0=twelve'",
    "Convolution without 0=": "no 0= (output channels)",
    "Convolution without 6=": "no 6= (weight count)",
    "PixelShuffle without 0=": "no 0= (upscale factor)",
    "Interp without 1=": "no 1= (height scale)",
    "BinaryOp op 9": "BinaryOp op 9 is not mapped",
    "no Input layer": "reads blob 'data', which no earlier layer makes (the .param has no Input layer",
    "an undefined blob": "reads blob 'nowhere'",
}


def _files(tmp_path, param: str):
    (tmp_path / "m.param").write_text(param)
    (tmp_path / "m.bin").write_bytes(WEIGHTS)
    return [str(tmp_path / n) for n in ("m.param", "m.bin", "m.onnx")]


def test_the_small_valid_file_converts_and_runs(tmp_path):
    assert converter().main(_files(tmp_path, VALID)) == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"input": np.ones((1, 3, 4, 5), np.float32)})
    assert out.shape == (1, 3, 8, 10)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_param_is_one_line_exit_2_and_keeps_the_previous_output(tmp_path, capsys, case):
    previous = b"the previous conversion"
    (tmp_path / "m.onnx").write_bytes(previous)
    code = converter().main(_files(tmp_path, BROKEN[case]))
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("ncnn_to_onnx: ") and WORDS[case] in line and "nothing was written" in line, line
    assert (tmp_path / "m.onnx").read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "m.onnx", "m.param"]


def test_the_command_itself_exits_2_with_one_line(tmp_path):
    files = _files(tmp_path, BROKEN["BinaryOp op 9"])
    done = subprocess.run([sys.executable, str(TOOL), *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "m.onnx").exists()
