"""Which failures are out of memory (runtime/oom.py), on the texts onnxruntime 1.31 really builds.

The CUDA texts follow the provider's format in cuda_call.cc, as the installed wheel's
libonnxruntime_providers_cuda.so holds it ("%s failure %d: %s ; GPU=%d ; hostname=%s ; file=%s ;
line=%d ; expr=%s; %s"), with cuDNN 9's status names as cudnnGetErrorString returns them (read
from nvidia-cudnn-cu13 9.24's libcudnn_graph.so.9; numbers from its cudnn_graph.h). The arena
texts are BFCArena's (bfc_arena.cc); one is produced for real by a capped CPU arena in
test_runtime.py.
"""

from __future__ import annotations

import pytest
from lean_image_ai.runtime.oom import out_of_memory_resource

TAIL = " ; GPU=0 ; hostname=render01 ; file=conv.cc ; line=412 ; expr=cudnnConvolutionForward(...); "


def cuda_text(lib: str, code: int, name: str) -> str:
    return f"[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. {lib} failure {code}: {name}{TAIL}"


class OrtFail(Exception):
    """onnxruntime's Fail: a plain Exception subclass, as ORT's own are (not RuntimeError)."""


@pytest.mark.parametrize(
    ("text", "on_gpu", "resource"),
    [
        (cuda_text("CUDNN", 4004, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), True, "GPU memory"),
        (cuda_text("CUDNN", 4003, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"), True, "system memory"),
        (cuda_text("CUDNN", 2, "CUDNN_STATUS_ALLOC_FAILED"), True, "GPU memory"),  # cuDNN 8
        (cuda_text("CUDA", 2, "out of memory"), True, "GPU memory"),
        (cuda_text("CUBLAS", 3, "CUBLAS_STATUS_ALLOC_FAILED"), True, "GPU memory"),
        (
            "bfc_arena.cc:360 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*)"
            " Available memory of 3013632 is smaller than requested bytes of 18939904",
            True,
            "GPU memory",
        ),
        (
            "bfc_arena.cc:360 Available memory of 3013632 is smaller than requested bytes of 18939904",
            False,
            "system memory",
        ),
        ("Failed to allocate memory for requested buffer of size 536870912", True, "GPU memory"),
        ("Failed to allocate memory for requested buffer of size 536870912", False, "system memory"),
        ("std::bad_alloc", False, "system memory"),
    ],
)
def test_out_of_memory_texts_are_recognised(text, on_gpu, resource):
    assert out_of_memory_resource(OrtFail(text), on_gpu=on_gpu) == resource


@pytest.mark.parametrize(
    "text",
    [
        cuda_text("CUDA", 700, "an illegal memory access was encountered"),
        cuda_text("CUDA", 100, "no CUDA-capable device is detected"),
        cuda_text("CUDNN", 2000, "CUDNN_STATUS_BAD_PARAM"),
        cuda_text("CUDNN", 5000, "CUDNN_STATUS_EXECUTION_FAILED"),
        cuda_text("CUDNN", 4006, "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"),
        cuda_text("CUBLAS", 13, "CUBLAS_STATUS_EXECUTION_FAILED"),
        "Invalid device ID: 1, must be between 0 (inclusive) and 1 (exclusive).",
        "Did not find an arena based allocator registered for device-id combination in the memory arena "
        "shrink list: gpu:1",
    ],
)
def test_other_cuda_errors_are_not_out_of_memory(text):
    assert out_of_memory_resource(OrtFail(text), on_gpu=True) is None


def test_python_memory_error_is_system_memory():
    assert out_of_memory_resource(MemoryError(), on_gpu=True) == "system memory"
