"""The Upscale family (any ONNX super-resolution model, tiled), by concept: family.py (its record
and entry), job.py (one job's plan and frames), frame_input.py (a frame as the model takes it, the
alpha joined back), result.py (what a frame's result says), plan.py (overlap and tile size),
stages.py (a deep net's staged plan), runs.py (the model runs into the job's buffers), preview.py
(the plan said without running it). Others import the family's face from here."""

from .family import FAMILY, check_session, run
from .frame_input import DEFAULT_MODEL_PATH
from .result import UpscaleResult

__all__ = ["DEFAULT_MODEL_PATH", "FAMILY", "UpscaleResult", "check_session", "run"]
