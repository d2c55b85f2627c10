"""Every runtime setting validated where it enters (RuntimeSettings, Runtime.configure, the
environment), with a message naming the setting and what it accepts; thread counts clamped."""

from __future__ import annotations

import math

import numpy as np
import pytest
from lean_image_ai.runtime import Runtime, RuntimeSettings, settings
from lean_image_ai.runtime.errors import LeanImageError, SettingError
from lean_image_ai.runtime.measure.leak_check import analyse, leak_check
from onnx_builders import conv_model


@pytest.mark.parametrize(
    "field, value, accepted",
    [
        ("cpu_arena_max_bytes", -1, "whole number of bytes"),
        ("cpu_arena_max_bytes", 1.5, "whole number of bytes"),
        ("gpu_mem_limit_bytes", 0, "whole number of bytes"),
        ("ram_budget_bytes", -(1 << 20), "whole number of bytes"),
        ("vram_budget_bytes", 1 << 60, "2**50"),
        ("cudnn_conv_algo_search", "BOGUS", "HEURISTIC, EXHAUSTIVE, DEFAULT"),
        ("intra_op_threads", -1, "number of threads"),
        ("intra_op_threads", 2.0, "number of threads"),
        ("cpu_release_delay", -1, "from 0"),
        ("cpu_release_delay", math.nan, "from 0"),
        ("cpu_release_delay", math.inf, "from 0"),
        ("cpu_release_delay", 1e308, "86400"),
        ("release_memory", "yes", "True or False"),
        ("cpu_arena", None, "True or False"),
        ("keep_models_loaded_on_dml_coreml", 1, "True or False"),
        ("coreml_compute_units", "GPU", "ALL, CPUAndGPU, CPUAndNeuralEngine"),
        ("coreml_cache_dir", "", "folder path"),
    ],
)
def test_a_bad_setting_is_refused_naming_it_and_what_it_accepts(field, value, accepted):
    with pytest.raises(SettingError, match=field) as caught:
        RuntimeSettings(**{field: value})
    assert accepted in str(caught.value) and isinstance(caught.value, LeanImageError | ValueError)
    runtime = Runtime()
    with pytest.raises(SettingError, match=field):
        runtime.configure(**{field: value})
    assert runtime.settings == RuntimeSettings()  # a refused change changes nothing


def test_thread_counts_are_clamped_to_the_machine_and_a_session_still_runs(tmp_path):
    cpus = settings.machine_threads()
    assert RuntimeSettings(intra_op_threads=10_000).intra_op_threads == cpus
    assert RuntimeSettings(intra_op_threads=0).intra_op_threads == 0  # onnxruntime's own choice
    runtime = Runtime(RuntimeSettings(intra_op_threads=10_000))
    handle = runtime.session(conv_model(tmp_path / "conv.onnx"), "cpu")
    with runtime.operation("clamped") as op:
        out = op.run(handle, {"x": np.ones((1, 3, 16, 16), np.float32)}, last=True)["y"]
    assert out.shape == (1, 3, 16, 16)


@pytest.mark.parametrize(
    "variable", [settings.RELEASE_CPU_ENV, settings.CUDNN_MAX_WORKSPACE_ENV, settings.KEEP_MODELS_LOADED_ENV]
)
def test_environment_flags_take_yes_and_no_words_and_refuse_the_rest(variable, monkeypatch):
    for word, value in (("1", True), ("off", False), ("YES", True), ("false", False)):
        monkeypatch.setenv(variable, word)
        assert settings.env_flag(variable, not value) is value
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(SettingError, match=f"{variable}='maybe'"):
        settings.settings_from_environment()


@pytest.mark.parametrize("text", ["abc", "-1", "nan", "inf", "0x10", "1e308"])
def test_the_release_delay_variable_is_refused_with_the_text_given(text, monkeypatch):
    monkeypatch.setenv(settings.RELEASE_DELAY_ENV, text)
    with pytest.raises(SettingError, match=f"{settings.RELEASE_DELAY_ENV}='{text}'.*86400"):
        settings.settings_from_environment()


def test_a_leak_check_of_too_few_runs_is_refused_not_stable():
    ran = []
    for runs in (0, -5, 3, True):
        with pytest.raises(SettingError, match="at least|from 8"):
            leak_check(lambda: ran.append(1), runs=runs)
    assert ran == []  # refused before running anything
    with pytest.raises(SettingError, match="at least 8"):
        analyse({})  # nothing measured is not "stable"
