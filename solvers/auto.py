"""``solver="auto"``: the best of the methods that fit the graph, and why.

- If the un-checkpointed step fits, store-all: nothing to recompute, nothing to search.
- Otherwise the fast planners on the chain view (``dp``, optimal in the chain model, and
  ``chen-greedy``). On graphs of at most :data:`EXACT_MAX_NODES` nodes, the order-free relaxation's
  bound (solvers/orderfree, valid over every schedule in every order; at most
  :data:`BOUND_SECONDS`): when the cheaper of the two meets it, that schedule is proven optimal
  and nothing else runs.
- Otherwise, on those graphs, ``cpsat`` under a time limit (default :data:`DEFAULT_EXACT_SECONDS`),
  hinted with their schedules. The cheapest schedule wins; its ``lower_bound`` is the best bound
  any of them proved (the order-free one, or cpsat's own), its status ``optimal`` when that bound
  meets its cost and ``feasible`` with the gap otherwise; the message says which bound certifies.
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
# Seconds the order-free bound may take (a 163-node GPT-2 module graph: its LP in under a second;
# its MILP's dual bound keeps improving for a minute, and whatever it reached by then is valid).
BOUND_SECONDS = 5.0
# A cost within this relative distance of a bound is proven optimal (the solvers' tolerance).
OPTIMALITY_TOLERANCE = 1e-7


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
    small = graph.number_of_nodes() <= EXACT_MAX_NODES
    bound: tuple[float, str] | None = None  # (seconds, which bound)
    for method in (*FAST_METHODS, "cpsat") if small else FAST_METHODS:
        if method == "cpsat":
            if _proven(tried, bound):
                break  # the order-free bound already proves the cheapest fast schedule optimal
        limit = (time_limit or DEFAULT_EXACT_SECONDS) if method == "cpsat" else time_limit
        try:
            tried.append((method, solve(graph, budget, method=method, time_limit=limit)))
        except Infeasible as error:
            tried.append((method, None))
            if error.min_budget is not None:
                minimums.append(int(error.min_budget))
        except (TimeoutError, SolverUnavailable):
            tried.append((method, None))
        if small and method == FAST_METHODS[-1] and any(s is not None for _, s in tried):
            from .orderfree import order_free_bound

            value = order_free_bound(graph, budget, min(BOUND_SECONDS, time_limit or BOUND_SECONDS))
            bound = (value, "the order-free relaxation's bound")
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
    for m, s in found:  # every method's lower bound holds for every schedule: the best one counts
        if s.info.lower_bound is not None and (bound is None or s.info.lower_bound > bound[0]):
            bound = (s.info.lower_bound, f"{m}'s bound")
    info, cost = best.info, best.info.compute_cost
    if bound is not None and info.status != "optimal":
        lower = min(bound[0], cost)
        gap = 0.0 if cost <= 0 else (cost - lower) / cost
        if gap <= OPTIMALITY_TOLERANCE:
            best = best.with_info(status="optimal", gap=0.0, lower_bound=cost)
            reason += f"; proven optimal by {bound[1]}"
        else:
            best = best.with_info(status="feasible", gap=gap, lower_bound=lower)
            reason += f"; within {gap:.2%} of {bound[1]} ({lower:.6g} s)"
    elif info.status == "optimal" and method != "store-all":
        reason += f"; proven optimal by {method}"
    note = f"; {best.info.message}" if best.info.message else ""
    return best.with_info(message=reason + note)


def _proven(tried, bound) -> bool:
    """Whether ``bound`` (seconds, label) meets the cost of the cheapest schedule tried so far."""
    costs = [s.info.compute_cost for _, s in tried if s is not None]
    return bound is not None and bool(costs) and min(costs) - bound[0] <= OPTIMALITY_TOLERANCE * max(min(costs), 1e-12)
