"""A native plan for per-block FSDP2 whose per-rank peak is exact: the search counts FSDP2 by its
upper bound (planner/sharding.py ``fsdp2_bytes``); each plan it finds is priced exactly
(planner/fsdp2_timeline.py), and the search is asked again with the budget moved by what the bound
over-counted, or by what the exact peak is over (planner/repair.py's loop, the exact peak standing
for a measurement: at most :data:`REPAIRS` times; a plan within the budget by the bound is within it
exactly). Bytes throughout; one rank's step.

Used for a model on the meta device (planner/sharded.py, on its meta profile) and for a
materialised model planned with ``distributed="fsdp2"`` (:func:`plan_fsdp2`, on the native
profile). Nothing here runs the step: the plan's figures are predictions (``measured_peak_bytes``
is None) and a ``"N%"`` budget is of the predicted per-rank un-checkpointed peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import networkx as nx
import torch

from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.state import cuda_devices
from solvers import Infeasible
from solvers.regions import SAVE_POLICIES, RegionPlan, evaluate
from solvers.schedule import Schedule

from .bounded import check_within_device, profiling_bound
from .budget import Budget, format_bytes
from .fsdp2_search import fsdp2_search_graph
from .fsdp2_timeline import fsdp2_peak_bytes
from .native import plan_native
from .native_plan import NativePlan
from .planchecks import MODELLED_REGIONS
from .repair import Repair, lower_by_excess, measure_and_repair, starting_at
from .native_request import native_profile
from .native_solve import rng_bytes
from .sharding import FSDP2, refuse_wrapped, resolve_fsdp2, wrapper_bytes

REPAIRS = 3  # re-solves after the exact per-rank peak came out over the budget (planner/repair.py's loop)
LEAST_SLACK = 1000  # the bound's least plan is searched for at its least plus this fraction of it


def is_fsdp2(distributed) -> bool:
    """Whether ``distributed`` asks for FSDP2 (``"fsdp2"`` or an :class:`FSDP2`)."""
    return isinstance(distributed, FSDP2) or distributed == "fsdp2"


def plan_fsdp2(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None, time_limit: float | None = None,
               distributed="fsdp2", profile=None, policies: Sequence[str] = tuple(SAVE_POLICIES),
               device_memory: int | None = None) -> NativePlan:
    """The native plan of a materialised ``model`` for one rank's step on ``example_inputs`` under
    per-block FSDP2, ``budget`` per rank, its per-rank peak exact (the module docstring). The
    profile is the native planner's (op times measured on the model); the step is not measured."""
    refuse_wrapped(model)
    spec = resolve_fsdp2(model, distributed)
    check_within_device(budget, budget.bytes, device_memory)
    if profile is None:
        profile = native_profile(model, example_inputs, loss_fn, granularity="op",
                                 memory_bound=profiling_bound(budget, device_memory))
    return exact_fsdp2_plan(model, example_inputs, budget, profile, spec, loss_fn, time_limit, policies,
                            device_memory)


