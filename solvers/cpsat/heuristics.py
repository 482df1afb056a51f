"""Schedules that seed the search (hints) and bound the least peak: the quick methods', and two
greedy orders of this package's own."""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from collections.abc import Sequence

from ..clock import Clock
from ..graph import NodeCosts
from ..liveness import schedule_from_computes
from ..api import schedule_from
from ..schedule import Schedule
from ..simulate import Simulation, simulate
from .counts import counts_of

LOG = logging.getLogger(__name__)
HEURISTIC_METHODS = ("store-all", "chen-greedy", "dp")


@dataclass(frozen=True)
class Checked:
    """A compute order (node positions, unread recomputations dropped), its schedule with the
    frees of ``schedule_from_computes``, and what ``simulate`` says of it."""

    computes: list[int]
    schedule: Schedule
    simulation: Simulation

def essential_computes(costs: NodeCosts, computes: Sequence[int]) -> list[int]:
    """Drop the computations nobody reads (rule 1 of the module doc), the first one of a node
    included, as long as another computation of the node remains, and keeping the last computation
    of an output. Cost and memory only go down; the model's dominance constraints need this form."""
    computes = list(computes)
    while True:
        read = [False] * len(computes)
        live: dict[int, int] = {}
        last: dict[int, int] = {}
        total = counts_of(costs.n, computes)
        for position, v in enumerate(computes):
            for u in costs.preds[v]:
                read[live[u]] = True
            live[v] = last[v] = position
        drop = set()
        for position, v in enumerate(computes):
            final = last[v] == position
            if not read[position] and not (final and costs.output[v]) and total[v] > 1:
                drop.add(position)
                total[v] -= 1
        if not drop:
            return computes
        computes = [v for position, v in enumerate(computes) if position not in drop]

def checked(graph, costs: NodeCosts, computes: Sequence[int], budget: int | None) -> Checked:
    """Anything ``simulate`` rejects (or finds over the budget) is a bug in this module: raise."""
    order = [costs.order[v] for v in essential_computes(costs, computes)]
    schedule = schedule_from_computes(graph, order)
    outcome = simulate(graph, schedule)
    if not outcome.valid or (budget is not None and outcome.peak_bytes > budget):
        problem = outcome.error if not outcome.valid else f"peak {outcome.peak_bytes} > budget {budget}"
        raise AssertionError(f"cpsat: a model solution fails the simulator ({problem}); this is a bug")
    return Checked([costs.index[v] for v in order], schedule, outcome)

def heuristic_schedules(graph, budget: int, clock: Clock) -> list[Schedule]:
    """Schedules of the quick methods within the budget (hints). A method that is infeasible, out
    of time or unavailable gives none (:func:`solvers.api.schedule_from`); any other failure
    is a bug in it and propagates."""
    found = []
    for method in HEURISTIC_METHODS:
        if clock.expired():
            break
        schedule = schedule_from(graph, budget, method, clock.share(0.1))
        if schedule is not None:
            found.append(schedule)
    return found

class _Evicting:
    """State of :func:`evicting_order`: held results, their bytes, and results that must stay."""

    def __init__(self, costs: NodeCosts, budget: int):
        self.costs, self.budget = costs, budget
        self.held: set[int] = set()
        self.bytes = 0
        self.protected: dict[int, int] = {}  # inputs of computations waiting for other inputs
        self.order: list[int] = []
        self.position = 0  # the node of the topological order being computed

    def next_use(self, u: int) -> int:
        """When ``u`` is read next: its next successor in topological order (they are sorted); the
        end for an output; never (2n) otherwise."""
        readers = self.costs.succs[u]
        at = bisect.bisect_left(readers, self.position)
        if at < len(readers):
            return readers[at]
        return self.costs.n if self.costs.output[u] else 2 * self.costs.n

    def compute(self, x: int) -> bool:
        """Compute ``x`` (its inputs are held), first evicting the results read furthest ahead."""
        costs = self.costs
        if self.bytes + costs.mem[x] + costs.workspace[x] > self.budget:
            victims = sorted((u for u in self.held if not self.protected.get(u) and not costs.pinned[u]
                              and u not in costs.preds[x]),
                             key=lambda u: (self.next_use(u), costs.mem[u]))
            while self.bytes + costs.mem[x] + costs.workspace[x] > self.budget:
                if not victims:
                    return False
                victim = victims.pop()  # read furthest ahead (the largest on ties)
                self.held.discard(victim)
                self.bytes -= costs.mem[victim]
        self.order.append(x)
        self.held.add(x)
        self.bytes += costs.mem[x]
        return True

    def ensure(self, target: int) -> bool:
        """Hold ``target``, recomputing its missing inputs recursively."""
        stack = [(target, False)]
        while stack:
            x, ready = stack.pop()
            if ready:
                for u in self.costs.preds[x]:
                    self.protected[u] -= 1
                if x not in self.held and not self.compute(x):
                    return False
                continue
            if x in self.held:
                continue
            stack.append((x, True))
            for u in self.costs.preds[x]:
                self.protected[u] = self.protected.get(u, 0) + 1
            stack.extend((u, False) for u in self.costs.preds[x] if u not in self.held)
        return True

