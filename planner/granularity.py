"""The planner's search over granularities: the chain methods also plan every finer grouping.

A cost-graph node is atomic: a schedule holds or recomputes all of it. At a coarse grouping a
residual block is one node whose result is everything the block saves for its backward, so a
checkpoint of the block's output holds all of that (the benchmark's residual MLP at module:1: 11 MiB
per checkpoint, where ``checkpoint_sequential`` holds the block's 1 MiB output). The exact solvers
need the coarse graph, their time growing with its size; the chain methods plan an op-level graph of
a few hundred nodes in about a second. So when the granularity is the profiler's own choice, the
planner also runs the chain methods on every finer grouping of the same measurements and keeps the
cheapest schedule that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import profiler
from solvers import Infeasible, Schedule, solve
from solvers.auto import FAST_METHODS

# Methods whose planning time stays near a second at op level (solvers/chain.py's view).
CHAIN_METHODS = ("dp", "chen-greedy", "chen-sqrtn", "revolve")


@dataclass(frozen=True)
class Solved:
    """The schedule chosen and the profile (grouping) it schedules."""

    profile: profiler.Profile
    schedule: Schedule


def methods_on_finer_groupings(solver: str) -> tuple[str, ...]:
    """What runs on the finer groupings: the chain methods ``auto`` uses, or the chain method asked for."""
    if solver == "auto":
        return FAST_METHODS
    return (solver,) if solver in CHAIN_METHODS else ()


def solve_over_groupings(profile: profiler.Profile, budget: int, solver: str, time_limit: float | None) -> Solved:
    """``solver`` on ``profile``'s graph, and its chain methods on every finer grouping; the cheapest
    schedule within ``budget`` (bytes of the schedule's graph, parameters excluded) wins.

    Raises what ``solve`` raises on ``profile``'s own graph (ValueError, the solver's errors) when
    no grouping gives a schedule; an :class:`Infeasible`'s ``min_budget`` is then the least over the
    groupings tried. A finer grouping that a method refuses (ValueError) is skipped.
    """
    found: list[Solved] = []
    failure: Exception | None = None
    minimums: list[int] = []
    try:
        found.append(Solved(profile, solve(profile.graph, budget, method=solver, time_limit=time_limit)))
    except Infeasible as error:
        failure = error
        if error.min_budget is not None:
            minimums.append(int(error.min_budget))
    methods = methods_on_finer_groupings(solver)
    for finer in profile.finer() if methods else []:
        for method in methods:
            try:
                schedule = solve(finer.graph, budget, method=method, time_limit=time_limit)
            except Infeasible as error:
                if error.min_budget is not None:
                    minimums.append(int(error.min_budget))
                continue
            except ValueError:
                continue
            found.append(Solved(finer, schedule.with_info(
                message=f"{schedule.info.message} (planned on the {finer.granularity} grouping; "
                        f"the profiler chose {profile.granularity})",
            )))
    if not found:
        assert failure is not None
        least = min(minimums, default=None)
        if least is not None and (failure.min_budget is None or least < failure.min_budget):
            raise Infeasible(f"{failure} (over all groupings the least reached is {least} bytes)",
                             min_budget=least, method=failure.method)
        raise failure
    return min(found, key=lambda item: (item.schedule.info.compute_cost, item.schedule.info.predicted_peak_bytes))
