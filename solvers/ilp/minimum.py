"""The least budget Checkmate's model meets, and the verdicts built on it: ``Infeasible`` with a
proven minimum, or ``SolverTimeout`` when the time limit passes before it is proven."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..clock import Clock
from ..errors import Infeasible, SolverTimeout
from ..graph import NodeCosts
from ..schedule import FEASIBLE, Schedule
from .backends import run_backend
from .candidates import Candidate, _candidate, _finish
from .model import CheckmateModel, Scales, build_model
from .rounding import _roundings
from .values import _check_values, compute_order, least_recomputation, model_values, schedule_of_order


def model_lower_bound(costs: NodeCosts) -> int:
    """A peak no schedule with the fixed first-computation order can go below (bytes).

    Computing t needs its inputs held, and every pinned node computed before it; the last
    computation (node n-1) also needs every other output held.
    """
    bound = 0
    pinned_before = 0
    for t in range(costs.n):
        needed = set(costs.preds[t])
        if t == costs.n - 1:
            needed |= {i for i in range(t) if costs.output[i]}
        during = costs.mem[t] + costs.workspace[t] + sum(costs.mem[i] for i in needed)
        during += pinned_before - sum(costs.mem[i] for i in needed if costs.pinned[i])
        bound = max(bound, during)
        if costs.pinned[t]:
            pinned_before += costs.mem[t]
    return bound

@dataclass
class MinimumBudget:
    """The smallest peak (bytes) found for the model, the schedule that has it, and whether no
    smaller one exists (proven by a bound)."""

    peak: int
    schedule: Candidate
    proven: bool


def _least_without_a_solver(graph, costs: NodeCosts) -> Candidate:
    """The lower-peak of two schedules the model expresses: store-all, and "hold nothing across
    stages" (every stage recomputes what it needs from scratch)."""
    nothing_held = [{i for i in range(t) if costs.pinned[i]} for t in range(costs.n)]
    nothing_held.append({i for i in range(costs.n) if costs.output[i]})
    orders = [list(range(costs.n)), least_recomputation(costs, nothing_held)]
    found = [_candidate(graph, schedule_of_order(graph, costs, order), None, "") for order in orders if order]
    return min((c for c in found if c is not None), key=lambda c: c.peak)


def _least_from_the_lp(model: CheckmateModel, graph, backend: str, deadline: Clock, threads: int | None,
                       samples: int, seed: int, best: Candidate, lower: int) -> tuple[Candidate, int]:
    """The LP that minimises the peak: its value raises ``lower`` (bytes) when solved to
    optimality, and its roundings may lower ``best``. Returns both."""
    costs, scales = model.costs, model.scales
    relaxed = run_backend(model, backend, deadline.left(), threads, relax=True)
    if relaxed.bound is not None:  # weak duality from the LP's duals (HiGHS), or its optimum (CBC)
        bound = relaxed.bound * scales.mem_unit
        lower = max(lower, math.ceil(bound - max(1e-6, 1e-9 * bound)))
    if relaxed.has_solution:
        for _source, held in _roundings(model, relaxed.values, samples, random.Random(seed)):
            order = least_recomputation(costs, held)
            candidate = None if order is None else _candidate(graph, schedule_of_order(graph, costs, order), None, "")
            if candidate is not None and candidate.peak < best.peak:
                best = candidate
    return best, lower


def _least_from_the_milp(model: CheckmateModel, graph, backend: str, seconds: float | None, threads: int | None,
                         best: Candidate, stop_at: int | None) -> tuple[Candidate, bool]:
    """The MILP that minimises the peak, warm-started with ``best``; stopped at the first schedule
    within ``stop_at`` bytes when given. Returns the lower-peak schedule and whether it is proven."""
    costs, scales = model.costs, model.scales
    warm = model_values(model, graph, best.schedule)
    warm = warm if warm is not None and _check_values(model, warm) else None
    # An absolute gap of half a byte: the peak is a whole number of bytes.
    target = None if stop_at is None else stop_at / scales.mem_unit
    outcome = run_backend(model, backend, seconds, threads, warm, gap_abs=0.5 / scales.mem_unit, target=target)
    if outcome.has_solution:
        order = compute_order(model, outcome.values)
        candidate = _candidate(graph, schedule_of_order(graph, costs, order), None, "")
        if candidate is not None and candidate.peak < best.peak:
            best = candidate
    return best, outcome.optimal


