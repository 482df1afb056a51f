"""``solve_hierarchical``: the block program's plans lowered and checked, certified by the order-free
relaxation's bound (the package docstring)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ..chain import ChainView, chain_views
from ..clock import Clock
from ..errors import Infeasible, SolverTimeout, SolverUnavailable
from ..graph import node_costs
from ..liveness import drop_redundant_computes, schedule_from_computes
from ..api import schedule_from
from ..options import time_limit_or_default
from ..schedule import FEASIBLE, OPTIMAL, Schedule
from ..simulate import simulate
from ..store_all import store_all_schedule
from .blocks import OptionChain, dp_accounting, option_chain
from .program import Program, lower, solve_program

METHOD = "hierarchical"
log = logging.getLogger(__name__)
# Plans above the one the bisection finds that are lowered and checked too (peaks are not monotone).
SEARCH_ABOVE = 24
# Share of the time left after planning given to the order-free relaxation (its LP, its MILP and
# the window search); the rest is slack for laying out and checking.
BOUND_SHARE = 0.98
# Shares of the relaxation's time: its LP (a bound even where the MILP's root does not end), then
# the window search from the cheapest schedule in hand, then the MILP (of what is left each time).
LP_SHARE = 0.5
WINDOWS_SHARE = 0.2
FIRST_SOLVE_SHARE = 0.9
# (WINDOWS_SHARE is used only where the block program's plan is the cheapest schedule in hand.)
# dp's schedule joins the MILP's starts only where every chain view has at most this many stages
# (solvers/orderfree/method.py's QUICK_DP_STAGES: dp then plans in about a second).
QUICK_DP_STAGES = 100
# A cost within this relative distance of the bound is proven optimal (the solvers' tolerance).
OPTIMALITY_TOLERANCE = 1e-7


# -- the method -----------------------------------------------------------------------------------

@dataclass
class _Plan:
    cost: float
    peak: int
    schedule: Schedule
    source: str


def _plans(graph, budget: int, clock: Clock) -> tuple[_Plan | None, int, list[str]]:
    """The cheapest lowered plan within ``budget`` over the chain views; the least peak seen; notes."""
    best: _Plan | None = None
    least = math.inf
    notes: list[str] = []
    for number, view in enumerate(chain_views(graph)):
        if number and clock.expired():
            break
        exact, classes = option_chain(view)
        for oc, sizes in ((exact, "gradients in their own bytes"), (dp_accounting(exact), "dp's sizes")):
            chain = oc.chain
            # Above the plan that keeps everything: x_0, every stage's largest xbar, two gradients,
            # the parameter gradients and the largest scratch.
            top = oc.x[0] + sum(max(o.xbar for o in opts) for opts in oc.options) + 2 * max(oc.y) \
                + sum(chain.gout) + max([o.btmp for opts in oc.options for o in opts] + [oc.btmp_loss]
                                        + list(oc.fwd_tmp)) + 1
            program = solve_program(oc, top)
            row = program.value[0, chain.length]
            finite = np.flatnonzero(np.isfinite(row))
            if not len(finite):
                continue
            changes = [int(m) for m in finite if m == finite[0] or row[m] != row[m - 1]]
            lowered = _search(graph, view, oc, program, changes, budget)
            least = min(least, min(peak for _, peak, _ in lowered.values()))
            fits = [item for item in lowered.values() if item[1] <= budget]
            if fits:
                cost, peak, schedule = min(fits, key=lambda item: (item[0], item[1]))
                if best is None or (cost, peak) < (best.cost, best.peak):
                    best = _Plan(cost, peak, schedule,
                                 f"the block program's plan ({view.length} stages in {len(set(classes))} block "
                                 f"classes, {sum(len(o) for o in oc.options)} options, {sizes}, "
                                 f"{program.levels} memory levels)")
        notes.append(f"view {number}: {view.length} stages")
    return best, int(least) if math.isfinite(least) else None, notes


def _search(graph, view: ChainView, oc: OptionChain, program: Program, changes: list[int], budget: int) -> dict:
    """The plans at the levels ``changes`` (where the optimum changes, dearer upwards) lowered and
    simulated, as ``index -> (cost, peak, schedule)``: the least-memory plan (its peak is this
    view's least), a bisection on "fits the budget" over the levels (peaks mostly grow with the
    level), then the next :data:`SEARCH_ABOVE` plans above the one found (they do not always)."""
    lowered: dict[int, tuple] = {}

    def fitting(index: int) -> bool:
        if index not in lowered:
            sequence = program.sequence(changes[index])
            schedule = schedule_from_computes(graph, drop_redundant_computes(graph, lower(view, oc, sequence)))
            outcome = simulate(graph, schedule)
            if not outcome.valid:
                raise AssertionError(f"hierarchical: a lowered plan is invalid: {outcome.error}")
            lowered[index] = (outcome.compute_cost, outcome.peak_bytes, schedule)
        return lowered[index][1] <= budget

    if fitting(0):
        low, high = 0, len(changes) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if fitting(middle):
                low = middle
            else:
                high = middle - 1
        for index in range(low + 1, min(len(changes), low + 1 + SEARCH_ABOVE)):
            fitting(index)
    return lowered


def _fits(graph, computes_positions, costs, budget: int) -> _Plan | None:
    nodes = drop_redundant_computes(graph, [costs.order[v] for v in computes_positions])
    try:
        schedule = schedule_from_computes(graph, nodes)
    except ValueError:
        return None
    outcome = simulate(graph, schedule)
    if not outcome.valid or outcome.peak_bytes > budget:
        return None
    return _Plan(outcome.compute_cost, outcome.peak_bytes, schedule, "the order-free relaxation's solution, laid out")


def _bound(graph, budget: int, found: list[_Plan], clock: Clock, windows_first: bool
           ) -> tuple[float | None, list[_Plan], str]:
    """The order-free relaxation's bound (seconds; ``None`` when none came in time), the schedules
    laid out from its solutions within the budget, and a note naming the bound.

    Its LP first (a bound even where the MILP's root does not end). On models small enough for MIP starts, with ``windows_first`` (the block program's plan is
    cheaper than the other schedules: its menus bought something), the window search of
    solvers/orderfree/windows.py from it (:data:`WINDOWS_SHARE` of the time). Then the MILP
    started from the cheapest schedule so far (its dual bound, and its incumbent laid out), then
    the window search with what is left. Each search and the MILP run on a model of their own (a
    run cancelled at its time limit can leave a HiGHS instance stopping the next run at once:
    measured, a MILP after the windows returned in 1.7 s of its 26 s with no dual bound). The
    windows' restricted solves bound nothing: only the LP's and the MILP's bounds count."""
    from ..orderfree import OrderFreeModel, choose_milestones
    from ..orderfree.method import START_MAX_COLUMNS, schedule_point, start_from

    costs = node_costs(graph)
    seconds = Clock(clock.share(BOUND_SHARE))
    laid: list[_Plan] = []

    def cheapest() -> _Plan | None:
        """The cheapest schedule in hand; on a tie in cost, another method's before the block
        program's (on gpt2-12-module3 the plan costs what dp's schedule costs, and the MILP started
        from dp's found orderfree's +16.3% where, started from the plan, it did not)."""
        return min(found + laid, key=lambda p: (p.cost, p.source.startswith("the block program"), p.peak),
                   default=None)

    try:
        model = OrderFreeModel(costs, budget, choose_milestones(costs)).build(seconds)
        marks = model.marks
        small = len(model.integrality) <= START_MAX_COLUMNS  # as orderfree: no start on large models
        # The LP first, as orderfree: a bound even where the MILP's root does not end, and the MILP
        # then starts from its basis. Without it, on the 163-node GPT-2 graph, the MILP from dp's
        # schedule missed orderfree's +16.3% in 3 of 5 calls at a load average of 8-10.
        lp = model.solve(seconds.share(LP_SHARE), integral=False)
        if lp.infeasible:
            return math.inf, [], "the order-free relaxation is infeasible"
        if small and windows_first and cheapest() is not None and not lp.infeasible:
            laid += _windows(graph, model, cheapest(), costs, budget, Clock(seconds.share(WINDOWS_SHARE)),
                             schedule_point)
            log.debug("hierarchical: windows %s after %.1f s", cheapest().cost, clock.elapsed())
            model = OrderFreeModel(costs, budget, marks).build(seconds)
        if small and cheapest() is not None:
            start_from(model, [(kind, costs.index[v]) for kind, v in cheapest().schedule])
        first = model.solve(seconds.share(FIRST_SOLVE_SHARE))
        log.debug("hierarchical: MILP bound %s objective %s after %.1f s", first.bound, first.objective, clock.elapsed())
    except (SolverTimeout, SolverUnavailable) as error:
        return None, laid, str(error)
    if first.infeasible:
        return math.inf, [], "the order-free relaxation is infeasible"
    if first.bound is None and lp.bound is None and not seconds.expired():
        try:
            lp = model.solve(seconds.left(), integral=False)
        except (SolverTimeout, SolverUnavailable):
            pass
    bounds = [b for b in (lp.bound, first.bound) if b is not None and math.isfinite(b)]
    for computes in first.layouts:
        plan = _fits(graph, computes, costs, budget)
        if plan is not None:
            laid.append(plan)
    if small and cheapest() is not None and not seconds.expired():
        try:
            fresh = OrderFreeModel(costs, budget, marks).build(seconds)
        except SolverTimeout:
            fresh = None
        if fresh is not None:
            laid += _windows(graph, fresh, cheapest(), costs, budget, seconds, schedule_point)
        log.debug("hierarchical: windows %s after %.1f s", cheapest().cost, clock.elapsed())
    note = f"the order-free relaxation's bound ({len(model.marks)} milestones)"
    return (max(bounds) if bounds else None), laid, note


