"""Native plans measured: one training step with the regions checkpointed (runtime/native.py applied,
then removed), and the plan's predicted time checked against a paired timing beside the
un-checkpointed step. Bytes and seconds as the allocator's events and the clock give them.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from profiler.oom import reported_out_of_memory
from runtime.native import apply_native, remove_native

from .measured import measure_planned_step
from .native_plan import NativePlan
from .paired_timing import SLOW_FAST, disagreement, time_paired
from .planfile import PlanWarning


def measure_native(model: torch.nn.Module, regions, example_inputs, loss_fn, repeats: int = 1,
                   warm_up: bool = True):
    """One training step of ``model`` with ``regions`` checkpointed, measured, then undone. The
    parameters' ``.grad`` are left as they were: a planning step's gradients would otherwise be
    added to the user's first real step's (RNG and buffers are restored by measure_step).
    ``warm_up=False``: no warm-up step before the measured one on CPU (the model ran in this process
    already: planner/measured.py)."""
    try:
        apply_native(model, regions)
        with reported_out_of_memory("measuring the planned step" if regions else "measuring the un-checkpointed step"):
            return measure_planned_step(model, example_inputs, loss_fn, repeats, warm_up=warm_up)
    finally:
        remove_native(model)


def eager_timed(model, example_inputs, loss_fn, extra: int, eager, warm_up: bool):
    """The un-checkpointed step measured and timed (``eager`` again when it was timed already), its
    peak with the wrapper's ``extra`` bytes."""
    if eager is not None and eager.runs > 0:
        return eager
    timed = measure_native(model, (), example_inputs, loss_fn, warm_up=warm_up)
    return replace(timed, peak_bytes=timed.peak_bytes + extra)


def check_times(plan: NativePlan, model, example_inputs, loss_fn) -> None:
    """Warn (:class:`PlanWarning`) when the plan's step, timed beside the un-checkpointed one, is
    slower or faster against it than predicted by more than :data:`SLOW_FAST`, on a pairing that
    can be trusted (planner/paired_timing.py). The pairing (three more steps) is timed only when the
    plan's one measured step is that far from its predicted time: comparing those two alone cried
    wolf whenever the machine's load changed between profiling and measuring."""
    if not plan.regions or plan.measured_seconds is None or plan.predicted_seconds <= 0:
        return
    if abs(plan.measured_seconds / plan.predicted_seconds - 1) <= SLOW_FAST:
        return

    def step(regions):
        return lambda: measure_native(model, regions, example_inputs, loss_fn, warm_up=False).seconds

    message = disagreement(time_paired(step(()), step(plan.regions)), plan.predicted_seconds,
                           plan.unplanned_seconds)
    if message is not None:
        warnings.warn(message, PlanWarning, stacklevel=5)  # the caller of planner.plan
