"""How many instances (intervals) each node gets: the three rules of :mod:`solvers.cpsat`, and
the bound that still holds when large graphs force caps below them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence

from ..graph import NodeCosts

# Rule 2 grows fast with depth; keep the arithmetic small.
COUNT_CEILING = 1_000_000


@dataclass(frozen=True)
class Counts:
    """Instances per node, and which nodes got fewer than rules 2-3 (module doc) allow."""

    counts: tuple[int, ...]
    capped: tuple[bool, ...]

    @property
    def horizon(self) -> int:
        return sum(self.counts)

    @property
    def largest(self) -> int:
        return max(self.counts, default=0)

def recompute_limit(cost: float, spare: float | None) -> int:
    """Rule 3: a schedule at most ``spare`` seconds dearer than computing every node once computes
    a node of cost ``cost`` at most ``1 + spare / cost`` times (rounded up against float error)."""
    if spare is None or cost <= 0:
        return COUNT_CEILING
    extra = max(spare, 0.0) / cost * (1 + 1e-9) + 1e-9  # inf for a denormal cost: no limit
    return COUNT_CEILING if extra >= COUNT_CEILING else 1 + int(extra)

def interval_counts(costs: NodeCosts, caps: Sequence[int], spare: float | None,
                    at_least: Sequence[int] = ()) -> Counts:
    """``C_v = min(rule 2, rule 3, caps[v])``, raised to ``at_least[v]`` (a hint's counts), in reverse
    topological order so that rule 2 sees the successors' final counts."""
    counts = [0] * costs.n
    capped = [False] * costs.n
    for v in reversed(range(costs.n)):
        if costs.pinned[v] or not costs.succs[v]:
            natural = 1
        else:
            reads = sum(counts[w] for w in costs.succs[v]) + (1 if costs.output[v] else 0)
            natural = min(COUNT_CEILING, max(1, reads), recompute_limit(costs.cost[v], spare))
        count = min(natural, caps[v])
        if at_least:
            count = max(count, at_least[v])
        counts[v] = count
        capped[v] = count < natural
    return Counts(tuple(counts), tuple(capped))

def uniform_cap(costs: NodeCosts, spare: float | None, horizon_limit: int, at_least: Sequence[int]) -> int:
    """The largest cap for every node whose counts fit ``horizon_limit`` (1 if none does)."""
    def horizon(cap: int) -> int:
        return interval_counts(costs, [cap] * costs.n, spare, at_least).horizon

    low, high = 1, COUNT_CEILING
    if horizon(high) <= horizon_limit:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if horizon(middle) <= horizon_limit:
            low = middle
        else:
            high = middle - 1
    return low

def capped_lower_bound(costs: NodeCosts, counts: Counts, base: float) -> float:
    """The module doc's bound on a schedule that needs more instances than ``counts`` allows."""
    return min((base + counts.counts[v] * costs.cost[v] for v in range(costs.n) if counts.capped[v]),
               default=math.inf)

def counts_of(n: int, computes: Sequence[int]) -> list[int]:
    used = [0] * n
    for v in computes:
        used[v] += 1
    return used

def max_computations(costs: NodeCosts, spare: float | None) -> int | None:
    """At most this many computations in a schedule within ``spare`` of the un-checkpointed cost."""
    if spare is None or not costs.n or min(costs.cost) <= 0:
        return None
    extra = max(spare, 0.0) / min(costs.cost) * (1 + 1e-9) + 1e-9
    return None if extra >= COUNT_CEILING * costs.n else costs.n + int(extra)