def _windows(graph, model, start: _Plan, costs, budget: int, clock: Clock, schedule_point) -> list[_Plan]:
    """Passes of the window search (solvers/orderfree/windows.py) from ``start``'s point in the
    model, while a pass finds a cheaper laid-out schedule and ``clock`` has time."""
    from ..orderfree.model import Relaxation
    from ..orderfree.windows import improve_by_windows

    point = schedule_point(model, [(kind, costs.index[v]) for kind, v in start.schedule])
    if point is None:
        return []
    values = np.zeros(len(model.integrality))
    for column, value in point.items():
        values[column] = value
    objective = float(np.dot(model.highs.getLp().col_cost_, values))
    incumbent = Relaxation(None, values=list(values), objective=objective)
    found: list[_Plan] = []
    while not clock.expired():
        improved = improve_by_windows(model, incumbent, clock, lambda r: _fits_any(graph, r, costs, budget))
        if not improved:
            break
        found += improved
        best = min(improved, key=lambda p: (p.cost, p.peak))
        point = schedule_point(model, [(kind, costs.index[v]) for kind, v in best.schedule])
        if point is None:
            break
        values = np.zeros(len(model.integrality))
        for column, value in point.items():
            values[column] = value
        incumbent = Relaxation(None, values=list(values), objective=float(np.dot(model.highs.getLp().col_cost_, values)))
    return found


