"""A planning step measured: profiler.memory.measure_step, the parameters' ``.grad`` left as they were."""

from __future__ import annotations

from profiler.memory import StepMeasurement, measure_step


def measure_planned_step(module, example_inputs, loss_fn, repeats: int, warm_up: bool = True) -> StepMeasurement:
    """profiler.memory.measure_step (peak in bytes, seconds per step over ``repeats``), leaving the
    parameters' ``.grad`` as they were: planning must not train, and a planning step's gradients would
    otherwise be added to the user's first real step's. Used by planner/native_measure.py's measured native
    plans, planner/compiled.py and the traced plans' repair on CUDA (planner/api.py).

    ``warm_up=False`` (on CPU; CUDA always warms up) measures the peak on the first step, without
    measure_step's warm-up step: for a model whose ops have all run already in this process (the
    native planner measures after profiling), which leaves nothing lazy to initialise (the peaks of
    9 zoo models, eager and planned, were the same bytes either way). There ``repeats=0`` measures
    the peak alone: ``seconds`` is NaN and ``runs`` 0."""
    grads = [(p, p.grad) for p in module.parameters()]
    try:
        if warm_up:
            return measure_step(module, example_inputs, loss_fn=loss_fn, repeats=max(repeats, 1))
        return measure_step(module, example_inputs, loss_fn=loss_fn, repeats=repeats, warm_up=False)
    finally:
        for p, grad in grads:
            p.grad = grad


__all__ = ["measure_planned_step"]
