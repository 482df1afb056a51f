"""The class's cost beside a native plan: the order-free bound on the same cost graph at the same budget.

A native plan is the fastest set of checkpointed modules and save policies the region search finds
(planner/native.py, solvers/native). Any schedule of the same ops, in any order and with any op
recomputed (what the traced executor may run), costs at least the order-free relaxation's bound
(solvers/orderfree, its package docstring says why the bound holds). Beside the native plan's
predicted time it bounds what checkpointing restricted to modules gives up: at most the plan's
time less the bound. Issue 28, item 3.

The bound is solved on the native plan's op graph (the profile regrouped to single ops; node costs
in seconds), within the budget less what any executor holds besides the activations: parameters,
buffers, inputs, the loss value, the optimizer's state and a DDP wrapper's buckets. The generator
states a checkpoint saves are left out: the budget the bound is solved at is at least any plan's,
so it stays below the native plan's time (the clock's per-region cost, planner/checkpoint_clock.py,
is the native plan's own). It costs a share of the planning time at most (:data:`PLANNING_SHARE`):
where the relaxation does not give a bound in it, the plan says so and carries none.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from solvers.clock import Clock
from solvers.errors import SolverTimeout, SolverUnavailable
from solvers.graph import node_costs
from solvers.orderfree import OrderFreeModel, choose_milestones

from .planfile import Plan

# Seconds the bound may take: this share of the seconds the plan took (profiling, search and
# measurements), within [MIN_SECONDS, MAX_SECONDS], and the columns of its relaxation (milestones
# thinned to fit: solvers/orderfree ``choose_milestones``). Measured on a 3-layer GPT-2's op graph
# (299 ops, 2 x 64 tokens, native plan +58% at 60%; load ~5): at 2,000 columns the bound was +1.2 to
# +1.8% in 0.3 s, +2.0% in 0.5 s, +2.2% proven in 1.9 s; at 3,000, +4.0% in 1-2 s; at 5,000, +5.2%
# in 2 s; at 50,000 the LP alone took 2.3 s (+0.8%). On op graphs the relaxation is weak (it drops
# the order between milestones): more seconds buy little, and every native plan pays them.
PLANNING_SHARE = 0.05
MIN_SECONDS = 0.3
MAX_SECONDS = 3.0
MAX_COLUMNS = 2_000
LP_SHARE = 0.5  # of the seconds, for the LP relaxation: a bound even where the MILP's root does not finish


@dataclass(frozen=True)
class UnrestrictedBound:
    """``seconds``: no schedule of the graph within the budget computes in less (None: not found in
    time; ``note`` says why); ``proven``: the relaxation's MILP solved to optimality (else its dual
    bound or its LP's value, lower)."""

    seconds: float | None
    proven: bool = False
    note: str = ""


def order_free_bound_within(graph, activation_budget: int, seconds: float,
                            max_columns: int = MAX_COLUMNS) -> UnrestrictedBound:
    """The order-free bound of ``graph`` (seconds of compute) within ``activation_budget`` bytes of
    results held, solved in ``seconds`` at most (building included). Never below computing every node
    once; ``math.inf`` where no schedule fits."""
    costs = node_costs(graph)
    once = float(sum(costs.cost))
    clock = Clock(seconds)
    try:
        model = OrderFreeModel(costs, activation_budget, choose_milestones(costs, max_columns)).build(clock)
        relaxed = model.solve(clock.share(LP_SHARE), integral=False)
        results = [relaxed]
        if not relaxed.infeasible and not clock.expired():
            results.append(model.solve(clock.left()))
    except SolverTimeout:
        return UnrestrictedBound(None, note=f"not computed: the order-free relaxation was not built in {seconds:.2f} s")
    except SolverUnavailable as error:
        return UnrestrictedBound(None, note=f"not computed: {error}")
    if any(result.infeasible for result in results):
        return UnrestrictedBound(math.inf, proven=True, note="no schedule fits the budget")
    bounds = [result.bound for result in results if result.bound is not None]
    if not bounds:
        return UnrestrictedBound(None, note=f"not computed: the order-free relaxation gave no bound in {seconds:.2f} s")
    proven = results[-1].proven and len(results) == 2
    return UnrestrictedBound(max([once, *bounds]), proven=proven,
                             note="the order-free MILP's optimum" if proven else
                             "the order-free relaxation's dual bound (its MILP not proven in the time)")


def held_by_any_executor(plan: Plan, graph) -> int | None:
    """Bytes any executor holds besides the activations of ``plan``'s step: parameters, buffers,
    inputs, the loss value, the optimizer's state, DDP's buckets. None under FSDP2, whose gathered
    units depend on the schedule."""
    distributed = getattr(plan, "distributed", None)
    if distributed not in (None, "ddp"):
        return None
    wrapper = getattr(plan, "wrapper_bytes", 0) if distributed else 0
    return (int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))
            + getattr(plan, "optimizer_state_bytes", 0) + wrapper)


def with_unrestricted_bound(plan: Plan, planning_seconds: float) -> Plan:
    """``plan`` (a native plan made from a profile) with ``unrestricted_seconds`` and
    ``unrestricted_note`` set: the bound solved in :data:`PLANNING_SHARE` of ``planning_seconds``."""
    profile = plan.profile
    if profile is None:
        plan.unrestricted_note = "not computed: the plan has no profile"
        return plan
    graph = profile.regroup("op").graph
    held = held_by_any_executor(plan, graph)
    if held is None:
        plan.unrestricted_note = "not computed under FSDP2 (its gathered units depend on the schedule)"
        return plan
    seconds = min(MAX_SECONDS, max(MIN_SECONDS, PLANNING_SHARE * planning_seconds))
    started = time.perf_counter()
    found = order_free_bound_within(graph, plan.budget_bytes - held, seconds)
    spent = time.perf_counter() - started
    if found.seconds is not None and not found.seconds <= plan.predicted_seconds:
        # Not a bound on this plan's time (another cost model, or none fits): not shown as one.
        plan.unrestricted_note = (f"not shown: the relaxation gave {found.seconds:.6g} s, above the plan's own "
                                  f"{plan.predicted_seconds:.6g} s")
        return plan
    plan.unrestricted_seconds = found.seconds
    plan.unrestricted_note = f"{found.note}, in {spent:.2f} s"
    return plan


def class_cost_words(plan: Plan) -> str:
    """The summary's words for the plan's time beside the bound: ``"native optimum +X%;
    unrestricted bound +Y%"`` (``"native plan"`` when the search did not prove its optimum), or why
    there is no bound; "" for a plan that never had one (files written before it was recorded)."""
    unplanned = plan.unplanned_seconds
    if plan.unrestricted_seconds is None:
        return f" (unrestricted bound {plan.unrestricted_note})" if plan.unrestricted_note else ""
    bound = plan.unrestricted_seconds / unplanned - 1 if unplanned > 0 else 0.0
    native = "native optimum" if plan.status == "optimal" else "native plan"
    return (f" ({native} {plan.predicted_overhead:+.1%}; unrestricted bound {bound:+.1%}: no schedule of these ops, "
            "in any order, by any executor, is predicted faster within the budget)")


__all__ = ["LP_SHARE", "MAX_COLUMNS", "MAX_SECONDS", "MIN_SECONDS", "PLANNING_SHARE", "UnrestrictedBound",
           "class_cost_words", "held_by_any_executor", "order_free_bound_within", "with_unrestricted_bound"]
