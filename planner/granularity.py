"""The planner's search over granularities: the chain methods also plan every finer grouping.

A cost-graph node is atomic: a schedule holds or recomputes all of it. At a coarse grouping a
residual block is one node whose result is everything the block saves for its backward, so a
checkpoint of the block's output holds all of that (the benchmark's residual MLP at module:1: 11 MiB
per checkpoint, where ``checkpoint_sequential`` holds the block's 1 MiB output). The exact solvers
need the coarse graph, their time growing with its size; the chain methods plan an op-level graph of
a few hundred nodes in about a second. So when the granularity is the profiler's own choice, the
planner also runs the chain methods on every finer grouping of the same measurements and keeps the
cheapest schedule that fits.

Budgets here are of the whole step (bytes): each grouping's schedule gets what is left after
:func:`~planner.footprint.held_besides_schedule`, which depends on the grouping (one saved RNG state
per random node).
"""

from __future__ import annotations

from dataclasses import dataclass

import profiler
from solvers import Infeasible, Schedule, simulate, solve, total_cost
from solvers.auto import FAST_METHODS

from .footprint import held_besides_schedule

# Methods whose planning time stays near a second at op level (solvers/chain.py's view).
CHAIN_METHODS = ("dp", "chen-greedy", "chen-sqrtn", "revolve")


@dataclass(frozen=True)
class Solved:
    """The schedule chosen, the profile (grouping) it schedules, and the step's predicted peak (bytes)."""

    profile: profiler.Profile
    schedule: Schedule
    predicted_peak_bytes: int


def methods_on_finer_groupings(solver: str) -> tuple[str, ...]:
    """What runs on the finer groupings: the chain methods ``auto`` uses, or the chain method asked for."""
    if solver == "auto":
        return FAST_METHODS
    return (solver,) if solver in CHAIN_METHODS else ()


def solve_on(profile: profiler.Profile, step_budget: int, method: str, time_limit: float | None) -> Solved:
    """``method`` on one grouping, for a whole-step budget. Raises :class:`Infeasible` with
    ``min_budget`` in whole-step bytes, and what ``solve`` raises."""
    graph = profile.graph
    held = held_besides_schedule(graph)
    try:
        schedule = solve(graph, max(step_budget - held, 0), method=method, time_limit=time_limit)
    except Infeasible as error:
        least = None if error.min_budget is None else held + int(error.min_budget)
        raise Infeasible(str(error), min_budget=least, method=error.method or method) from None
    peak = held + simulate(graph, schedule).peak_bytes
    if peak > step_budget:  # only when the budget is below what the step holds anyway
        raise Infeasible(f"{method}: the step needs {peak} bytes, over the budget of {step_budget} bytes",
                         min_budget=peak, method=method)
    return Solved(profile, schedule, peak)


def solve_over_groupings(profile: profiler.Profile, step_budget: int, solver: str, time_limit: float | None,
                         finer: bool = True) -> Solved:
    """``solver`` on ``profile``'s graph and, when ``finer``, its chain methods on every finer
    grouping; the cheapest schedule within ``step_budget`` (bytes of the whole step) wins.

    Raises what ``solve`` raises on ``profile``'s own graph (ValueError, the solver's errors) when
    no grouping gives a schedule; an :class:`Infeasible`'s ``min_budget`` (whole-step bytes) is then
    the least over the groupings tried. A finer grouping that a method refuses (ValueError) is skipped.
    """
    found: list[Solved] = []
    failure: Infeasible | None = None
    minimums: list[int] = []
    try:
        found.append(solve_on(profile, step_budget, solver, time_limit))
        if found[0].schedule.info.compute_cost <= total_cost(profile.graph) * (1 + 1e-9):
            return found[0]  # nothing recomputed: no grouping can be cheaper
    except Infeasible as error:
        failure = error
        if error.min_budget is not None:
            minimums.append(int(error.min_budget))
    methods = methods_on_finer_groupings(solver) if finer else ()
    for grouping in profile.finer() if methods else []:
        for method in methods:
            try:
                solved = solve_on(grouping, step_budget, method, time_limit)
            except Infeasible as error:
                if error.min_budget is not None:
                    minimums.append(int(error.min_budget))
                continue
            except ValueError:
                continue
            info = solved.schedule.info
            found.append(Solved(grouping, solved.schedule.with_info(
                message=f"{info.message} (planned on the {grouping.granularity} grouping; "
                        f"the profiler chose {profile.granularity})",
            ), solved.predicted_peak_bytes))
    if not found:
        assert failure is not None
        least = min(minimums, default=None)
        if least is not None and (failure.min_budget is None or least < failure.min_budget):
            raise Infeasible(f"{failure} (over all groupings the least reached is {least} bytes)",
                             min_budget=least, method=failure.method)
        raise failure
    return min(found, key=lambda item: (item.schedule.info.compute_cost, item.predicted_peak_bytes))
