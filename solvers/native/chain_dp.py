"""The cheapest plan over a verified chain (solvers/native/chain.py): a dynamic program, exact.

Why it is exact. On a :class:`~solvers.native.chain.ChainStructure` every memory row of a plan is
``S + v``: ``S`` the sum of the ``K`` (bytes) of the plan's components before some boundary of the
chain, ``v`` a number of one component's option (its ``need``: the most bytes at its core's events
under it alone) or of no plan (a boundary event's bytes). Each row is folded into the component
whose step it constrains: a core's rows into its own ``need``; a boundary event's row into the
components ending at its boundary (``need >= K + bytes``) or starting at it (``need >= bytes``),
leaving out the wide component holding the event in its core (its ``need`` has it). A path through
the chain then fits the budget exactly when, at each component, ``S + need <= budget`` with ``S``
the sum of ``K`` so far, and its seconds are the sum of its options'. Those constraints are
monotone in ``S``: of two partial paths to the same boundary, one with no more ``S`` and no more
seconds can replace the other in any completion. The program keeps, at each boundary, every
partial path no other dominates so (a Pareto front in (``S``, seconds), integers and floats, no
rounding), and one option of a component dominated in (``K``, seconds, ``need``) by another is never
needed. So its cheapest path at the last boundary is the cheapest plan over the menu: ``optimal``
(a proof over the native class, as the MILP's is, by enumeration that dominance only shortens).
The number of states is at most the number of distinct ``S`` values (pseudo-polynomial).
"""

from __future__ import annotations

import numpy as np

from .chain import ChainStructure, Component

_NONE = -(1 << 62)


def _folded_needs(structure: ChainStructure) -> list[np.ndarray]:
    """Each component's ``need`` per option with the boundary events' rows folded in (module docstring)."""
    components = structure.components
    before = [_NONE] * len(components)  # bytes at events right before the component's first unit
    after = [_NONE] * len(components)  # at events right after its last unit (K is added)
    ending: dict[int, list[int]] = {}
    starting: dict[int, list[int]] = {}
    for i, q in enumerate(components):
        ending.setdefault(q.last, []).append(i)
        starting.setdefault(q.first - 1, []).append(i)
    for boundary in structure.boundaries:
        m, cores = boundary.prefix, set(boundary.cores)
        ends = {i for i in cores if components[i].last == m}
        starts = {i for i in cores if components[i].first == m + 1}
        if ends or (not starts and m >= 1):
            for i in ending.get(m, ()):
                if i not in ends:
                    after[i] = max(after[i], boundary.base)
        else:
            for i in starting.get(m, ()):
                if i not in starts:
                    before[i] = max(before[i], boundary.base)
    needs = []
    for i, q in enumerate(components):
        need = np.maximum(q.need, before[i])
        if after[i] > _NONE:
            need = np.maximum(need, q.K + after[i])
        needs.append(need)
    return needs


def _undominated(q: Component, need: np.ndarray) -> np.ndarray:
    """Indices of ``q``'s options that no other beats or equals in K, seconds and need."""
    order = np.lexsort((need, q.K, q.cost))
    kept: list[int] = []
    kept_k = np.zeros(0, dtype=np.int64)
    kept_need = np.zeros(0, dtype=np.int64)
    for i in order:
        if len(kept) and np.any((kept_k <= q.K[i]) & (kept_need <= need[i])):
            continue
        kept.append(int(i))
        kept_k = np.append(kept_k, q.K[i])
        kept_need = np.append(kept_need, need[i])
    return np.array(kept, dtype=np.int64)


def _front(held: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Indices of the states no other has no more bytes and no more seconds than (one of equals)."""
    order = np.lexsort((seconds, held))
    sorted_seconds = seconds[order]
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], sorted_seconds[:-1]]))
    return order[sorted_seconds < best_before]


def solve_chain(structure: ChainStructure, budget: int) -> tuple[set[int], float] | None:
    """The cheapest plan (choice indices) within ``budget`` bytes and the seconds its choices add, or
    None when no plan fits (module docstring: exact over the chain)."""
    components = structure.components
    needs = _folded_needs(structure)
    options = [_undominated(q, need) for q, need in zip(components, needs)]
    starting: dict[int, list[int]] = {}
    for i, q in enumerate(components):
        starting.setdefault(q.first - 1, []).append(i)
    n = structure.units
    # Per boundary: bytes held over the middle (S), seconds, and where each state came from.
    held = {0: np.zeros(1, dtype=np.int64)}
    seconds = {0: np.zeros(1)}
    came_from: dict[int, tuple[np.ndarray, ...]] = {0: (np.full(1, -1),) * 4}
    pending: dict[int, list[tuple[np.ndarray, ...]]] = {}
    for m in range(n + 1):
        if m > 0:
            parts = pending.pop(m, [])
            if not parts:
                continue
            s, c, previous, state, component, option = (np.concatenate(column) for column in zip(*parts))
            keep = _front(s, c)
            held[m], seconds[m] = s[keep], c[keep]
            came_from[m] = (previous[keep], state[keep], component[keep], option[keep])
        if m == n:
            break
        for i in starting.get(m, ()):
            q, chosen = components[i], options[i]
            fits = held[m][:, None] + needs[i][chosen][None, :] <= budget
            rows, columns = np.nonzero(fits)
            if not len(rows):
                continue
            picked = chosen[columns]
            pending.setdefault(q.last, []).append((
                held[m][rows] + q.K[picked], seconds[m][rows] + q.cost[picked], np.full(len(rows), m), rows,
                np.full(len(rows), i), picked))
    if n not in held or not len(held[n]):
        return None
    best = int(np.argmin(seconds[n]))
    taken: set[int] = set()
    m, index = n, best
    while m > 0:
        previous, state, component, option = (int(a[index]) for a in came_from[m])
        taken.update(components[component].options[option])
        m, index = previous, state
    return taken, float(seconds[n][best])


def least_peak(structure: ChainStructure) -> int:
    """The least peak (bytes) of any plan over the chain: the same program with the most ``S + need``
    along a path kept instead of its seconds (exact by the same argument)."""
    components = structure.components
    needs = _folded_needs(structure)
    starting: dict[int, list[int]] = {}
    for i, q in enumerate(components):
        starting.setdefault(q.first - 1, []).append(i)
    held = {0: np.zeros(1, dtype=np.int64)}
    peak = {0: np.full(1, _NONE, dtype=np.int64)}
    pending: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for m in range(structure.units + 1):
        if m > 0:
            s, p = (np.concatenate(column) for column in zip(*pending.pop(m)))
            keep = _front(s, p.astype(float))
            held[m], peak[m] = s[keep], p[keep]
        if m == structure.units:
            break
        for i in starting.get(m, ()):
            q = components[i]
            reached = np.maximum(peak[m][:, None], held[m][:, None] + needs[i][None, :])
            pending.setdefault(q.last, []).append(((held[m][:, None] + q.K[None, :]).ravel(), reached.ravel()))
    return int(peak[structure.units].min())