def _fits_any(graph, result, costs, budget: int) -> _Plan | None:
    plans = [p for p in (_fits(graph, c, costs, budget) for c in result.layouts) if p is not None]
    if not plans:
        return None
    best = min(plans, key=lambda p: (p.cost, p.peak))
    return _Plan(best.cost, best.peak, best.schedule, "the window search's solution, laid out")


def solve_hierarchical(graph, budget: int, time_limit: float | None = None, bound: bool = True,
                       starts: list | None = None) -> Schedule:
    """The ``hierarchical`` method (module docstring). ``bound=False`` skips the order-free
    relaxation (the plan alone, status ``feasible`` against the bound of computing everything
    once). ``starts``: other schedules of ``graph`` (``auto`` passes dp's and chen-greedy's) that
    the relaxation may start from and that are returned when cheapest; without them dp's own
    schedule is computed where dp is quick. Raises :class:`Infeasible` (``min_budget``: the least lowered peak of the plans
    and store-all's, which this method then meets) when no plan fits."""
    clock = Clock(time_limit_or_default(time_limit))
    store_all = store_all_schedule(graph)
    outcome = simulate(graph, store_all)
    once = outcome.compute_cost
    if outcome.peak_bytes <= budget:
        return store_all.with_info(method=METHOD, status=OPTIMAL, gap=0.0, lower_bound=once,
                                   message="hierarchical: store-all fits the budget")
    started = time.perf_counter()
    plan, least, _ = _plans(graph, budget, clock)
    planning = time.perf_counter() - started
    found = [plan] if plan is not None else []
    for other in starts or []:
        given = simulate(graph, other)
        if given.valid and given.peak_bytes <= budget:
            name = other.info.method or "a given"
            found.append(_Plan(given.compute_cost, given.peak_bytes, Schedule(other.steps), f"{name}'s schedule"))
    if not found:
        least = outcome.peak_bytes if least is None else min(least, outcome.peak_bytes)
        raise Infeasible(f"hierarchical: no block plan fits {budget} bytes; the least peak of its plans is "
                         f"{least} bytes", min_budget=least, method=METHOD)
    value, note = None, "computing every node once"
    if bound and starts is None and not clock.expired():
        quick = all(view.length <= QUICK_DP_STAGES for view in chain_views(graph))
        dp = schedule_from(graph, budget, "dp", clock.share(0.2)) if quick else None
        if dp is not None:
            found.append(_Plan(dp.info.compute_cost, dp.info.predicted_peak_bytes, dp, "dp's schedule"))
    if bound and not clock.expired():
        # The windows first where the block program's plan beats the other schedules (on
        # gpt2-12-module4 they took it from +14.7% to +13.8%); else the MILP first, as orderfree
        # (on gpt2-12-module3 the plan is dp's and the MILP from it needs ~40 s to find +16.3%).
        others = [p.cost for p in found if p is not plan]
        windows_first = plan is not None and (not others or plan.cost < min(others))
        value, laid, note = _bound(graph, budget, found, clock, windows_first)
        found += laid
        if value is not None and math.isinf(value):
            raise AssertionError("hierarchical: the order-free relaxation says no schedule fits, yet one does")
    best = min(found, key=lambda p: (p.cost, p.peak))
    lower = once if value is None else max(once, value)
    lower = min(lower, best.cost)
    gap = 0.0 if best.cost <= 0 else (best.cost - lower) / best.cost
    status = OPTIMAL if gap <= OPTIMALITY_TOLERANCE else FEASIBLE
    if status == OPTIMAL:
        lower, gap = best.cost, 0.0
    words = (f"{best.source} (planned in {planning:.1f} s); " +
             (f"proven optimal by {note}" if status == OPTIMAL else f"within {gap:.2%} of {note}"))
    return best.schedule.with_info(method=METHOD, status=status, gap=gap, lower_bound=lower, budget_bytes=budget,
                                   compute_cost=best.cost, predicted_peak_bytes=best.peak, message=words)
