"""``solver="auto"``: pick a method by the graph's shape and size, and say why."""

from __future__ import annotations

from .simulate import simulate
from .store_all import store_all_schedule

# CP-SAT proves optimality over all schedules in seconds to a minute up to about this many nodes.
EXACT_MAX_NODES = 250


def choose_method(graph, budget: int, time_limit: float | None) -> tuple[str, str]:
    """Return (method, reason)."""
    n = graph.number_of_nodes()
    peak = simulate(graph, store_all_schedule(graph)).peak_bytes
    if peak <= budget:
        return "store-all", "auto chose store-all: the step fits the budget without recomputation"
    if n <= EXACT_MAX_NODES:
        return "cpsat", (
            f"auto chose cpsat: {n} nodes is small enough to search all schedules for the optimum"
        )
    from .chain import chain_view

    view = chain_view(graph)
    if view.length >= 4:
        return "dp", (
            f"auto chose dp: {n} nodes is too many for an exact search, and the graph is a chain of "
            f"{view.length} stages, on which the heterogeneous-chain DP is optimal"
        )
    return "chen-greedy", (
        f"auto chose chen-greedy: {n} nodes and only {view.length} chain stages; neither exact search nor the chain DP applies well"
    )
