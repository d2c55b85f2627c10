"""A job's memory budgets travel with the job (models/model_run.py -> RunOptions -> its runtime
operation), never through the shared runtime's settings: one job's budget never governs another
job, before, after or at the same time, on the same runtime."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.model_run import ModelRun
from lean_image_ai.runtime import Runtime, mark_last
from lean_image_ai.runtime.errors import MemoryBudgetError
from lean_image_ai.runtime.settings import MemoryBudgets
from onnx_builders import conv_model, sr_model

TINY = MemoryBudgets(1 << 20)  # 1 MiB of RAM: below what this process already uses


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_model(tmp_path_factory.mktemp("models") / "conv.onnx")


def job(runtime, model, budgets=None):
    frames = [np.random.default_rng(s).random((1, 3, 16, 16), dtype=np.float32) for s in range(2)]
    with runtime.operation("job", budgets=budgets) as op:
        handle = op.session(model, "cpu")
        return [op.run(handle, {"x": f}, last=last)["y"] for f, last in mark_last(frames)]


def test_a_family_jobs_budget_is_its_own(tmp_path):
    runtime = Runtime()
    model = sr_model(tmp_path / "sr.onnx", scale=2, mid_channels=4)
    tight = ModelRun.resolve("upscale", tmp_path, model_path=str(model), device="cpu", budgets=TINY)
    image = np.full((16, 16, 3), 0.5, np.float32)
    with pytest.raises(MemoryBudgetError, match=r"Not enough memory: loading sr\.onnx on cpu"):
        tight.infer(image, tight.options(runtime=runtime))
    assert runtime.settings.ram_budget_bytes is None and runtime.settings.vram_budget_bytes is None
    free = ModelRun.resolve("upscale", tmp_path, model_path=str(model), device="cpu")
    assert free.infer(image, free.options(runtime=runtime)).image.shape == (32, 32, 3)
    # options a front-end built itself still run under the job's budgets
    with pytest.raises(MemoryBudgetError):
        tight.infer(image, RunOptions(device="cpu", runtime=runtime))


def test_jobs_with_other_budgets_at_the_same_time_keep_their_own(conv, tmp_path):
    """Two jobs on one runtime, started together (a barrier), 20 times: the tight one is refused
    every time, the one without a budget runs every time. (Each loads its own model: a model
    already loaded is not checked again, whichever job loaded it.)"""
    runtime = Runtime()
    models = {"tight": conv, "free": conv_model(tmp_path / "other.onnx")}
    for _ in range(20):
        barrier = threading.Barrier(2)
        outcome: dict = {}

        def run(name, budgets, barrier=barrier, outcome=outcome):
            barrier.wait()
            try:
                job(runtime, models[name], budgets)
                outcome[name] = "ran"
            except MemoryBudgetError:
                outcome[name] = "refused"

        threads = [threading.Thread(target=run, args=a) for a in (("tight", TINY), ("free", None))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcome == {"tight": "refused", "free": "ran"}
        runtime.clear("next round loads again")  # the tight job's check is on loading
    assert runtime.settings.ram_budget_bytes is None


def test_an_operation_without_budgets_takes_the_runtimes_settings(conv):
    runtime = Runtime()
    runtime.configure(ram_budget_bytes=1 << 20)  # a script's choice for its jobs
    with pytest.raises(MemoryBudgetError):
        job(runtime, conv)
    assert len(job(runtime, conv, MemoryBudgets())) == 2  # a job's own (no limit) wins
