"""Exhaustive search over every compute/free sequence: the reference optimum for small graphs.

The search runs over states ``(held, done)``: bit masks of the held results and of the nodes
computed at least once. From a state, ``compute v`` and ``free v`` are the moves of the simulator's rules
(docs/schedule.md); a schedule is a path from the empty state to one where every node is done
and every output is held.

- :func:`min_cost_schedule` is A* on compute cost under the memory budget, with the admissible bound
  "every node not yet done must still be computed once".
- :func:`min_peak` is the bottleneck version: the smallest budget any schedule can meet.

The state space grows exponentially; it is meant for graphs of up to ~15-18 nodes, where tests use
it as the ground truth for the exact solvers.
"""

from __future__ import annotations

import heapq
import itertools
import time

from .errors import Infeasible, SolverTimeout
from .graph import NodeCosts, node_costs
from .liveness import schedule_from_computes
from .options import time_limit_or_default
from .schedule import Schedule
from .simulate import simulate

MAX_NODES = 22


def _prepare(graph) -> NodeCosts:
    costs = node_costs(graph)
    if costs.n > MAX_NODES:
        raise ValueError(f"exhaustive search is for graphs of at most {MAX_NODES} nodes; this one has {costs.n}")
    return costs


class _Moves:
    """The legal moves of the search, precomputed as bit masks."""

    def __init__(self, costs: NodeCosts):
        self.costs = costs
        self.pred_mask = [sum(1 << p for p in costs.preds[v]) for v in range(costs.n)]
        self.out_mask = sum(1 << v for v in range(costs.n) if costs.output[v])
        self.pinned_mask = sum(1 << v for v in range(costs.n) if costs.pinned[v])
        self.full = (1 << costs.n) - 1

    def is_goal(self, held: int, done: int) -> bool:
        return done == self.full and held & self.out_mask == self.out_mask

    def __call__(self, held: int, done: int, held_bytes: int, budget: int | None = None):
        """Yield (is_compute, node, held, done, held_bytes_after, bytes_during).

        With a ``budget``, frees are offered only while some ready computation does not fit
        ("lazy frees"). Any schedule can be rewritten so that each free is postponed to the first
        compute that needs its memory (or to the node's own recomputation, which a free right before
        it makes pointless), without changing its computations or exceeding the budget; so the
        restriction loses no optimum and prunes most of the held subsets at generous budgets.
        """
        costs = self.costs
        computes = []
        blocked = budget is None
        for v in range(costs.n):
            bit = 1 << v
            if not held & bit and self.pred_mask[v] & held == self.pred_mask[v]:
                during = held_bytes + costs.mem[v] + costs.workspace[v]
                if budget is not None and during > budget:
                    blocked = True
                else:
                    computes.append((True, v, held | bit, done | bit, held_bytes + costs.mem[v], during))
        yield from computes
        if blocked:
            for v in range(costs.n):
                bit = 1 << v
                if held & bit and not self.pinned_mask & bit:
                    after = held_bytes - costs.mem[v]
                    yield False, v, held & ~bit, done, after, after