def evicting_order(costs: NodeCosts, budget: int) -> list[int] | None:
    """A compute order within ``budget`` (a hint): the nodes in topological order, a missing input
    recomputed when needed, and, when memory runs out, the result read furthest ahead evicted
    (Belady's rule). ``None`` when it gets stuck."""
    state = _Evicting(costs, budget)
    for target in range(costs.n):
        state.position = target
        if not state.ensure(target):
            return None
    state.position = costs.n
    for v in range(costs.n):  # outputs evicted on the way are computed again, then kept
        if costs.output[v]:
            if not state.ensure(v):
                return None
            state.protected[v] = state.protected.get(v, 0) + 1
    return state.order

def demand_order(costs: NodeCosts, keep: Sequence[bool]) -> list[int]:
    """A compute order: the nodes in topological order, a missing input recomputed (recursively)
    when needed; after each node, the results not in ``keep`` are dropped."""
    held: set[int] = set()
    order: list[int] = []
    for target in range(costs.n):
        stack = [(target, False)]
        while stack:  # post-order: the inputs of x, then x
            x, ready = stack.pop()
            if x in held:
                continue
            if ready:
                order.append(x)
                held.add(x)
                continue
            stack.append((x, True))
            stack.extend((u, False) for u in costs.preds[x] if u not in held)
        held = {x for x in held if keep[x] or x == target}
    return order

def recompute_seconds(costs: NodeCosts, keep: Sequence[bool], v: int) -> float:
    """Seconds to recompute ``v`` from kept results: it and its ancestors up to kept ones."""
    seen, stack, total = {v}, [v], 0.0
    while stack:
        x = stack.pop()
        total += costs.cost[x]
        for u in costs.preds[x]:
            if not keep[u] and u not in seen:
                seen.add(u)
                stack.append(u)
    return total

def keeping_order(graph, costs: NodeCosts, budget: int, seconds: float = 2.0) -> list[int] | None:
    """A compute order within ``budget`` (a hint): from keeping every result, stop keeping the
    results held at the peak with the most bytes per second of recomputation, until it fits."""
    keep = [True] * costs.n
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        order = demand_order(costs, keep)
        schedule = schedule_from_computes(graph, [costs.order[v] for v in order])
        outcome = simulate(graph, schedule)
        if outcome.peak_bytes <= budget:
            return order
        held: set = set()
        for kind, node in schedule.steps[: outcome.peak_step]:
            (held.add if kind == "compute" else held.discard)(node)
        candidates = [costs.index[x] for x in held]
        candidates = [v for v in candidates if keep[v] and not costs.output[v] and costs.mem[v] > 0]
        if not candidates:
            return None
        candidates.sort(key=lambda v: costs.mem[v] / (recompute_seconds(costs, keep, v) + 1e-12), reverse=True)
        for v in candidates[: max(1, len(candidates) // 4)]:
            keep[v] = False
    return None

def greedy_schedules(graph, costs: NodeCosts, budget: int, seconds: float) -> list[Checked]:
    """The schedules of the two heuristics above that fit (hints; none is needed)."""
    found = []
    for order in (evicting_order(costs, budget), keeping_order(graph, costs, budget, seconds)):
        if order is None:
            continue
        try:
            found.append(checked(graph, costs, order, budget))
        except (AssertionError, ValueError) as error:  # a hint only: never fail the solver for it
            LOG.debug("cpsat: a heuristic order is unusable: %s", error)
    return found

def low_peak_schedule(graph, costs: NodeCosts, low: int, high: int, seconds: float = 2.0) -> Checked | None:
    """The lowest-peak schedule :func:`evicting_order` finds, by bisection of its budget."""
    best = None
    deadline = time.perf_counter() + seconds
    while low <= high and time.perf_counter() < deadline:
        middle = (low + high) // 2
        order = evicting_order(costs, middle)
        if order is None:
            low = middle + 1
            continue
        found = checked(graph, costs, order, middle)
        if best is None or found.simulation.peak_bytes < best.simulation.peak_bytes:
            best = found
        high = found.simulation.peak_bytes - 1
    return best
