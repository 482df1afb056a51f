"""``revolve``: Griewank-Walther binomial checkpointing on the chain view.

Griewank & Walther, "Algorithm 799: revolve: an implementation of checkpointing for the reverse or
adjoint mode of computational differentiation", ACM TOMS 26(1), 2000.

Griewank's setting is a chain of ``l`` equal steps ``x_{i+1} = F_i(x_i)`` reversed with ``s``
checkpoint slots, the slot holding ``x_0`` included. Reversing step ``i`` means running it once
more *taped* (``Fe_i``, keeping what its backward needs) right before its backward ``B_i``; every
other forward run is *untaped* (``CF_i``/``Fn_i``, keeping only its output). ``t(l, s)``
(:func:`extra_forwards`) is the fewest untaped steps that suffices.

How this maps onto a training step's chain (:mod:`solvers.chainmodel`). The ``l = L`` steps are
the stages ``F_0..F_{L-1}``; the loss is not a step but the adjoint's seed: it runs between the
taped ``Fe_{L-1}`` and ``B_{L-1}`` (``Fe_{L-1} L B_{L-1}``), as Revolve's "firsturn" evaluates
the last step and starts the reverse sweep. So a revolve sequence holds exactly

- ``L`` taped forward ops ``Fe_i``, one right before each ``B_i`` (before ``L`` for ``i = L-1``),
- ``t(L, s)`` untaped forward ops (``CF_i`` where the input is kept in a slot, ``Fn_i`` otherwise),

``L + t(L, s)`` forward ops in all, one ``L`` and ``L`` backward ops. With ``s >= L - 1`` slots
that is ``2L - 1`` forward ops: one untaped pass that stores ``x_0..x_{L-2}`` and the taped one.
The working state (the input of the step being run) is not a slot: with ``s = 1`` only ``x_0`` is
stored and every step ``i`` is reached again from it, ``t(L, 1) = L(L-1)/2``.

On a real graph the stages differ, and revolve ignores that (that is ``dp``'s job): it only chooses
the slot count. Every ``s`` in ``1..L-1`` is a candidate (``s >= L-1`` all give the same sequence);
the cheapest whose lowered schedule's simulated peak fits wins. ``s = 1`` needs the least memory
in the model (everything recomputed from ``x_0``, which on a cost graph costs no bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

from .chain import ChainView
from .chainmodel import Op
from .chen import Candidate, checkpoint_bytes, plan_seconds, solve_by_plans, stage_forward_seconds
from .graph import total_cost
from .schedule import Schedule


def _beta(slots: int, repetitions: int) -> int:
    """``beta(s, r) = C(s + r, s)``: the longest chain that ``s`` slots reverse with no step run
    untaped more than ``r`` times (Griewank & Walther); ``beta(s, -1) = 0`` for the formulas below."""
    return comb(slots + repetitions, slots) if repetitions >= 0 else 0


def repetition_number(steps: int, slots: int) -> int:
    """The ``r`` with ``beta(s, r-1) < l <= beta(s, r)`` (0 for ``l <= 1``)."""
    _check(steps, slots)
    if slots == 1:
        return max(0, steps - 1)  # beta(1, r) = r + 1
    r = 0
    while _beta(slots, r) < steps:
        r += 1
    return r


def extra_forwards(steps: int, slots: int) -> int:
    """Griewank-Walther ``t(l, s)``: the fewest untaped forward steps that reverse a chain of ``l``
    steps with ``s`` checkpoint slots, the slot of ``x_0`` included.

    ``t(l, s) = r*l - beta(s+1, r-1)`` with ``r`` the repetition number. It equals the DP
    ``t(l, s) = min_{1<=j<l} j + t(j, s) + t(l-j, s-1)`` (advance ``j`` steps, store ``x_j``, reverse
    the tail with ``s-1`` slots, the head with ``s``); ``t(1, s) = 0``, ``t(l, 1) = l(l-1)/2``,
    ``t(l, s) = l-1`` for ``s >= l-1``.
    """
    if steps <= 1:
        _check(steps, max(slots, 1))
        return 0
    r = repetition_number(steps, slots)
    return r * steps - _beta(slots + 1, r - 1)


@lru_cache(maxsize=1 << 16)
def optimal_split(steps: int, slots: int) -> int:
    """A first advance ``j`` (1 <= j < l) that attains ``t(l, s) = j + t(j, s) + t(l-j, s-1)``.

    The optimal advances form the range ``[max(1, beta(s, r-2), l - beta(s-1, r)),
    min(l-1, beta(s, r-1), l - beta(s-1, r-1))]``: the head keeps repetition number at most ``r-1``
    with ``s`` slots, the tail at most ``r`` with ``s-1``. (Checked against the DP in the tests.)
    We take its low end: on equal steps any choice costs the same.
    """
    if steps < 2:
        raise ValueError(f"a chain of {steps} step(s) is not split")
    if steps <= slots + 1:
        return 1  # r = 1: store every state, one step at a time
    r = repetition_number(steps, slots)
    return max(1, _beta(slots, r - 2), steps - _beta(slots - 1, r))


def _check(steps: int, slots: int) -> None:
    if steps < 0:
        raise ValueError(f"a chain has >= 0 steps, got {steps}")
    if slots < 1:
        raise ValueError(f"revolve needs at least one slot (the one holding x_0), got {slots}")


def revolve_sequence(length: int, slots: int) -> list[Op]:
    """The binomial schedule of a chain of ``length`` stages and its loss, as a chain sequence.

    Reversing stages ``[begin, end)`` from a held ``x_begin`` with ``s`` slots: if one stage is left,
    ``Fe_begin`` (then ``L`` if it is the last stage) and ``B_begin``; else advance
    ``j = optimal_split`` stages untaped (``CF_begin``, which keeps ``x_begin``, then ``Fn``), keep
    ``x_{begin+j}``, reverse ``[begin+j, end)`` with ``s-1`` slots, then ``[begin, begin+j)`` with
    ``s``. An explicit stack instead of recursion: ``s`` and ``L`` can be in the thousands.
    """
    _check(length, slots)
    if length == 0:
        return [Op("L", 0)]
    sequence: list[Op] = []
    pending = [(0, length, slots)]  # sub-chains still to reverse, the next one last
    while pending:
        begin, end, free = pending.pop()
        if end - begin == 1:
            sequence.append(Op("Fe", begin))
            if begin == length - 1:
                sequence.append(Op("L", length))
            sequence.append(Op("B", begin))
            continue
        advance = optimal_split(end - begin, free)
        sequence.append(Op("CF", begin))
        sequence.extend(Op("Fn", i) for i in range(begin + 1, begin + advance))
        pending.append((begin, begin + advance, free))  # the head, reversed after the tail
        pending.append((begin + advance, end, free - 1))
    return sequence


def slot_counts(length: int) -> range:
    """The slot counts worth trying: ``1..L-1`` (more than ``L-1`` gives the same sequence)."""
    return range(1, max(1, length - 1) + 1)


@dataclass(frozen=True)
class SplitSummary:
    """What the binomial schedule of ``L`` stages with ``s`` slots does, without listing its ops.

    ``runs[i]``: how many forward ops of stage ``i`` it has (sums to ``L + t(L, s)``).
    ``held_at_loss``: the checkpoints ``x_i`` (``i > 0``) it holds while the loss runs: the ones
    stored by the first descent, along the chain of tails.
    """

    runs: tuple[int, ...]
    held_at_loss: tuple[int, ...]


def split_summary(length: int, slots: int) -> SplitSummary:
    """Walk the split tree of :func:`revolve_sequence` (``L - 1`` splits, one per inner node) and count
    forward runs per stage with a difference array: O(L) instead of O(L + t(L, s))."""
    _check(length, slots)
    difference = [0] * (length + 1)
    pending = [(0, length, slots)] if length else []
    while pending:
        begin, end, free = pending.pop()
        if end - begin == 1:
            difference[begin] += 1  # the taped Fe_begin
            difference[begin + 1] -= 1
            continue
        advance = optimal_split(end - begin, free)
        difference[begin] += 1  # the untaped advance over [begin, begin + advance)
        difference[begin + advance] -= 1
        pending.append((begin, begin + advance, free))
        pending.append((begin + advance, end, free - 1))
    runs, running = [], 0
    for i in range(length):
        running += difference[i]
        runs.append(running)
    return SplitSummary(tuple(runs), held_at_loss(length, slots))


def held_at_loss(length: int, slots: int) -> tuple[int, ...]:
    """The checkpoints ``x_i`` (``i > 0``) the binomial schedule holds while the loss runs: those the
    first descent stores along the chain of tails (O(s), no sequence needed)."""
    held, begin, free = [], 0, slots
    while length - begin > 1:
        begin += optimal_split(length - begin, free)
        free -= 1
        if length - begin > 1:  # else x_begin is the working state of Fe_{L-1}, consumed before L
            held.append(begin)
    return tuple(held)


def revolve_candidate(view: ChainView, slots: int, base_seconds: float, stage_seconds: list[float]) -> Candidate:
    """Slot count ``s`` as a :class:`Candidate`. Its cost bound charges each of the ``t(L, s)`` extra
    forward runs at the cheapest stage; the exact cost walks the split tree (O(L)) only if needed."""
    length = view.length
    extra = extra_forwards(length, slots)
    return Candidate(
        label=f"{slots} slot(s) incl. x_0's, {extra} extra stage forwards over L={length}",
        build=lambda: revolve_sequence(length, slots),
        cost=lambda: plan_seconds(base_seconds, stage_seconds, split_summary(length, slots).runs),
        cost_lower_bound=base_seconds + extra * min(stage_seconds, default=0.0),
        peak_lower_bound=checkpoint_bytes(view, held_at_loss(length, slots)),
    )


def revolve_candidates(view: ChainView, slots: int | None = None) -> list[Candidate]:
    """One candidate per slot count (all of :func:`slot_counts`, or just ``slots``)."""
    counts = slot_counts(view.length) if slots is None else [min(slots, max(1, view.length - 1))]
    base, stage_seconds = total_cost(view.graph), stage_forward_seconds(view)
    return [revolve_candidate(view, s, base, stage_seconds) for s in counts]


def solve_revolve(graph, budget: int, time_limit: float | None = None, slots: int | None = None) -> Schedule:
    """``revolve``: the binomial schedule on the chain view, with the slot count searched.

    Returns store-all when it fits (status ``optimal``); else the cheapest slot count whose lowered
    schedule's simulated peak fits (``heuristic``). The search goes by cost, so in practice from
    many slots to few, and never simulates an ``s`` whose checkpoints held at the loss alone
    (:func:`held_at_loss`, lower-bounded by :func:`solvers.chen.checkpoint_bytes`) exceed the
    budget: that is "start from how many checkpoints fit and decrease ``s`` until the simulated peak
    fits", without a guess that could skip a fitting ``s``. ``slots`` fixes the slot count instead. Raises
    :class:`Infeasible` with ``min_budget`` = the least simulated peak over the slot counts tried
    (usually ``s = 1``) and store-all. ``time_limit`` is accepted and unused.
    """
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise ValueError(f"slots must be an integer >= 1 (x_0's slot included), got {slots!r}")
    return solve_by_plans(graph, budget, "revolve", lambda view: revolve_candidates(view, slots))
