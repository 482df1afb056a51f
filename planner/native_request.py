"""One native planning request understood once: the profile it is made on, its op graph priced by
the checkpoint clock, the bytes held beside any plan's activations, the optimizer's iteration, and
the budget resolved to bytes (``"N%"`` of the eager step's measured peak, or of the predicted one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx
import torch

import profiler
from runtime.hf_cache import cache_off_while_planning
from runtime.rnn import staged_for_trace
from solvers import Infeasible
from solvers.regions import RegionPlan, evaluate

from . import checkpoint_clock
from .bounded import check_within_device, predicted_step_fits
from .budget import Budget
from .native_measure import measure_native
from .native_solve import METHOD, WrapperBytes, fixed_bytes
from .optimizer import IterationMemory, held_at_the_end, iteration_memory, step_over_budget


def native_profile(model: torch.nn.Module, example_inputs, loss_fn=None, granularity="op",
                   memory_bound: int | None = None, times_cache=None) -> profiler.Profile:
    """The profile a native plan is made on: the step as eager autograd runs it (the cross-entropy
    backward unfused: two logits-sized ops), a stacked RNN's layers as modules the search can
    checkpoint (runtime/rnn.py), a Hugging Face decoder's cache off as the planned model trains
    (runtime/hf_cache.py). ``memory_bound``: bytes profiling may hold (planner/bounded.py);
    ``times_cache``: :func:`profiler.profile`'s (op times measured before)."""
    with staged_for_trace(model), cache_off_while_planning(model):
        return profiler.profile(model, example_inputs, loss_fn=loss_fn, granularity=granularity, fuse_loss=False,
                                memory_bound=memory_bound, times_cache=times_cache)


@dataclass(frozen=True)
class NativeRequest:
    """One :func:`plan_native` call understood once: the model, its profile priced by the clock, the
    un-checkpointed step's evaluation and the bytes held beside any plan's activations."""

    model: torch.nn.Module
    example_inputs: object
    loss_fn: object
    budget: Budget
    profile: profiler.Profile
    op_graph: nx.DiGraph
    time_limit: float | None
    measure: bool
    wrapper: WrapperBytes  # what the distributed wrapper changes with given regions (bytes)
    policies: Sequence[str]
    device_memory: int | None
    warm: bool  # profiled in this process just now: the measurements need no warm-up step (on CPU)
    iteration: IterationMemory
    unplanned: RegionPlan  # the un-checkpointed step, evaluated
    extra_bytes: int  # the wrapper's bytes (no regions) and the optimizer's state
    fixed_bytes: int  # parameters, buffers, inputs, plus ``extra_bytes``


@dataclass(frozen=True)
class ResolvedBudget:
    """The budget in bytes, and the un-checkpointed step it was resolved against (bytes)."""

    budget_bytes: int
    unplanned_peak: int
    eager: object  # the eager step measured (its peak with the wrapper and the iteration), or None
    predicted_only: bool  # "N%" taken of the predicted un-checkpointed peak (it does not fit the device)


def understood(model, example_inputs, loss_fn, budget: Budget, profile: profiler.Profile, time_limit, measure: bool,
                wrapper: WrapperBytes, policies: Sequence[str], optimizer, device_memory: int | None, clock: bool,
                warm: bool) -> NativeRequest:
    """The request with the profile's op graph priced (or not) by the checkpoint clock, and the bytes
    held besides the activations: the wrapper's and the optimizer's state (planner/optimizer.py)."""
    extra = wrapper(())
    op_graph = profile.regroup("op").graph
    if not clock:
        op_graph.graph.pop(checkpoint_clock.KEY, None)
    else:
        checkpoint_clock.price(op_graph, model, example_inputs, policies, fit=measure)
    fixed = fixed_bytes(op_graph) + extra
    unplanned = evaluate(op_graph, ())
    # The optimizer's state is held like the parameters; its step's peak bounds every plan's from below.
    iteration = iteration_memory(optimizer, model, profile, fixed + held_at_the_end(unplanned.graph, unplanned.schedule))
    return NativeRequest(model, example_inputs, loss_fn, budget, profile, op_graph, time_limit, measure, wrapper,
                          policies, device_memory, warm, iteration, unplanned,
                          extra_bytes=extra + iteration.state_bytes, fixed_bytes=fixed + iteration.state_bytes)


def resolved_budget(request: NativeRequest, bound: int | None) -> ResolvedBudget:
    """The budget in bytes: ``"N%"`` of the eager step's measured peak where it is measured, else of
    the predicted one; refused when below the optimizer's step or above the device."""
    budget, iteration = request.budget, request.iteration
    unplanned_peak = iteration.peak(request.fixed_bytes + request.unplanned.outcome.peak_bytes)
    eager = None
    predicted_only = budget.percent is not None and not predicted_step_fits(unplanned_peak, bound)
    if request.measure and budget.percent is not None and not predicted_only:
        # "N%" is of the eager step's measured peak (docs/native.md, "Which step '100%' is").
        # Its peak alone (its time is not used: the plan's own step is timed) where profiling warmed up.
        eager = measure_native(request.model, (), request.example_inputs, request.loss_fn,
                               repeats=0 if request.warm else 1, warm_up=not request.warm)
        eager = replace(eager, peak_bytes=iteration.peak(eager.peak_bytes + request.extra_bytes))
        unplanned_peak = eager.peak_bytes
    budget_bytes = budget.resolve(unplanned_peak)
    if step_over_budget(iteration, str(budget), budget_bytes):
        raise Infeasible(step_over_budget(iteration, str(budget), budget_bytes), min_budget=iteration.step_peak_bytes,
                         method=METHOD)
    check_within_device(budget, budget_bytes, request.device_memory)
    return ResolvedBudget(budget_bytes, unplanned_peak, eager, predicted_only)
