"""``solve_orderfree``: the relaxation's optimum laid out, repaired, checked, with fallbacks."""

from __future__ import annotations

from ..clock import Clock
from ..errors import Infeasible, SolverTimeout
from ..graph import NodeCosts, node_costs
from ..liveness import drop_redundant_computes, schedule_from_computes
from ..options import schedule_from, time_limit_or_default
from ..schedule import FEASIBLE, OPTIMAL, Schedule
from ..simulate import simulate
from .model import METHOD, OrderFreeModel, Relaxation, choose_milestones

# Re-solves when the laid-out optimum overshoots the budget: first other solutions at the budget
# (each excluded by a cut once tried), then solutions at smaller budgets.
REPAIR_ATTEMPTS = 6
NO_GOOD_CUTS = 2
# A schedule whose cost is within this relative distance of the bound is reported optimal.
OPTIMALITY_TOLERANCE = 1e-7
# Graphs this small fall back on the exhaustive search (solvers/exhaustive.py) where no layout fits.
EXACT_FALLBACK_NODES = 20
# Share of the time left given to the first MILP solve (the rest: repairs and heuristics).
FIRST_SOLVE_SHARE = 0.7


def _checked(graph, costs: NodeCosts, computes: list[int], budget: int):
    """(schedule, simulation) of a compute order, when it is valid and within the budget."""
    nodes = drop_redundant_computes(graph, [costs.order[v] for v in computes])
    schedule = schedule_from_computes(graph, nodes)
    outcome = simulate(graph, schedule)
    return (schedule, outcome) if outcome.valid else (None, outcome)


