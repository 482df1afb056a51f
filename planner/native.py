"""Native plans: which modules ``torch.utils.checkpoint`` wraps, chosen against the budget.

The default plan (``planner.plan(..., executor="native")``). The profiler's trace of the step is
regrouped to single ops; solvers/regions/ predicts the peak and time of checkpointing any set of
the model's submodules (and runs of an ``nn.Sequential``'s children) the way non-reentrant
``torch.utils.checkpoint`` does, and the exact search (solvers/native/) finds the fastest set that
fits. The plan is then **measured once** on the example inputs (runtime/native.py applied, one
training step under the allocator's events, removed again): a measured peak over the budget
tightens the budget by the excess and the search runs again (at most
:data:`planner.native_repair.REPAIRS` times), so a plan this returns fits on the example inputs by
measurement, not only by prediction. Both figures are in the plan.

Why measure: the trace's backward reads what autograd saves, but not always in eager's exact form
(a dropout traced as ``rand < p`` and a multiply holds a float mask where eager holds a bool one), so
the prediction is an estimate of eager checkpointing, usually a little above it.

This module is the front door (:func:`plan_native`); one concept each, beside it:

- native_plan.py: the plan format (:class:`NativePlan`);
- native_request.py: the request understood once (its profile, priced op graph, resolved budget);
- native_solve.py: the problem built and solved (:func:`solve_native`), the least budget a refusal names;
- native_measure.py: a plan measured (:func:`measure_native`) and its predicted time checked;
- native_repair.py: measure and repair, the near miss measured before a refusal;
- native_hints.py: what a plan or refusal tells the user besides its figures;
- sharding.py: what DDP and FSDP2 wrappers hold on each rank.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial

import torch

import profiler
from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.inputs import normalise_inputs
from runtime.chain import module_fingerprint
from runtime.native import input_shapes, remove_native
from solvers.regions import SAVE_POLICIES, RegionPlan, region_costs
from solvers.schedule import SolverInfo

from .bounded import check_within_device, predicted_step_fits, profiling_bound
from .budget import Budget
from .native_hints import warn_if_above_bound
from .native_measure import check_times
from .native_plan import NativePlan
from .native_repair import search_measure_repair
from .native_request import NativeRequest, ResolvedBudget, native_profile, resolved_budget, understood
from .native_solve import METHOD
from .planchecks import MODELLED_REGIONS
from .planfile import profile_fields
from .sharding import DISTRIBUTED, FSDP2, describe_distributed, fsdp2_bytes, refuse_wrapped, wrapper_bytes  # noqa: F401
from .sharding import distributed_problem  # noqa: F401  (planner/api.py imports it from here)



def plan_native(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None,
                time_limit: float | None = None, granularity="module",
                profile: profiler.Profile | None = None, measure: bool = True,
                distributed: str | None = None, policies: Sequence[str] = tuple(SAVE_POLICIES),
                optimizer=None, device_memory: int | None = None, clock: bool = True) -> NativePlan:
    """A :class:`NativePlan` for ``budget``: see the module docstring. Raises :class:`Infeasible`
    (``min_budget`` in whole-step bytes) when no set of regions fits.

    ``device_memory`` (bytes; planner/bounded.py): profiling holds at most the lower of it and a
    byte budget, the un-checkpointed step is run (for a ``"N%"`` budget) only when its predicted peak
    fits it, else N% is of the predicted peak; a budget above it is refused
    (:class:`planner.bounded.DeviceMemoryError`).

    ``distributed`` (``"ddp"``, ``"fsdp2"`` or an :class:`FSDP2`) counts what the wrapper changes on
    each device (:func:`wrapper_bytes`) in the predicted and in the measured peak (the measurement
    runs unwrapped, in this process, and adds those bytes), and in the base of a ``"N%"`` budget.
    ``policies`` restricts the save policies the search may use (benchmarks/policies.py compares).
    ``optimizer`` (an instance or a name, planner/optimizer.py): every figure is of the training
    iteration, its state held through forward and backward and its step after them.
    ``clock``: price what torch.utils.checkpoint itself costs per region and per op under a policy,
    measured on the model's device (planner/checkpoint_clock.py; fitted to one of the model's own
    regions when ``measure``); False prices the recomputed ops alone (benchmarks/clock.py compares)."""
    refuse_wrapped(model)
    check_within_device(budget, budget.bytes, device_memory)
    bound = profiling_bound(budget, device_memory)
    remove_native(model)  # re-planning a model planned before: trace its own forward
    # Profiling runs every op of the step: the measurements after it need no warm-up step (on CPU).
    warm = profile is None
    if profile is None:
        # Single ops, the grouping the region search reads (``granularity`` groups the traced executor's).
        profile = native_profile(model, example_inputs, loss_fn, granularity="op", memory_bound=bound)
    wrapper = partial(wrapper_bytes, model, distributed)  # regions -> bytes the wrapper changes
    request = understood(model, example_inputs, loss_fn, budget, profile, time_limit, measure, wrapper,
                         policies, optimizer, device_memory, clock, warm)
    resolved = resolved_budget(request, bound)
    solved, held, measured, solving = search_measure_repair(request, resolved)
    plan = _built_plan(request, resolved, solved, held, measured, solving, distributed)
    warn_if_above_bound(profile, bound, device_memory)  # of a plan made: a refusal says what it needs itself
    # The pairing runs the un-checkpointed step: only where it fits the device.
    if measure and predicted_step_fits(resolved.unplanned_peak, device_memory):
        check_times(plan, model, example_inputs, loss_fn)
    plan.input_shapes = input_shapes(*normalise_inputs(example_inputs))
    return plan


def _built_plan(request: NativeRequest, resolved: ResolvedBudget, solved: RegionPlan, held: int, measured,
                solving: float, distributed) -> NativePlan:
    """The :class:`NativePlan` for the solved regions, with the wrapper's and the iteration's figures."""
    model, iteration = request.model, request.iteration
    plan = _native_plan(model, request.profile, solved, held, request.budget, resolved.budget_bytes,
                        resolved.unplanned_peak, request.unplanned.outcome.compute_cost, measured, solving)
    plan.distributed = describe_distributed(model, distributed)
    plan.wrapper_bytes = request.wrapper(solved.regions)
    plan.predicted_peak_bytes = iteration.peak(plan.predicted_peak_bytes)
    plan.optimizer = iteration.optimizer or None
    plan.optimizer_state_bytes, plan.optimizer_step_peak_bytes = iteration.state_bytes, iteration.step_peak_bytes
    plan.unplanned_peak_predicted = resolved.predicted_only
    return plan


def _native_plan(model, profile, solved: RegionPlan, held: int, budget: Budget, budget_bytes: int,
                 unplanned_peak: int, unplanned_seconds: float, measured, seconds: float) -> NativePlan:
    graph = solved.graph.copy()
    graph.graph["fingerprint"] = graph_fingerprint(graph)
    graph.graph[MODELLED_REGIONS] = json.dumps(list(solved.regions))  # what load checks the plan's regions against
    recomputed = sum(len(region_costs(profile.regroup("op").graph, r).recomputed) for r in solved.regions)
    found = solved.schedule.info  # the search's status (optimal, or feasible with its gap) and how it got there
    info = SolverInfo(
        method=METHOD, status=found.status, gap=found.gap, solve_seconds=seconds, budget_bytes=budget_bytes - held,
        predicted_peak_bytes=solved.outcome.peak_bytes, compute_cost=solved.outcome.compute_cost,
        message=((f"checkpoint {len(solved.regions)} module(s) with torch.utils.checkpoint, recomputing "
                  f"{recomputed} op(s)") if solved.regions else "nothing to checkpoint: the step fits as it is")
        + (f"; {found.message}" if found.message and solved.regions else ""),  # no regions: said once
    )
    return NativePlan(
        schedule=solved.schedule.with_info(**info.__dict__),
        graph=graph,
        budget_bytes=budget_bytes,
        budget_text=str(budget),
        fixed_bytes=held,
        predicted_peak_bytes=held + solved.outcome.peak_bytes,
        unplanned_peak_bytes=unplanned_peak,
        predicted_seconds=solved.outcome.compute_cost,
        unplanned_seconds=unplanned_seconds,
        fingerprint=module_fingerprint(model, solved.regions),
        granularity="op",
        **profile_fields(profile, model),
        regions=tuple(solved.regions),
        measured_peak_bytes=None if measured is None else int(measured.peak_bytes),
        measured_seconds=None if measured is None else float(measured.seconds),
    )


__all__ = ["DISTRIBUTED", "FSDP2", "describe_distributed", "distributed_problem", "fsdp2_bytes", "plan_native",
           "refuse_wrapped", "wrapper_bytes"]
