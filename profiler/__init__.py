"""Profile a model's training step into a cost graph with measured costs.

>>> import profiler
>>> prof = profiler.profile(model, example_inputs, loss_fn=None, granularity="module")  # doctest: +SKIP
>>> prof.graph          # networkx.DiGraph: cost (seconds), mem (bytes), ... (docs/costgraph.md)   # doctest: +SKIP
"""

from .api import Profile, profile
from .capture import CaptureError, ModelCallError, TraceError
from .inputs import InputMismatch
from .memory import StepMeasurement, measure_step

__all__ = [
    "CaptureError", "InputMismatch", "ModelCallError", "Profile", "StepMeasurement", "TraceError", "measure_step",
    "profile",
]
