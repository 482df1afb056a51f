"""Measured overhead of native plans: CPU time of a training step with a plan applied over the
eager step's, eager and every plan stepped in turn in each round (paired, interleaved).

CPU time of this process (``time.process_time``) on one torch thread: on a machine shared with
other jobs, the wall clock counts their time too; a step's own CPU time is what the plan changes.
Used by benchmarks/clock.py and benchmarks/native_exact.py.
"""

from __future__ import annotations

import statistics
import time

from profiler.inputs import normalise_inputs
from runtime.native import apply_native, remove_native


def cpu_step(model, args, kwargs, loss_fn) -> float:
    """CPU seconds of one training step (gradients dropped first)."""
    for parameter in model.parameters():
        parameter.grad = None
    started = time.process_time()
    loss_fn(model(*args, **kwargs)).backward()
    return time.process_time() - started


def measured_overheads(model, inputs, loss_fn, configurations: list[tuple[str, ...]], rounds: int) -> dict:
    """Each configuration's (a tuple of native regions) step over eager's, per round (eager and the
    configurations stepped in turn in every round, after one untimed round): configuration -> list
    of ratios."""
    args, kwargs = normalise_inputs(inputs)
    ratios: dict[tuple[str, ...], list[float]] = {c: [] for c in configurations}
    for round_number in range(rounds + 1):
        eager = cpu_step(model, args, kwargs, loss_fn)
        for regions in configurations:
            apply_native(model, regions)
            try:
                seconds = cpu_step(model, args, kwargs, loss_fn)
            finally:
                remove_native(model)
            if round_number:
                ratios[regions].append(seconds / eager)
    for parameter in model.parameters():
        parameter.grad = None
    return ratios


def quartiles(values: list[float]) -> tuple[float, float]:
    """(first, third) quartile of ``values`` (the value itself when there is one)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def overhead_text(ratios: list[float]) -> str:
    """``"+12.3% (+10.1% to +14.0%)"``: the median ratio minus one, its quartiles in brackets."""
    low, high = quartiles(ratios)
    return f"{statistics.median(ratios) - 1:+.1%} ({low - 1:+.1%} to {high - 1:+.1%})"