def min_cost_schedule(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """The cheapest schedule whose peak is at most ``budget`` bytes, proven optimal.

    Raises :class:`Infeasible` (with the true minimum budget) when none fits, and :class:`SolverTimeout`
    when ``time_limit`` seconds pass first.
    """
    started = time.perf_counter()
    costs = _prepare(graph)
    moves = _Moves(costs)

    def still_to_compute(done: int) -> float:
        return sum(costs.cost[v] for v in range(costs.n) if not done >> v & 1)

    counter = itertools.count()
    frontier = [(still_to_compute(0), -0.0, next(counter), 0, 0, 0)]
    best = {(0, 0): 0.0}
    parent: dict = {(0, 0): None}
    while frontier:
        _, neg_spent, _, held, done, held_bytes = heapq.heappop(frontier)
        spent = -neg_spent
        if spent > best[(held, done)]:
            continue
        if moves.is_goal(held, done):
            return schedule_from_computes(graph, _computes_to(held, done, parent, costs)).with_info(
                method="exhaustive", status="optimal", gap=0.0, lower_bound=spent,
                solve_seconds=time.perf_counter() - started, budget_bytes=budget, compute_cost=spent)
        if time_limit is not None and time.perf_counter() - started > time_limit:
            raise SolverTimeout(f"exhaustive search did not finish within {time_limit:g} s", method="exhaustive")
        for is_compute, v, new_held, new_done, new_bytes, _during in moves(held, done, held_bytes, budget):
            new_spent = spent + costs.cost[v] if is_compute else spent
            key = (new_held, new_done)
            if new_spent < best.get(key, float("inf")):
                best[key] = new_spent
                parent[key] = ((held, done), v if is_compute else None)
                # ties in the bound go to the deeper state: it reaches a goal sooner
                heapq.heappush(frontier, (new_spent + still_to_compute(new_done), -new_spent, next(counter),
                                          new_held, new_done, new_bytes))
    left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - started))
    raise Infeasible(f"no schedule fits in {budget} bytes", min_budget=min_peak(graph, left), method="exhaustive")


def _computes_to(held: int, done: int, parent: dict, costs: NodeCosts) -> list:
    """The computations on the search path to state ``(held, done)``, in order."""
    computes = []
    key = (held, done)
    while parent[key] is not None:
        key, node = parent[key]
        if node is not None:
            computes.append(costs.order[node])
    computes.reverse()
    return computes


def min_peak_schedule(graph, time_limit: float | None = None) -> Schedule:
    """A schedule with the smallest peak (bytes) over all valid schedules, proven: the bottleneck
    shortest path (Dijkstra on the peak so far). Raises :class:`SolverTimeout` when ``time_limit`` seconds
    pass first."""
    started = time.perf_counter()
    costs = _prepare(graph)
    moves = _Moves(costs)
    counter = itertools.count()
    frontier = [(0, next(counter), 0, 0, 0)]
    best = {(0, 0): 0}
    parent: dict = {(0, 0): None}
    while frontier:
        peak, _, held, done, held_bytes = heapq.heappop(frontier)
        if peak > best[(held, done)]:
            continue
        if moves.is_goal(held, done):
            return schedule_from_computes(graph, _computes_to(held, done, parent, costs))
        if time_limit is not None and time.perf_counter() - started > time_limit:
            raise SolverTimeout(f"exhaustive search for the minimum peak did not finish within {time_limit:g} s",
                                method="exhaustive")
        for is_compute, v, new_held, new_done, new_bytes, during in moves(held, done, held_bytes):
            new_peak = max(peak, during) if is_compute else peak
            key = (new_held, new_done)
            if new_peak < best.get(key, float("inf")):
                best[key] = new_peak
                parent[key] = ((held, done), v if is_compute else None)
                heapq.heappush(frontier, (new_peak, next(counter), new_held, new_done, new_bytes))
    raise AssertionError("unreachable: computing every node once in topological order is always valid")


def min_peak(graph, time_limit: float | None = None) -> int:
    """The smallest peak (bytes) over all valid schedules: the minimum feasible budget. Raises
    ``TimeoutError`` when ``time_limit`` seconds pass first."""
    return simulate(graph, min_peak_schedule(graph, time_limit)).peak_bytes


def solve_exhaustive(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """The ``exhaustive`` method: :func:`min_cost_schedule`, for graphs of up to ~18 nodes, within
    ``time_limit`` seconds (default :data:`solvers.options.DEFAULT_TIME_LIMIT`: the search is
    exponential, and up to ``MAX_NODES`` nodes it can run for hours). Raises
    :class:`SolverTimeout` when the limit passes first."""
    return min_cost_schedule(graph, budget, time_limit_or_default(time_limit))