def solve_orderfree(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """The ``orderfree`` method (module docstring): the relaxation's optimum laid out, repaired at
    smaller budgets when it overshoots, against the fast heuristics; ``optimal`` only when the cost
    meets the bound. ``time_limit`` (seconds, default :data:`solvers.options.DEFAULT_TIME_LIMIT`)
    covers building, solving, repairs and heuristics. Raises :class:`Infeasible` when the relaxation
    proves no schedule fits (``min_budget``: the least budget the fallbacks meet, which this method
    then meets) and :class:`SolverTimeout` when time runs out with no schedule."""
    clock = Clock(time_limit_or_default(time_limit))
    costs = node_costs(graph)
    base = float(sum(costs.cost))
    order = list(range(costs.n))
    store_all, outcome = _checked(graph, costs, order, budget)
    if outcome.peak_bytes <= budget:
        return store_all.with_info(method=METHOD, status=OPTIMAL, gap=0.0, lower_bound=base,
                                   message="store-all fits the budget")
    model = OrderFreeModel(costs, budget, choose_milestones(costs)).build(clock)
    first = model.solve(clock.share(FIRST_SOLVE_SHARE))
    bound = base if first.bound is None else max(base, first.bound)
    found, notes = [], []  # (cost, peak, schedule, source)
    if first.infeasible:
        least = _fallback_minimum(graph, costs, outcome.peak_bytes, clock)
        raise Infeasible(f"orderfree: the order-free relaxation proves that no schedule fits in {budget} bytes; "
                         f"the least budget this method meets is {least} bytes", min_budget=least, method=METHOD)
    laid = _laid_out(graph, costs, model, first, budget, clock)
    if laid is not None:
        found.append(laid)
    if not (found and found[0][0] - bound <= OPTIMALITY_TOLERANCE * max(found[0][0], 1e-12)):
        found += _fallbacks(graph, costs, budget, clock)
    if not found:
        least = None if clock.expired() else _fallback_minimum(graph, costs, outcome.peak_bytes, clock)
        if least is None or least <= budget:
            raise SolverTimeout(f"orderfree: no schedule within {budget} bytes found in {clock.limit:g} s",
                                method=METHOD)
        raise Infeasible(f"orderfree: no laid-out solution of the relaxation fits {budget} bytes and the "
                         f"fallbacks found none; the least budget this method meets is {least} bytes",
                         min_budget=least, method=METHOD)
    cost, peak, schedule, source = min(found, key=lambda item: (item[0], item[1]))
    lower = min(bound, cost)
    gap = 0.0 if cost <= 0 else (cost - lower) / cost
    status = OPTIMAL if gap <= OPTIMALITY_TOLERANCE else FEASIBLE
    if not first.proven:
        notes.append("time limit reached before the relaxation was solved: its dual bound stands")
    notes.insert(0, f"{source}; bound of the order-free relaxation with {len(model.marks)} milestones")
    return schedule.with_info(method=METHOD, status=status, gap=0.0 if status == OPTIMAL else gap,
                              lower_bound=lower, budget_bytes=budget, compute_cost=cost,
                              predicted_peak_bytes=peak, message="; ".join(notes))


def _laid_out(graph, costs: NodeCosts, model: OrderFreeModel, first: Relaxation, budget: int, clock: Clock):
    """(cost, peak, schedule, source) of the first layout within ``budget``: the optimum's; else,
    at the same budget, another solution (a cut excludes each one tried, up to ``NO_GOOD_CUTS``);
    else solutions at the budget less the last overshoot (halved while that is infeasible). At most
    ``REPAIR_ATTEMPTS`` re-solves. ``None`` when none fits."""
    result, target, cuts, reduction = first, budget, 0, 0
    for attempt in range(REPAIR_ATTEMPTS + 1):
        if result.layouts:
            laid = [_checked(graph, costs, computes, budget) for computes in result.layouts]
            schedule, sim = min(laid, key=lambda pair: (pair[0] is None, pair[1].peak_bytes))
            if schedule is not None and sim.peak_bytes <= budget:
                source = "its laid-out optimum" if attempt == 0 else (
                    f"the relaxation's solution at {target} bytes, laid out" if target < budget
                    else f"its laid-out solution after {cuts} cut(s)")
                return sim.compute_cost, sim.peak_bytes, schedule, source
            reduction = max(1, sim.peak_bytes - budget)
        elif target == budget or reduction <= 1:
            return None  # out of time, or infeasible at the budget (all cuts) or one byte below it
        else:
            reduction //= 2  # infeasible that far below the budget: ask for less
        if attempt == REPAIR_ATTEMPTS or clock.expired():
            return None
        if result.layouts and cuts < NO_GOOD_CUTS:
            model.exclude(result.chosen)
            cuts += 1
        else:
            target = budget - reduction
            model.set_budget(target)
        result = model.solve(clock.share(0.5))
    return None


def _fallbacks(graph, costs: NodeCosts, budget: int, clock: Clock) -> list:
    """(cost, peak, schedule, source) of the fast heuristics that fit, and on graphs of at most
    ``EXACT_FALLBACK_NODES`` nodes the exhaustive search (a share of the time): where no layout
    fits (tight budgets: the order between milestones decides the peak) they still give one."""
    found = []
    for method in ("dp", "chen-greedy") + (("exhaustive",) if costs.n <= EXACT_FALLBACK_NODES else ()):
        if clock.expired():
            break
        other = schedule_from(graph, budget, method, clock.share(0.5))
        if other is not None:
            found.append((other.info.compute_cost, other.info.predicted_peak_bytes, other, method))
    return found


def _fallback_minimum(graph, costs: NodeCosts, store_all_peak: int, clock: Clock) -> int | None:
    """The least budget the fallbacks meet (the exhaustive search's minimum peak on small graphs),
    which this method then meets; ``None`` when the search runs out of time."""
    from .. import exhaustive
    from ..api import method_function

    if costs.n <= EXACT_FALLBACK_NODES:
        try:
            return exhaustive.min_peak(graph, clock.left())
        except TimeoutError:
            return None
    least = store_all_peak
    for method in ("dp", "chen-greedy"):
        try:
            method_function(method)(graph, 0)
        except Infeasible as error:
            if error.min_budget is not None:
                least = min(least, int(error.min_budget))
    return least
