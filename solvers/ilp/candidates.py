"""Checked schedules (warm starts, the heuristics', the caller's) and the report of the
schedule the method returns, made true over every order of computation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence

from ..clock import Clock
from ..errors import SolverTimeout
from ..api import schedule_from
from ..schedule import FEASIBLE, OPTIMAL, OPTIMAL_IN_ORDER, Schedule, SolverInfo
from ..simulate import simulate
from .model import CheckmateModel
from .values import _check_values, model_values

# Heuristic methods tried for a warm start (either may be missing or unfinished: others write
# them). Store-all is not among them: it is checked first, and when it fits no MILP is needed.
WARM_START_METHODS = ("chen-greedy", "dp")
# Each warm-start heuristic gets at most this share of the time left: dp plans on several chain
# views, and unbounded it took 4.7 s of a 30 s limit on the benchmark GPT-2's module graph.
WARM_START_SHARE = 0.15


@dataclass
class Candidate:
    """A checked schedule: valid, within the budget, with its cost in seconds."""

    schedule: Schedule
    cost: float
    peak: int
    source: str

def _candidate(graph, schedule: Schedule, budget: int | None, source: str, outcome=None) -> Candidate | None:
    """``schedule`` checked by the simulator (``outcome``: its result, when the caller has it)."""
    outcome = simulate(graph, schedule) if outcome is None else outcome
    if not outcome.valid or (budget is not None and outcome.peak_bytes > budget):
        return None
    return Candidate(schedule, outcome.compute_cost, outcome.peak_bytes, source)

def warm_start_candidates(graph, budget: int, deadline: Clock) -> list[Candidate]:
    """Schedules from the heuristic methods that fit ``budget``, cheapest first.

    A method that is infeasible, out of time or unavailable gives none
    (:func:`solvers.api.schedule_from`); any other failure of it is a bug and propagates.
    """
    found = []
    for method in WARM_START_METHODS:
        if deadline.expired():
            break
        schedule = schedule_from(graph, budget, method, deadline.share(WARM_START_SHARE))
        candidate = None if schedule is None else _candidate(graph, schedule, budget, method)
        if candidate is not None:
            found.append(candidate)
    return sorted(found, key=lambda c: c.cost)

def _given_candidates(graph, budget: int, schedules: Sequence[Schedule]) -> list[Candidate]:
    """The caller's warm starts that fit ``budget``; a schedule that is not a valid schedule of
    ``graph`` is the caller's mistake and is refused (a start over the budget is only unusable)."""
    found = []
    for index, schedule in enumerate(schedules):
        if not isinstance(schedule, Schedule):
            raise ValueError(f"warm_starts[{index}] is a {type(schedule).__name__}, not a Schedule")
        outcome = simulate(graph, schedule)
        if not outcome.valid:
            raise ValueError(f"warm_starts[{index}] is not a valid schedule of this graph: {outcome.error}")
        source = f"the given {schedule.info.method} schedule" if schedule.info.method else "a given schedule"
        candidate = _candidate(graph, schedule, budget, source, outcome)
        found += [candidate] if candidate is not None else []
    return found

def _best_start(model: CheckmateModel, graph, candidates: Sequence[Candidate]) -> tuple[dict | None, Candidate | None]:
    """The cheapest candidate the model can express, as variable values."""
    for candidate in candidates:
        values = model_values(model, graph, candidate.schedule)
        if values is not None and _check_values(model, values):
            return values, candidate
    return None, None

def _info(status: str, cost: float, lower_bound: float | None, message: str = "") -> SolverInfo:
    gap = None
    if lower_bound is not None:
        lower_bound = min(lower_bound, cost)
        gap = 0.0 if cost <= 0 else (cost - lower_bound) / cost
        gap = 0.0 if gap < 1e-9 else gap  # below the solvers' tolerances: rounding noise
    return SolverInfo(method="ilp", status=status, gap=gap, lower_bound=lower_bound, message=message)

def _finish(found: Candidate, budget: int, status: str, bound: float | None, message: str) -> Schedule:
    """The schedule with its report (``solve()`` fills in the same numbers when it is the caller)."""
    info = _info(status, found.cost, bound, message)
    return found.schedule.with_info(**{**info.__dict__, "budget_bytes": budget, "compute_cost": found.cost,
                                       "predicted_peak_bytes": found.peak})

def _proven(cost: float, bound: float | None) -> bool:
    """Whether a lower bound proves ``cost`` optimal, up to the LP solver's tolerance."""
    return bound is not None and cost - bound <= 1e-7 * max(abs(cost), 1e-9)

def _or_best_candidate(solve, candidates: Sequence[Candidate], budget: int) -> Schedule:
    """``solve()``, or, when the time limit passes before it has a schedule (the model may take
    longer to build than the limit allows), the cheapest candidate, which fits the budget."""
    try:
        return solve()
    except SolverTimeout as error:
        if not candidates:
            raise
        best = min(candidates, key=lambda c: c.cost)
        return _finish(best, budget, FEASIBLE, None, f"{error}; returning the cheapest start ({best.source})")

def _order_free(schedule: Schedule, bound: float) -> Schedule:
    """The schedule's report made true over every order of computation.

    The model's optimum and its bounds (MILP, LP) hold only in its fixed order of first
    computations; ``bound`` (:func:`solvers.bounds.cost_lower_bound`, seconds) holds in every order.
    So: ``optimal`` only where ``bound`` meets the cost; a schedule the model proved optimal is
    otherwise ``optimal-in-order``; ``lower_bound`` and ``gap`` are ``bound``'s, and the in-order
    gap goes into the message.
    """
    info = schedule.info
    cost = info.compute_cost
    if math.isinf(bound):  # no schedule fits, yet this one does: a bug in the bound
        raise AssertionError(f"ilp: the order-free cost bound says no schedule fits {info.budget_bytes} bytes")
    notes = []
    if _proven(cost, bound):
        status = OPTIMAL
    elif info.status == OPTIMAL:
        status = OPTIMAL_IN_ORDER
        notes.append("optimal in its order of first computations (Checkmate's model fixes that order; "
                     "a schedule in another order may be cheaper)")
    else:
        status = FEASIBLE
        if info.gap is not None:
            notes.append(f"gap {info.gap:.2%} in its order of first computations")
    lower = min(bound, cost)
    gap = 0.0 if cost <= 0 or status == OPTIMAL else (cost - lower) / cost
    message = "; ".join(notes + ([info.message] if info.message else []))
    return schedule.with_info(status=status, lower_bound=lower, gap=gap, message=message)
