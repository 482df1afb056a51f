"""Dominated choices of the native menu: a choice that another choice beats in every plan.

Choice ``b`` *dominates* choice ``a`` when, in every plan ``P`` that takes ``a``, the plan
``P - a + b`` is a plan too (``b``'s region inside ``a``'s: it overlaps nothing ``a`` does not), costs
no more (seconds) and holds no more at any of its events (bytes) than ``P`` holds at some event of
``P``: whatever budget ``P`` fits, ``P - a + b`` fits. The MILP may then leave ``a`` out (its column
fixed to 0) and still find the cheapest plan: from any optimum that takes ``a``, the swap gives one
as cheap without it. Dominance pruning of this kind is the classical reduction of knapsack-type
problems (Martello and Toth, *Knapsack Problems*, 1990, section 1.2; for integer programs, the
"dominated columns" of presolve: Gamrath et al., *Exploiting symmetries and dominance in MIP*, 2015).

Every condition is read off :class:`~solvers.native.peak_rows.PeakRows`, whose rows are exact at
every plan, and checked conservatively (a pair that fails any is not pruned):

1. span: ``b``'s forward ops within ``a``'s, ``cost[b] <= cost[a]`` (ties: the earlier choice kept);
2. the per-choice bytes: ``delta_b(e) <= delta_a(e)`` at every event owned by neither;
3. the shared results (:class:`~solvers.native.peak_rows.Shared`): every reader ``a`` removes, ``b``
   removes too, and the readers ``b`` adds end no later than the latest one ``a`` adds, so each shared
   result is held no longer under ``P - a + b`` than under ``P``;
4. ``b``'s own events (its recomputation, right before its trigger ``t``): by the identity of
   :meth:`PeakRows.twin_row`, each holds ``memory(t) + lift_b(k)`` bytes whatever the rest of the plan,
   so with 2-3 at ``t`` they hold no more than ``P`` at ``t`` (``lift_b <= 0``) or at ``a``'s own
   events before the same trigger (``max lift_b <= max lift_a``).
"""

from __future__ import annotations

import numpy as np

from .peak_rows import PeakRows


def _per_choice_bytes(rows: PeakRows, choices) -> dict[int, np.ndarray]:
    """``delta_c`` of each of ``choices`` as a dense array over the axis events (bytes)."""
    dense = {}
    for c in choices:
        mine = rows.choice_of == c
        change = np.zeros(rows.events + 1, dtype=np.int64)
        np.add.at(change, rows.starts[mine], rows.amounts[mine])
        np.add.at(change, rows.stops[mine] + 1, -rows.amounts[mine])
        dense[c] = np.cumsum(change[:-1])
    return dense


def _shared_moves(rows: PeakRows) -> list[dict[int, tuple[set[int], int]]]:
    """Per choice, per shared result (index): (the breakpoints whose removable readers it removes,
    the latest breakpoint at which it adds a reader, -1 for none)."""
    moves: list[dict[int, tuple[set[int], int]]] = [{} for _ in rows.menu.choices]
    for index, result in enumerate(rows.shared):
        for j, needs in enumerate(result.needs):
            for kind, what in needs:
                for c in ([what] if kind == "added" else what):
                    removed, latest = moves[c].get(index, (set(), -1))
                    if kind == "added":
                        latest = max(latest, result.breaks[j])
                    else:
                        removed = removed | {(j, frozenset(what))}
                    moves[c][index] = (removed, latest)
    return moves


def _shared_no_longer(moves, rows: PeakRows, a: int, b: int) -> bool:
    """Condition 3: every shared result held no longer with ``b`` in place of ``a``."""
    for removed_a, _ in moves[a].values():
        if any(b not in what for _, what in removed_a):
            return False
    for index, (_, latest_b) in moves[b].items():
        latest_a = moves[a].get(index, (set(), -1))[1]
        if latest_b > max(latest_a, rows.shared[index].fixed):
            return False
    return True


def _lifts(rows: PeakRows, c: int) -> float | None:
    """Condition 4's ``max lift_c``: the most choice ``c``'s own events hold above its trigger's event
    (bytes; ``-inf`` for a choice without own events); None where :meth:`PeakRows.twin_row`'s identity
    does not hold (another choice, not overlapping ``c``, recomputes before the same trigger)."""
    events = np.flatnonzero(rows.owner == c)
    if not len(events):
        return -np.inf
    trigger = int(rows.trigger_at[c])
    same = np.flatnonzero(rows.trigger_at == trigger)
    if any(d != c and not rows.menu.overlapping(int(d), c) for d in same):
        return None
    memory = rows.memory({c})
    return float(memory[events].max() - memory[trigger])


def dominated_choices(rows: PeakRows) -> dict[int, int]:
    """Each dominated choice -> a kept choice that dominates it (module docstring), over ``rows``'
    menu. Choices are visited cheapest first, each compared with the kept ones only."""
    menu = rows.menu
    order = sorted(range(len(menu.choices)), key=lambda c: (rows.cost[c], c))
    pairs = {a: [b for b in order if b != a and (rows.cost[b], b) < (rows.cost[a], a)
                 and menu.spans[a][0] <= menu.spans[b][0] and menu.spans[b][1] <= menu.spans[a][1]]
             for a in order}
    involved = {c for a, bs in pairs.items() if bs for c in (a, *bs)}
    dense = _per_choice_bytes(rows, involved)
    moves = _shared_moves(rows)
    lifts = {c: _lifts(rows, c) for c in involved}
    dominated: dict[int, int] = {}
    for a in order:
        for b in pairs[a]:
            if b in dominated or lifts[b] is None:
                continue
            if not _shared_no_longer(moves, rows, a, b):
                continue
            lift_a = lifts[a] if lifts[a] is not None and rows.trigger_at[a] == rows.trigger_at[b] else -np.inf
            if lifts[b] > max(0.0, lift_a):
                continue
            others = (rows.owner != a) & (rows.owner != b)
            if np.all(dense[b][others] <= dense[a][others]):
                dominated[a] = b
                break
    return dominated