def minimum_budget(graph, costs: NodeCosts, backend: str, time_limit: float | None, threads: int | None,
                   exact: bool = True, samples: int = 16, seed: int = 0, stop_at: int | None = None) -> MinimumBudget:
    """The smallest budget (bytes) the model can meet.

    Cheap candidates first: store-all, "hold nothing across stages" and roundings of the LP that
    minimises the peak; the counting bound and that LP's value bound it from below. With
    ``exact``, the MILP minimising the peak (same constraints, warm-started with the best
    candidate) closes the gap within ``time_limit``. Whatever is returned is a budget the model
    meets; ``proven`` says whether it is the least. With ``stop_at`` (bytes) the search stops at
    the first schedule that peaks at most that: a feasibility search for a tight budget. Raises
    :class:`SolverTimeout` when the limit passes while the model is built.
    """
    deadline = Clock(time_limit)
    lower = model_lower_bound(costs)
    best = _least_without_a_solver(graph, costs)
    if best.peak <= lower:
        return MinimumBudget(best.peak, best, True)
    model = build_model(costs, None, Scales.of(costs), peak_bounds=(lower, best.peak), clock=deadline)
    best, lower = _least_from_the_lp(model, graph, backend, deadline, threads, samples, seed, best, lower)
    left = deadline.left()
    done = stop_at is not None and best.peak <= stop_at
    if best.peak <= lower or done or not exact or (left is not None and left <= 0):
        return MinimumBudget(best.peak, best, best.peak <= lower)
    best, optimal = _least_from_the_milp(model, graph, backend, left, threads, best, stop_at)
    return MinimumBudget(best.peak, best, optimal or best.peak <= lower)


def _no_schedule(graph, costs, budget, backend, deadline: Clock, threads, why: str, exact: bool) -> Schedule:
    """Raise :class:`Infeasible` with the model's minimum budget in it (``why``: the proof that
    ``budget`` is out of the model's reach).

    Should the search for the minimum find a schedule within ``budget`` after all (the only way is
    a solver tolerance misjudging the budget rows by a few bytes), that schedule is returned. When
    the time limit passes before the exact minimum is proven, :class:`SolverTimeout` is raised
    instead: an ``Infeasible`` would report an unproven minimum as the least budget (seen:
    "minimum 194 MiB" after 1 s, where 122 MiB is met with 120 s). With ``exact=False``
    (lp-rounding) the minimum is the least that method's search reaches, said to be unproven.
    """
    try:
        least = minimum_budget(graph, costs, backend, deadline.left(), threads, exact=exact)
    except SolverTimeout:  # the limit passed while building the model that minimises the peak
        least = None
    if least is not None and least.peak <= budget:
        found = least.schedule
        return _finish(found, budget, FEASIBLE, None, f"{why}, but a schedule that minimises the peak fits")
    if least is None or (exact and not least.proven):
        found = "" if least is None else f" (the least peak found is {least.peak} bytes, not proven minimal)"
        raise SolverTimeout(f"ilp: {why}, so {budget} bytes is out of reach of Checkmate's model, but its least "
                            f"budget was not proven within the time limit of {deadline.limit:g} s{found}",
                            method="ilp")
    qualifier = "" if least.proven else " (not proven minimal: a budget the model can meet)"
    raise Infeasible(f"{why}; Checkmate's model (fixed first-computation order) needs at least {least.peak} bytes"
                     f"{qualifier}", min_budget=least.peak, method="ilp")

def _out_of_time(budget: int, deadline: Clock) -> SolverTimeout:
    return SolverTimeout(f"ilp: no schedule within {budget} bytes found in the time limit ({deadline.limit:g} s); "
                         "the budget is neither met nor proven infeasible", method="ilp")

def _low_memory_start(graph, costs, budget, backend, deadline, threads) -> list[Candidate]:
    """The least-memory schedule that :func:`minimum_budget` finds without a MILP, if it fits."""
    least = minimum_budget(graph, costs, backend, deadline.left(), threads, exact=False)
    if least.peak > budget:
        return []
    return [Candidate(least.schedule.schedule, least.schedule.cost, least.peak, "a least-memory schedule")]
