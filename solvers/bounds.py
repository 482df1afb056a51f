"""Lower bounds that hold for every schedule of a cost graph, in every order of computation.

:class:`Backward` unrolls, from the end of a schedule, the last computation before a set of
results is first held together; it bounds every schedule's peak (bytes) and, under a budget, its
compute cost (seconds). :func:`cost_lower_bound` is the bound the exact methods report as
``lower_bound``: a method that fixes an order of computation (``ilp``) proves its optimum only in
that order, and only a bound like this one may be reported as a bound on the true optimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from .graph import NodeCosts

# Backward bounds: sets of results examined at most per bound, recursion depth, seconds.
BOUND_WORK = 200_000
BOUND_DEPTH = 400
BOUND_SECONDS = 2.0


def cost_lower_bound(costs: NodeCosts, budget: int, seconds: float | None = BOUND_SECONDS) -> float:
    """Seconds of computation that every schedule within ``budget`` bytes needs, whatever its order:
    at least one computation of every node, and :meth:`Backward.cost` (``math.inf`` when no
    schedule fits). ``seconds`` bounds the work; the bound stays valid when it is cut short."""
    once = float(sum(costs.cost))
    return max(once, Backward(costs, seconds=seconds).cost(budget, costs.cost))


# -- graph facts --------------------------------------------------------------------------------
def relatives(costs: NodeCosts) -> tuple[list[int], list[int]]:
    """The number of ancestors and of descendants of each node (bit sets in topological order)."""
    up = [0] * costs.n
    for v in range(costs.n):
        for u in costs.preds[v]:
            up[v] |= up[u] | (1 << u)
    down = [0] * costs.n
    for v in reversed(range(costs.n)):
        for w in costs.succs[v]:
            down[v] |= down[w] | (1 << w)
    return [bin(b).count("1") for b in up], [bin(b).count("1") for b in down]


class _OutOfWork(Exception):
    """A backward bound ran out of its work or time allowance."""


class Backward:
    """Lower bounds from the last computation before a set of results is held (module doc).

    Take the first moment a schedule holds every result of a set ``S`` (right after a compute step,
    before its frees). That step computed some ``x`` in ``S``; during it, ``S - {x}``, the inputs of
    ``x`` and ``x`` were held, and before it ``T = S - {x} + inputs(x)`` was held, for the first
    time at some earlier moment. Unrolling over ``x`` bounds every schedule prefix that ends holding
    ``S``: its peak from below (:meth:`peak`), and, under a budget, its cost (:meth:`cost`: only the
    ``x`` whose step fits can come last). Sets are bit masks over topological positions.

    Read backwards, an unrolling is a schedule (compute the ``x`` in reverse, holding each ``S``),
    so the bounds are exact when the best unrolling is also valid for the pinned nodes and the nodes
    outside the ancestry. The recursion is exponential in the worst case: past ``BOUND_DEPTH``
    levels a set gets its trivial bound (its own bytes; one computation of each node of its
    ancestry), and after ``work`` sets or ``seconds`` the bound is what the targets finished so far
    (and the trivial bound) give; either way it stays a valid lower bound.
    """

    def __init__(self, costs: NodeCosts, work: int = BOUND_WORK, seconds: float | None = BOUND_SECONDS):
        self.costs = costs
        self.inputs = [sum(1 << u for u in costs.preds[v]) for v in range(costs.n)]
        self.ancestry = [0] * costs.n  # the node and its ancestors
        for v in range(costs.n):
            self.ancestry[v] = 1 << v
            for u in costs.preds[v]:
                self.ancestry[v] |= self.ancestry[u]
        self.work = work
        self.deadline = None if seconds is None else time.perf_counter() + seconds

    @staticmethod
    def members(mask: int):
        while mask:
            low = mask & -mask
            yield low.bit_length() - 1
            mask ^= low

    def held(self, mask: int) -> int:
        return sum(self.costs.mem[y] for y in self.members(mask))

    def closure(self, mask: int) -> int:
        out = 0
        for y in self.members(mask):
            out |= self.ancestry[y]
        return out

    def _exhausted(self, depth: int) -> bool:
        """True past ``BOUND_DEPTH`` (the set gets its trivial bound); raises :class:`_OutOfWork`
        past the work or time allowed (the bound keeps what the finished targets gave)."""
        self.work -= 1
        if self.work < 0 or (self.deadline is not None and time.perf_counter() > self.deadline):
            raise _OutOfWork
        return depth > BOUND_DEPTH

    def _step(self, mask: int, held: int, x: int) -> tuple[int, int, int]:
        """Computing ``x`` last before ``mask`` (of ``held`` bytes) is held: the set held before,
        its bytes, and the bytes during the computation."""
        added = self.inputs[x] & ~mask
        before = (mask & ~(1 << x)) | added
        held_before = held - self.costs.mem[x] + (self.held(added) if added else 0)
        return before, held_before, held_before + self.costs.mem[x] + self.costs.workspace[x]

    def peak(self) -> int:
        """Bytes that every valid schedule's peak reaches."""
        memo: dict[int, int] = {0: 0}

        def reach(mask: int, held: int, depth: int) -> int:
            if mask in memo:
                return memo[mask]
            if self._exhausted(depth):
                return held
            best = math.inf
            for x in sorted(self.members(mask), reverse=True):  # latest first: usually best
                before, held_before, during = self._step(mask, held, x)
                if during < best:
                    best = min(best, max(during, reach(before, held_before, depth + 1)))
            memo[mask] = int(best)
            return memo[mask]

        bound = 0
        for v in range(self.costs.n):  # a node is computed with its inputs held
            bound = max(bound, self._step(1 << v, self.costs.mem[v], v)[2])
        try:
            outputs = self.outputs()
            bound = max(bound, reach(outputs, self.held(outputs), 0))
            for v in range(self.costs.n):
                before, held_before, _ = self._step(1 << v, self.costs.mem[v], v)
                bound = max(bound, reach(before, held_before, 0))
        except _OutOfWork:
            pass
        return bound

    def cost(self, budget: int, weights: Sequence[float]) -> float:
        """A lower bound on the total ``weights`` of the computations of any schedule within
        ``budget`` bytes (``math.inf`` when none can exist): for a set ``S`` that some moment holds,
        what reaching ``S`` costs plus one computation of every node outside its ancestry."""
        memo: dict[int, float] = {0: 0.0}

        def once(mask: int) -> float:
            return sum(weights[y] for y in self.members(mask))

        def reach(mask: int, held: int, depth: int) -> float:
            if mask in memo:
                return memo[mask]
            if self._exhausted(depth):
                return once(self.closure(mask))
            best = math.inf
            for x in sorted(self.members(mask), reverse=True):
                before, held_before, during = self._step(mask, held, x)
                if during > budget or weights[x] + once(self.closure(before)) >= best:
                    continue  # does not fit, or cannot beat the best ending found
                best = min(best, weights[x] + reach(before, held_before, depth + 1))
            memo[mask] = best
            return best

        everything = (1 << self.costs.n) - 1
        targets = [self.outputs()] + [(1 << v) | self.inputs[v] for v in range(self.costs.n)]
        bound = once(everything)
        try:
            for mask in targets:
                bound = max(bound, reach(mask, self.held(mask), 0) + once(everything & ~self.closure(mask)))
        except _OutOfWork:
            pass
        return bound

    def outputs(self) -> int:
        return sum(1 << v for v in range(self.costs.n) if self.costs.output[v])


