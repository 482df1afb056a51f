"""``solver="auto"``: the best of the methods that fit the graph, and why.

- If the un-checkpointed step fits, store-all: nothing to recompute, nothing to search.
- Otherwise the fast planners on the chain view (``dp``, optimal in the chain model, and
  ``chen-greedy``), then, on graphs small enough for an exact search, ``cpsat`` under a time limit
  (default :data:`DEFAULT_EXACT_SECONDS`), hinted with their schedules. The cheapest schedule wins;
  when ``cpsat`` proves it optimal, the plan says so, and otherwise gives the proven gap.
"""

from __future__ import annotations

from .errors import Infeasible, SolverUnavailable
from .schedule import Schedule
from .simulate import simulate
from .store_all import store_all_schedule

# CP-SAT searches all schedules. Up to about this many nodes, hinted with the fast methods' schedules,
# it improves on them within a minute on two cores: in docs/solvers-benchmark.md (60 s each) it is
# the cheapest method on all four profiled graphs (161-235 nodes). It seldom proves optimality there:
# it does on the 21-node chain and the skip graphs of up to 101 nodes, but on the chains of 51-201
# nodes and the GPT-2 and MLP graphs its proven gap stays at 8.6-14.2% (1.1% on the U-Net).
EXACT_MAX_NODES = 250
DEFAULT_EXACT_SECONDS = 30.0
FAST_METHODS = ("dp", "chen-greedy")


def solve_auto(graph, budget: int, time_limit: float | None = None) -> Schedule:
    from .api import solve  # the checked entry point; imported here to avoid a cycle

    store_all = store_all_schedule(graph)
    if simulate(graph, store_all).peak_bytes <= budget:
        return store_all.with_info(
            method="store-all", status="optimal", gap=0.0,
            message="auto: store-all, the step fits the budget without recomputation",
        )
    tried: list[tuple[str, Schedule | None]] = []
    minimums: list[int] = []
    methods = list(FAST_METHODS)
    if graph.number_of_nodes() <= EXACT_MAX_NODES:
        methods.append("cpsat")
    for method in methods:
        limit = (time_limit or DEFAULT_EXACT_SECONDS) if method == "cpsat" else time_limit
        try:
            tried.append((method, solve(graph, budget, method=method, time_limit=limit)))
        except Infeasible as error:
            tried.append((method, None))
            if error.min_budget is not None:
                minimums.append(int(error.min_budget))
        except (TimeoutError, SolverUnavailable):
            tried.append((method, None))
    found = [(m, s) for m, s in tried if s is not None]
    names = ", ".join(m for m, _ in tried)
    if not found:
        minimum = min(minimums) if minimums else None
        raise Infeasible(
            f"auto ({names}): no schedule fits in {budget} bytes"
            + (f"; the least any of them reaches is {minimum} bytes" if minimum is not None else ""),
            min_budget=minimum,
            method="auto",
        )
    method, best = min(found, key=lambda item: (item[1].info.compute_cost, item[1].info.predicted_peak_bytes))
    others = ", ".join(f"{m} {s.info.compute_cost:.4g} s" for m, s in found if m != method)
    reason = f"auto: {method} was cheapest of {names}" + (f" (others: {others})" if others else "")
    note = f"; {best.info.message}" if best.info.message else ""
    return best.with_info(message=reason + note)
