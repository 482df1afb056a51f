"""The planner's search over granularities: the chain methods also plan every finer grouping.

A cost-graph node is atomic: a schedule holds or recomputes all of it. At a coarse grouping a
residual block is one node whose result is everything the block saves for its backward, so a
checkpoint of the block's output holds all of that (the benchmark's residual MLP at module:1: 11 MiB
per checkpoint, where ``checkpoint_sequential`` holds the block's 1 MiB output). The exact solvers
need the coarse graph, their time growing with its size; the chain methods plan an op-level graph of
a few hundred nodes in about a second. So when the granularity is the profiler's own choice, the
planner also runs the chain methods on every finer grouping of the same measurements and keeps the
cheapest schedule that fits; ``auto`` and store-all first try store-all on every grouping.

Budgets here are of the whole step (bytes): each grouping's schedule gets what is left after
:func:`~planner.footprint.held_besides_schedule`, which depends on the grouping (one saved RNG state
per random node).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import profiler
from solvers import Infeasible, Schedule, simulate, solve, total_cost
from solvers.auto import FAST_METHODS

from .footprint import held_besides_schedule

# Methods whose planning time stays near a second at op level (solvers/chain.py's view).
CHAIN_METHODS = ("dp", "chen-greedy", "chen-sqrtn", "revolve")
STORE_ALL = "store-all"


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
    return (solver,) if solver in (STORE_ALL, *CHAIN_METHODS) else ()  # store-all: for its minimum


def store_all_on_some_grouping(profile: profiler.Profile, step_budget: int) -> Solved | None:
    """Store-all on ``profile``'s grouping if it fits ``step_budget`` (bytes), else on the finer
    grouping where it peaks lowest, if that fits.

    A coarse node is freed only as a whole: the benchmark residual MLP's block nodes (module:1) keep
    every value the block saves until the last op of its backward, so store-all peaks at 325.6 MiB
    there against 318.5 MiB, eager's, on its finer groupings. Nothing recomputed is the cheapest
    schedule there is, so when one grouping fits it, no solver needs to run.
    """
    try:
        return solve_on(profile, step_budget, STORE_ALL, None)  # the usual case: no other grouping built
    except Infeasible:
        pass
    fitting = []
    for grouping in profile.finer():
        try:
            fitting.append(solve_on(grouping, step_budget, STORE_ALL, None))
        except Infeasible:
            continue
    best = min(fitting, key=lambda item: item.predicted_peak_bytes, default=None)
    return None if best is None else _on_finer(best, profile)


def noted(solved: Solved, note: str) -> Solved:
    """``solved`` with ``note`` added to its schedule's message, in parentheses."""
    message = solved.schedule.info.message
    return replace(solved, schedule=solved.schedule.with_info(message=f"{message} ({note})" if message else note))


def _on_finer(solved: Solved, profile: profiler.Profile) -> Solved:
    """``solved`` (on a finer grouping of ``profile``), its message saying so."""
    return noted(solved, f"planned on the {solved.profile.granularity} grouping; "
                         f"the profiler chose {profile.granularity}")


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
    grouping; the cheapest schedule within ``step_budget`` (bytes of the whole step) wins. With
    ``finer``, ``auto`` and store-all first look for a grouping where store-all fits.

    Raises what ``solve`` raises on ``profile``'s own graph (ValueError, the solver's errors) when
    no grouping gives a schedule; an :class:`Infeasible`'s ``min_budget`` (whole-step bytes) is then
    the least over the groupings tried. A finer grouping that a method refuses (ValueError) is skipped.
    """
    if finer and solver in ("auto", STORE_ALL):
        nothing_recomputed = store_all_on_some_grouping(profile, step_budget)
        if nothing_recomputed is not None:
            return nothing_recomputed
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
            found.append(_on_finer(solved, profile))
    if not found:
        assert failure is not None
        least = min(minimums, default=None)
        if least is not None and (failure.min_budget is None or least < failure.min_budget):
            raise Infeasible(f"{failure} (over all groupings the least reached is {least} bytes)",
                             min_budget=least, method=failure.method)
        raise failure
    return min(found, key=lambda item: (item.schedule.info.compute_cost, item.predicted_peak_bytes))
