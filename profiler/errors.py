"""What capturing a model's training step raises (profiler/capture.py), by whose failure it is."""

from __future__ import annotations


class CaptureError(RuntimeError):
    """The model's training step could not be captured as a graph."""


class ModelCallError(CaptureError):
    """The model (or the loss function) raised when run eagerly on the example inputs: the inputs do
    not fit the model, or the model is broken. No plan can be made; falling back would not help."""


class LossMismatch(CaptureError):
    """A saved plan's loss reads model outputs this model does not return."""


class TraceError(CaptureError):
    """The model runs eagerly but the tracer cannot follow its forward (Python control flow on
    tensor values, an op fake tensors do not support...). ``planner.plan`` falls back to
    checkpointing whole blocks with torch.utils.checkpoint (planner/fallback.py). ``reason`` is the
    tracer's error, in one short line."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def first_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"``, for messages that quote another error."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