def exact_fsdp2_plan(model: torch.nn.Module, example_inputs, budget: Budget, profile, spec: FSDP2, loss_fn=None,
                     time_limit: float | None = None, policies: Sequence[str] = tuple(SAVE_POLICIES),
                     device_memory: int | None = None) -> NativePlan:
    """The native search on ``profile`` (op granularity) under ``spec``, each plan priced exactly and
    the search re-asked as the module docstring says. The plan's figures are the exact ones:
    ``wrapper_bytes`` is what FSDP2 changes at the step's peak. Raises :class:`Infeasible`."""
    op_graph = profile.regroup("op").graph
    held = int(op_graph.graph["fixed_bytes"]) + int(op_graph.graph.get("loss_value_bytes", 0))
    unplanned = evaluate(op_graph, ())
    unplanned_peak = fsdp2_peak_bytes(unplanned.graph, unplanned.schedule, model, spec, held)
    budget_bytes = budget.resolve(unplanned_peak)
    check_within_device(budget, budget_bytes, device_memory)
    # The search sees each unit's gradients as their shards, and FSDP2's buffers and the unit's whole
    # gradients op by op (planner/fsdp2_search.py); its plans are priced on the step as it runs.
    searched = replace(profile.regroup("op"), graph=fsdp2_search_graph(op_graph, model, spec))
    search_unplanned = evaluate(searched.graph, ()).outcome.peak_bytes
    over_counted = held + wrapper_bytes(model, spec) + search_unplanned - unplanned_peak
    devices = cuda_devices([*model.parameters()])
    priced_plans: dict[int, RegionPlan] = {}  # id(plan) -> the plan priced on the step's own sizes

    def solve(target: int) -> NativePlan:
        return plan_native(model, example_inputs, Budget(bytes=target), loss_fn=loss_fn, time_limit=time_limit,
                           profile=searched, measure=False, distributed=spec, policies=policies)

    def exact_peak(plan: NativePlan) -> int:  # the repair loop's "measurement": the exact per-rank peak
        priced = priced_plans[id(plan)] = evaluate(_whole_gradients(searched.graph, op_graph), plan.regions)
        return fsdp2_peak_bytes(priced.graph, priced.schedule, model, spec, held + rng_bytes(plan.regions, devices))

    def repaired_from(first_target: int, attempts: int) -> Repair[NativePlan]:
        return measure_and_repair(solve, exact_peak, budget_bytes, starting_at(first_target, lower_by_excess),
                                  max_attempts=attempts)

    # The search counts FSDP2 by its bound: asked first for the budget plus what the bound over-counts
    # on the un-checkpointed step, then lowered by what each plan's exact peak is over.
    repair = repaired_from(budget_bytes + max(over_counted, 0), REPAIRS + 1)
    if repair.refusal is not None and repair.refusal.min_budget is None and repair.refused_target_bytes > budget_bytes:
        repair = repaired_from(budget_bytes, REPAIRS + 1)  # the user's budget by the bound, whose plans fit exactly
    if repair.refusal is not None and repair.refusal.min_budget is not None:
        # The bound's least plan, priced exactly; asked a hair above its least (at exactly its own
        # least the search refused a 16-layer Llama again).
        least = repair.refusal.min_budget
        repair = repaired_from(least + least // LEAST_SLACK, 1)
        if repair.fitting is None:
            raise _below_least(budget, budget_bytes, repair.last.measured_bytes if repair.last else None)
    if repair.fitting is not None:
        fitted = repair.fitting
        return _with_exact_figures(fitted.plan, priced_plans[id(fitted.plan)], budget, budget_bytes, unplanned_peak,
                                   fitted.measured_bytes)
    if repair.refusal is not None:
        raise _below_least(budget, budget_bytes, None)
    raise Infeasible(f"budget {budget} ({format_bytes(budget_bytes)} per rank): the plans the search found within "
                     "it by FSDP2's upper bound came out over it exactly; try a larger budget",
                     min_budget=None, method="regions")


def _whole_gradients(searched: nx.DiGraph, op_graph: nx.DiGraph) -> nx.DiGraph:
    """The search's graph (with what the search annotated on it: the checkpoint clock) with the
    step's own sizes back: gradients whole, workspaces without FSDP2's."""
    whole = searched.copy()
    for node, data in whole.nodes(data=True):
        data["mem"] = op_graph.nodes[node]["mem"]
        data["workspace"] = op_graph.nodes[node].get("workspace", 0)
    return whole


def _below_least(budget: Budget, budget_bytes: int, least: int | None) -> Infeasible:
    """The refusal of a budget below the least plan's exact per-rank peak (``least``, when known)."""
    return Infeasible(f"budget {budget} ({format_bytes(budget_bytes)} per rank) is below the least that checkpointing "
                      "the model's modules reaches under FSDP2"
                      + (f": {format_bytes(least)} ({least} bytes) per rank" if least else ""),
                      min_budget=least or None, method="regions")


def _with_exact_figures(plan: NativePlan, priced: RegionPlan, budget: Budget, budget_bytes: int,
                        unplanned_peak: int, exact: int) -> NativePlan:
    """``plan`` (solved for another byte budget, on the search's graph) with the step's own region
    graph and schedule (``priced``), the user's budget and the exact per-rank figures: FSDP2's
    bytes at the peak as ``wrapper_bytes``, so that the predicted peak stays the bytes held besides
    the schedule plus its simulated peak (what a loaded plan is checked by)."""
    graph = priced.graph.copy()
    graph.graph["fingerprint"] = graph_fingerprint(graph)
    graph.graph[MODELLED_REGIONS] = plan.graph.graph[MODELLED_REGIONS]
    plan.graph = graph
    activations = priced.outcome.peak_bytes
    unwrapped = plan.fixed_bytes - plan.wrapper_bytes
    plan.wrapper_bytes = exact - unwrapped - activations
    plan.fixed_bytes = unwrapped + plan.wrapper_bytes
    plan.predicted_peak_bytes = exact
    plan.budget_bytes, plan.budget_text, plan.unplanned_peak_bytes = budget_bytes, str(budget), unplanned_peak
    plan.schedule = Schedule(priced.schedule.steps, plan.schedule.info).with_info(
        budget_bytes=budget_bytes - plan.fixed_bytes, predicted_peak_bytes=activations)
    plan.unplanned_peak_predicted = True  # nothing was run: every peak is predicted
    return plan


__all__ = ["exact_fsdp2_plan", "is_fsdp2", "plan_fsdp2"]
