"""Native plans measured and repaired: the search's plan for the budget is measured once on the
example inputs; a measured peak over the budget asks the search for less by the excess (at most
:data:`REPAIRS` times); where the search finds nothing, the least plan predicted just above the
budget is measured before the refusal. Bytes throughout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from solvers import Infeasible
from solvers.native import step_as_it_is

from .budget import Budget, format_bytes
from .native_hints import cache_hint
from .native_measure import eager_timed, measure_native
from .native_request import NativeRequest, ResolvedBudget
from .native_solve import METHOD, WrapperBytes, solve_native
from .optimizer import NO_OPTIMIZER, IterationMemory
from .repair import lower_by_excess, measure_and_repair

REPAIRS = 3  # re-solves after a measured peak over the budget


def _measured_regions(request: NativeRequest, regions):
    """The step with ``regions`` checkpointed, measured, its peak with the wrapper and the iteration."""
    measured = measure_native(request.model, regions, request.example_inputs, request.loss_fn,
                              warm_up=not request.warm)
    return replace(measured, peak_bytes=request.iteration.peak(
        measured.peak_bytes + request.wrapper(regions) + request.iteration.state_bytes))


@dataclass
class _TimedSearch:
    """:func:`solve_native` for the request at a target (whole-step bytes), its seconds summed."""

    request: NativeRequest
    seconds: float = 0.0  # in the search, the measurements apart

    def __call__(self, target_bytes: int):
        request = self.request
        started = time.perf_counter()
        found = solve_native(request.profile, request.model, target_bytes, request.time_limit,
                             extra_bytes=request.iteration.state_bytes, wrapper=request.wrapper,
                             policies=request.policies)
        self.seconds += time.perf_counter() - started
        return found


def search_measure_repair(request: NativeRequest, resolved: ResolvedBudget):
    """``(solved, held, measured, solving seconds)``: the search's plan for the budget, measured, and
    searched again for less by what the measurement missed (planner/repair.py's loop, its rule
    :func:`~planner.repair.lower_by_excess`: at most :data:`REPAIRS` times)."""
    budget_bytes, eager = resolved.budget_bytes, resolved.eager
    # The un-checkpointed step measured within the budget needs nothing, whatever the prediction says
    # (a few bytes above the measurement on a tiny model made "100%" infeasible).
    if eager is not None and eager.peak_bytes <= budget_bytes:
        if eager.runs == 0:  # the plan is the eager step: time it
            eager = replace(measure_native(request.model, (), request.example_inputs, request.loss_fn, warm_up=False),
                            peak_bytes=eager.peak_bytes)
        return step_as_it_is(request.op_graph), request.fixed_bytes, eager, 0.0
    search = _TimedSearch(request)
    if not request.measure:
        try:
            solved, held = search(budget_bytes)
        except Infeasible as error:
            return (*_least_or_refusal(request, error, budget_bytes, eager, None, budget_bytes), search.seconds)
        return solved, held, None, search.seconds
    measurements = {}  # regions -> the step measured with them (seconds besides the peak)

    def measure(found) -> int:
        regions = found[0].regions
        measurements[regions] = _measured_regions(request, regions)
        return measurements[regions].peak_bytes

    repair = measure_and_repair(search, measure, budget_bytes, lower_by_excess, max_attempts=REPAIRS + 1)
    last = repair.last
    measured = None if last is None else measurements[last.plan[0].regions]
    if repair.fitting is not None:
        return (*last.plan, measured, search.seconds)
    if repair.refusal is not None:
        return (*_least_or_refusal(request, repair.refusal, budget_bytes, eager, measured,
                                   repair.refused_target_bytes), search.seconds)
    # Every repair measured over: the refusal names the target the next repair would have asked for.
    raise Infeasible(_measured_over(request.budget, budget_bytes, last.measured_bytes,
                                    lower_by_excess(repair.attempts, budget_bytes)),
                     min_budget=last.measured_bytes, method=METHOD)


def _least_or_refusal(request: NativeRequest, error: Infeasible, budget_bytes: int, eager, measured, target: int):
    """``(solved, held, measured)`` where the search found nothing for ``target``: the least plan when
    it measures within the budget, else the eager step when it does; otherwise the refusal, naming
    the least budget in whole-step bytes."""
    model, iteration = request.model, request.iteration
    minimum = error.min_budget  # whole-step bytes (solve_native)
    minimum = None if minimum is None else iteration.peak(minimum)
    # Measured only where the least plan's predicted peak is within the device too.
    near_miss = request.measure and (request.device_memory is None or (minimum or 0) <= request.device_memory)
    least = least_if_it_measures_within(request.profile, model, request.example_inputs, request.loss_fn,
                                         request.wrapper, request.policies, budget_bytes, minimum, near_miss,
                                         request.time_limit, warm_up=not request.warm, iteration=iteration)
    if least is not None:
        return least
    if request.measure and measured is None:
        # The least plan can be predicted above the eager step as it measures (a stacked LSTM
        # without inter-layer dropout: least 5,851,200 B, eager 5,785,664 B): the eager step
        # is a plan too, and the least budget is never above it.
        eager = eager_timed(model, request.example_inputs, request.loss_fn, request.extra_bytes, eager,
                             warm_up=not request.warm)
        if eager.peak_bytes <= budget_bytes:
            return step_as_it_is(request.op_graph), request.fixed_bytes, eager
        minimum = eager.peak_bytes if minimum is None else min(minimum, eager.peak_bytes)
    if measured is not None:  # a repair asked for less than the budget: the least is not the user's
        raise Infeasible(_measured_over(request.budget, budget_bytes, measured.peak_bytes, target),
                         min_budget=measured.peak_bytes, method=METHOD) from None
    raise Infeasible(
        f"budget {request.budget} ({format_bytes(budget_bytes)}) is below the least that checkpointing the model's "
        f"modules reaches" + (f": {format_bytes(minimum)} ({minimum} bytes; parameters, buffers and inputs take "
                              f"{format_bytes(request.fixed_bytes)} of it)" if minimum else "")
        + cache_hint(model, request.profile), min_budget=minimum, method=METHOD) from None


def _measured_over(budget: Budget, budget_bytes: int, measured_bytes: int, target: int) -> str:
    return (f"budget {budget} ({format_bytes(budget_bytes)}): the native plans predicted within it measured over it "
            f"(the last {format_bytes(measured_bytes)}; asking the search for as little as {format_bytes(target)} did "
            "not bring the measurement under the budget: the prediction misses on this model); try a larger budget "
            "or executor='traced'")


NEAR_MISS = 0.02  # a least predicted peak this close above the budget is measured before refusing


def least_if_it_measures_within(profile, model, example_inputs, loss_fn, wrapper: WrapperBytes, policies,
                                budget_bytes: int, minimum: int | None, measure: bool, time_limit, warm_up: bool = True,
                                iteration: IterationMemory = NO_OPTIMIZER):
    """The least-peak plan, when its predicted peak is within :data:`NEAR_MISS` above the budget and
    its measured peak is within it: the prediction is an estimate of eager checkpointing (it
    over-predicts by up to a few tenths of a percent: docs/native.md), the measurement decides.
    When the least plan under ``policies`` measures over, the least plan without save policies is
    measured too: a policy holds what it saves, and where the prediction ties the two the plain
    regions can hold less (the benchmark U-Net at its per-block baseline's 117,385,672 B: its last
    decoder block under ``@matmuls`` measured 118,389,832 B, plain 117,385,672 B, both predicted
    118,445,048 B)."""
    if not measure or minimum is None or minimum > budget_bytes * (1 + NEAR_MISS):
        return None
    for allowed in dict.fromkeys((tuple(policies), ())):
        try:
            solved, held = solve_native(profile, model, minimum, time_limit, extra_bytes=iteration.state_bytes,
                                        wrapper=wrapper, policies=allowed)
        except Infeasible:
            continue
        measured = measure_native(model, solved.regions, example_inputs, loss_fn, warm_up=warm_up)
        measured = replace(measured, peak_bytes=iteration.peak(
            measured.peak_bytes + wrapper(solved.regions) + iteration.state_bytes))
        if measured.peak_bytes <= budget_bytes:
            return solved, held, measured
    return None
