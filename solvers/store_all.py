"""``store-all``: no recomputation. Every node once, in topological order, freed after its last use.

This is the un-checkpointed step: its peak is the memory the model needs without a plan, and its
cost is the sum of all node costs.
"""

from __future__ import annotations

from .errors import Infeasible
from .graph import topological_order
from .liveness import schedule_from_computes
from .schedule import Schedule
from .simulate import simulate


def store_all_schedule(graph) -> Schedule:
    """The store-all schedule, whatever its peak."""
    return schedule_from_computes(graph, topological_order(graph))


def solve_store_all(graph, budget: int, time_limit: float | None = None) -> Schedule:
    schedule = store_all_schedule(graph)
    peak = simulate(graph, schedule).peak_bytes
    if peak > budget:
        raise Infeasible(
            f"store-all needs {peak} bytes, more than the budget of {budget} bytes", min_budget=peak, method="store-all"
        )
    # No recomputation: its cost is the sum of all node costs, the lower bound of every schedule.
    return schedule.with_info(status="optimal", gap=0.0, lower_bound=simulate(graph, schedule).compute_cost)
