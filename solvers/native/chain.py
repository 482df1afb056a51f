"""The native problem as a chain of components, where its peak rows allow it: checked from the rows.

A plan takes, from the menu's tree of regions (each region's span of forward ops nested in its
parent's), either a whole region under one of its policies or some of the regions within it. This
module cuts the tree into *components*: a **unit** (a subtree whose plans, every set of disjoint
choices within it, are enumerated: :data:`OPTION_LIMIT` at most) or a **wide** choice (a region above
the units, under a policy: taking it replaces every unit within it). Units are laid out in forward
order, ``1..n``; a wide component covers units ``first..last``; a plan is a path through them.

For each component ``Q`` it reads off the rows (solvers/native/peak_rows.py, exact at every plan) the
*effect* of each of its options on every event's memory (the option alone, against no plan), and
three event ranges: its ``window`` (outside it no option changes any event's memory), its
``middle`` (the run of events between its last forward op and its first backward op or
recomputation in which no option's effect changes, holding the most trace ops: every option changes
the memory there by one amount, its ``K``), and its core (the window less the middle).
:func:`chain_structure` then *verifies*, on these rows, what makes a dynamic program over the chain
exact:

1. additivity: the memory of a plan is the memory of no plan plus the sum of its components'
   effects. The interval part of the rows is linear in the choices; a shared result's part (held
   while some reader is active: a maximum) is checked, for each run of events between its
   breakpoints, over every combination of states of the components a plan can take together;
2. nesting: for two components a plan can take together, ``Q1`` before ``Q2``, ``window(Q2)`` lies in
   ``middle(Q1)``; a unit's trace events in its core lie in the core of every wide component above
   it; every recomputation event lies in its own choice's component's core;
3. the other events (in no unit's core): the units whose middle holds the event are a prefix
   ``1..m`` of the chain and no later unit's window holds it; a wide component holds it in its
   core, or lies wholly before it (the event in its middle) or wholly after it (outside its window).

The argument. Take a plan (a path of components) and an event ``e`` that is a row under it. By 1,
its memory is the memory of no plan plus each component's effect at ``e``. If ``e`` is in the core
of the path's component ``Q``, every component before ``Q`` holds ``e`` in its middle (2), where its
effect is its ``K``, and every one after ``Q`` does not hold ``e`` in its window (its window lies in
``Q``'s middle), where its effect is 0: the memory is ``S`` (the sum of ``K`` before ``Q``) plus the
memory of ``Q``'s option alone. Otherwise (3) it is the memory of no plan plus the ``K`` of the
components up to the event's prefix boundary, or, where the path takes a wide component holding
``e`` in its core, that component's case above. So every row is ``S`` plus a number of one option,
and solvers/native/chain_dp.py solves that exactly. Where a check fails, the smallest subtree
holding the culprits becomes one unit and the checks run again; where that would exceed
:data:`OPTION_LIMIT` plans, :func:`chain_structure` returns a :class:`NoChain` and the MILP is used.

Units: bytes for memory, seconds for cost; events are positions on the rows' axis.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..regions.members import ModuleNodes
from ..regions.region_model import RegionModel
from .peak_rows import PeakRows

# Plans of one unit enumerated at most (a GPT-2 MLP with four children under five policies: 1,301).
OPTION_LIMIT = 5000
# Joint states of a shared result's readers enumerated at most, per run of events, to check additivity.
STATE_LIMIT = 20000
# Times the tree is coarsened (a failed check's subtree made one unit) before giving up.
ROUNDS = 40


@dataclass(frozen=True)
class Tree:
    """The menu's regions as a tree: ``bases[i]`` a region, ``parent[i]`` (-1 at the top),
    ``children[i]`` in forward order, ``own[i]`` the menu choices of region ``i`` (its policies)."""

    bases: tuple[str, ...]
    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    own: tuple[tuple[int, ...], ...]

    def ancestors(self, node: int) -> list[int]:
        """``node`` and the nodes above it, innermost first."""
        found = []
        while node >= 0:
            found.append(node)
            node = self.parent[node]
        return found

    def common(self, nodes: Sequence[int]) -> int:
        """The innermost node holding all of ``nodes`` (-1: only the virtual root does)."""
        paths = [self.ancestors(n)[::-1] for n in nodes]
        common = -1
        for step in zip(*paths):
            if len(set(step)) != 1:
                break
            common = step[0]
        return common

    def subtree_choices(self, node: int) -> list[int]:
        found = list(self.own[node])
        for child in self.children[node]:
            found += self.subtree_choices(child)
        return found

    def option_count(self, node: int) -> int:
        """How many plans (sets of disjoint choices, none included) the subtree of ``node`` has."""
        return len(self.own[node]) + math.prod(self.option_count(c) for c in self.children[node])

    def options(self, node: int) -> list[tuple[int, ...]]:
        """Every plan of the subtree of ``node``: the empty one first."""
        parts = [self.options(c) for c in self.children[node]]
        combined = [tuple(itertools.chain.from_iterable(p)) for p in itertools.product(*parts)]
        return combined + [(c,) for c in self.own[node]]


def build_tree(menu) -> Tree | None:
    """The tree of the menu's regions by their spans of forward ops; None when two spans cross
    (runs of a Sequential's children that overlap without nesting)."""
    spans: dict[str, tuple[int, int]] = {}
    own: dict[str, list[int]] = {}
    for c, (base, span) in enumerate(zip(menu.bases, menu.spans)):
        spans[base] = span
        own.setdefault(base, []).append(c)
    # Outer first: a region and one within it over the same ops order by name (the outer is a prefix).
    order = sorted(spans, key=lambda b: (spans[b][0], -spans[b][1], len(b), b))
    number = {b: i for i, b in enumerate(order)}
    parent = [-1] * len(order)
    stack: list[str] = []
    for base in order:
        start, stop = spans[base]
        while stack and spans[stack[-1]][1] < start:
            stack.pop()
        if stack:
            if stop > spans[stack[-1]][1]:
                return None
            parent[number[base]] = number[stack[-1]]
        stack.append(base)
    children: list[list[int]] = [[] for _ in order]
    for i, p in enumerate(parent):
        if p >= 0:
            children[p].append(i)
    return Tree(tuple(order), tuple(parent), tuple(tuple(c) for c in children), tuple(tuple(own[b]) for b in order))


@dataclass
class Component:
    """A unit (``wide`` False: the plans of the subtree of ``node``) or a wide choice set (``wide``
    True: one of the region's own choices), covering units ``first..last`` (1-based); its options
    (tuples of choice indices), and once measured: ``window`` and ``middle`` (inclusive event
    ranges), each option's ``K`` (bytes over the middle), ``need`` (the most bytes at a core event
    under the option alone) and ``cost`` (seconds)."""

    node: int
    wide: bool
    first: int
    last: int
    options: list[tuple[int, ...]]
    window: tuple[int, int] = (0, -1)
    middle: tuple[int, int] = (0, -1)
    K: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    need: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cost: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def in_window(self, e) -> bool:
        return self.window[0] <= e <= self.window[1]

    def in_middle(self, e) -> bool:
        return self.middle[0] <= e <= self.middle[1]

    def in_core(self, e) -> bool:
        return self.in_window(e) and not self.in_middle(e)


@dataclass(frozen=True)
class Boundary:
    """An event outside every unit's core: its bytes under no plan, ``prefix`` (the units whose middle
    holds it: ``1..prefix``) and the wide components holding it in their core (by index)."""

    event: int
    base: int
    prefix: int
    cores: tuple[int, ...]


@dataclass
class ChainStructure:
    """A verified chain (module docstring): ``components`` (units in forward order, then the wide
    ones), ``units`` (how many), ``boundaries`` (the events outside every unit's core)."""

    components: list[Component]
    units: int
    boundaries: list[Boundary]


@dataclass(frozen=True)
class NoChain:
    """Why the rows do not make a chain (the MILP is used)."""

    reason: str


class _Failed(Exception):
    """Checks failed: each of ``groups`` (tree nodes) would hold within the subtree holding them all."""

    def __init__(self, reason: str, nodes: Sequence[int] = (), groups: Sequence[tuple[int, ...]] = ()):
        super().__init__(reason)
        self.groups = tuple(groups) or (tuple(nodes),)


class _Hopeless(Exception):
    """A check failed where no coarser tree within :data:`OPTION_LIMIT` would make it hold."""


@dataclass
class _Facts:
    """What the checks read once per rows: trace events' axis positions, the memory of no plan,
    each choice's interval effect (change points and values after them), forward positions and
    backward/recomputation positions of each choice."""

    rows: PeakRows
    model: RegionModel
    tree: Tree
    base: np.ndarray
    is_twin: np.ndarray
    forward_span: dict[int, tuple[int, int]]  # tree node -> (first, last) axis position of its forward ops
    backward_first: dict[int, int]  # choice -> first axis position of its backward ops or twins
    backward_last: dict[int, int]
    points: dict[int, np.ndarray]
    values: dict[int, np.ndarray]

    @classmethod
    def of(cls, rows: PeakRows, model: RegionModel, tree: Tree) -> _Facts:
        at = np.flatnonzero(rows.owner < 0)
        modules = ModuleNodes.of(model.graph)
        forward_span = {}
        for node, base in enumerate(tree.bases):
            positions = [at[model.index[v]] for v in modules.within(base, "forward")]
            if not positions:
                raise _Hopeless(f"{base} runs no forward op")
            forward_span[node] = (int(min(positions)), int(max(positions)))
        first, last = {}, {}
        for c, choice in enumerate(rows.menu.choices):
            positions = [int(at[b]) for b in model.parts(choice)[1]] + [int(p) for p in np.flatnonzero(rows.owner == c)]
            first[c] = min(positions, default=rows.events)
            last[c] = max(positions, default=-1)
        points, values = {}, {}
        order = np.argsort(rows.choice_of, kind="stable")
        bounds = np.searchsorted(rows.choice_of[order], np.arange(len(rows.menu.choices) + 1))
        for c in range(len(rows.menu.choices)):
            mine = order[bounds[c]:bounds[c + 1]]
            where = np.concatenate([rows.starts[mine], rows.stops[mine] + 1])
            delta = np.concatenate([rows.amounts[mine], -rows.amounts[mine]])
            unique, inverse = np.unique(where, return_inverse=True)
            summed = np.zeros(len(unique), dtype=np.int64)
            np.add.at(summed, inverse, delta)
            keep = summed != 0
            points[c], values[c] = unique[keep], np.cumsum(summed)[keep]
        return cls(rows, model, tree, rows.unmasked_memory(()), rows.owner >= 0, forward_span, first, last,
                   points, values)

    def effect(self, c: int, events: np.ndarray) -> np.ndarray:
        """Choice ``c``'s interval effect (bytes) at ``events``."""
        points, values = self.points[c], self.values[c]
        index = np.searchsorted(points, events, side="right") - 1
        return np.where(index >= 0, values[np.maximum(index, 0)] if len(values) else 0, 0)


def _layout(tree: Tree, units_at: set[int]) -> list[Component]:
    """Components for the tree with the nodes ``units_at`` (and every leaf) as units."""
    units: list[Component] = []
    wides: list[Component] = []

    def visit(node: int) -> None:
        if node in units_at or not tree.children[node]:
            units.append(Component(node, False, len(units) + 1, len(units) + 1, tree.options(node)))
            return
        first = len(units) + 1
        for child in tree.children[node]:
            visit(child)
        for c in tree.own[node]:
            wides.append(Component(node, True, first, len(units), [(c,)]))

    for top, parent in enumerate(tree.parent):
        if parent < 0:
            visit(top)
    return units + wides


def _ranges(facts: _Facts, component: Component, choices: Sequence[int], changes: np.ndarray,
            reaches: tuple[int, int]) -> None:
    """Set ``component``'s window and middle: ``changes`` are the events where some option's effect
    changes, ``reaches`` the first and last event with any effect."""
    forward_first, forward_last = facts.forward_span[component.node]
    backward_first = min((facts.backward_first[c] for c in choices), default=facts.rows.events)
    backward_last = max((facts.backward_last[c] for c in choices), default=-1)
    component.window = (min(forward_first, reaches[0]), max(forward_last, reaches[1], backward_last))
    # The run without a change between the last forward op and the first backward op or recomputation
    # that holds the most trace ops (right after the forward, a region's output may still be read
    # outside it; recomputations of other regions are rows only where those are taken).
    start, stop = forward_last + 1, min(backward_first, facts.rows.events) - 1
    inside = np.unique(changes[(changes > start) & (changes <= stop)])
    edges = np.concatenate([[start], inside, [stop + 1]]).astype(np.int64)
    trace_ops = np.concatenate([[0], np.cumsum(~facts.is_twin)])
    longest = int(np.argmax(trace_ops[np.minimum(edges[1:], facts.rows.events)] - trace_ops[edges[:-1]]))
    component.middle = (int(edges[longest]), int(edges[longest + 1]) - 1)


class _Additivity:
    """The shared results' part of the rows, checked additive over components (module docstring,
    check 1) and read as each unit's change points and reach."""

    def __init__(self, facts: _Facts, owner_of: dict[int, int], components: list[Component], coarsenable):
        self.facts, self.owner_of, self.components = facts, owner_of, components
        self.coarsenable = coarsenable  # nodes -> whether one unit holding them all can be made
        self.changes: dict[int, list[int]] = {}  # unit component index -> events where its effect changes
        self.reach: dict[int, list[int]] = {}

    def check(self) -> None:
        """Raises :class:`_Failed` with every result that is not additive (each a group of nodes)."""
        failures = []
        for result in self.facts.rows.shared:
            try:
                self._result(result)
            except _Failed as failure:
                if not all(self.coarsenable(group) for group in failure.groups):
                    raise _Hopeless(str(failure)) from failure
                failures.append(failure)
        if failures:
            raise _Failed(str(failures[0]), groups=[g for f in failures for g in f.groups])

    def _result(self, result) -> None:
        """One shared result, run of events by run of events (between its breakpoints): each run's
        readers are those at or after its end. Signatures are bit masks over all its readers, read
        once per state; a run masks them to its own."""
        menu = self.facts.rows.menu
        needs = [need for group in result.needs for need in group]
        first_of_break = np.cumsum([0] + [len(group) for group in result.needs])
        removable_all = 0
        for k, (kind, _) in enumerate(needs):
            if kind == "removable":
                removable_all |= 1 << k
        by_component: dict[int, list[int]] = {}
        for c in sorted({what for kind, what in needs if kind == "added"}
                        | {c for kind, what in needs if kind == "removable" for c in what}):
            by_component.setdefault(self.owner_of[c], []).append(c)
        signatures = {q: {state: _signature(needs, state) for state in _antichains(menu, chosen)[1:]}
                      for q, chosen in by_component.items()}
        previous_rep: dict[int, object] = {}
        for k, stop in enumerate(result.breaks):
            start = (result.fixed if k == 0 else result.breaks[k - 1]) + 1
            suffix = ~((1 << int(first_of_break[k])) - 1)  # the readers at this run's end or later
            reps = self._interval(signatures, suffix, removable_all & suffix, result)
            for q in set(reps) | set(previous_rep):
                if self.components[q].wide:
                    continue
                if reps.get(q) != previous_rep.get(q):
                    self.changes.setdefault(q, []).append(start)
                if reps.get(q) is not None:
                    self.reach.setdefault(q, []).extend((start, stop))
            previous_rep = reps
        for q, rep in previous_rep.items():
            if not self.components[q].wide and rep is not None:
                self.changes.setdefault(q, []).append(result.breaks[-1] + 1)

    def _interval(self, signatures, suffix: int, removable: int, result) -> dict[int, object]:
        """Each component's effect on ``result`` over one run of events (None: none), after checking
        that the effects add up over every joint state of the components a plan can take together.
        ``suffix``: the bits of the run's readers; ``removable``: those a choice can remove."""

        def held(added: int, hit: int) -> int:
            return int(added != 0 or removable & ~hit != 0)

        at_none = held(0, 0)
        reps, distinct = {}, {}
        for q, by_state in signatures.items():
            masked = {state: (added & suffix, hit & suffix) for state, (added, hit) in by_state.items()}
            # The effect of every state (not one per signature: the rep is compared across runs of events).
            changed = frozenset((state, held(*sig) - at_none) for state, sig in masked.items()
                                if held(*sig) != at_none)
            reps[q] = changed or None
            kinds = set(masked.values()) - {(0, 0)}
            if kinds:
                distinct[q] = sorted(kinds)
        if len(distinct) > 1:
            self._joint(distinct, held, at_none, result)
        return reps

    def _joint(self, distinct: dict[int, list[tuple[int, int]]], held, at_none: int, result) -> None:
        """Every set of components a plan can take together, each in each of its distinct states
        (``distinct``: signatures of :meth:`_interval`; a state that makes and removes no reader acts
        as none): the result's holding under them all equals the sum of its changes under each.
        Components covering more units go first; once the holding is settled whatever the rest take
        (a reader made, or one no remaining component can remove), the rest must change nothing alone."""
        by_span = sorted(distinct, key=lambda q: (self.components[q].first - self.components[q].last, q))
        can_hit = {q: 0 for q in by_span}
        for q in by_span:
            for _, h in distinct[q]:
                can_hit[q] |= h
        change = {q: [held(a, h) - at_none for a, h in distinct[q]] for q in by_span}
        seen = 0

        def fail(reason: str, used) -> _Failed:
            return _Failed(f"shared result {result.node} {reason}", [self.components[q].node for q in used])

        def extend(rest: list[int], added: int, hit: int, total: int, used: list[int]) -> None:
            """``rest``: the components after those decided that a plan can take with ``used``."""
            nonlocal seen
            seen += 1
            if seen > STATE_LIMIT:
                raise fail("has too many joint states", by_span)
            reachable = 0
            for q in rest:
                reachable |= can_hit[q]
            # Held whatever the rest take: a reader made, or a removable one none of them can remove.
            settled = added != 0 or held(0, hit | reachable) == 1
            if settled or not rest:
                if held(added, hit) - at_none != total:
                    raise fail("is not additive over components", used)
                moving = [q for q in rest if any(change[q])]
                if moving:
                    raise fail("is not additive over components", used + moving[:1])
                return
            q, later = rest[0], rest[1:]
            extend(later, added, hit, total, used)
            with_q = [r for r in later if _together(self.components[q], self.components[r])]
            for (a, h), delta in zip(distinct[q], change[q]):
                extend(with_q, added | a, hit | h, total + delta, used + [q])

        extend(by_span, 0, 0, 0, [])


def _signature(needs, taken: frozenset) -> tuple[int, int]:
    """(the added readers ``taken`` makes, the removable readers it removes) as bit masks over ``needs``."""
    added = hit = 0
    for k, (kind, what) in enumerate(needs):
        if kind == "added" and what in taken:
            added |= 1 << k
        elif kind == "removable" and what & taken:
            hit |= 1 << k
    return added, hit


def _antichains(menu, chosen: Sequence[int]) -> list[frozenset]:
    """Every set of pairwise disjoint choices among ``chosen``, the empty one included."""
    found: list[frozenset] = []

    def extend(current: tuple[int, ...], start: int) -> None:
        found.append(frozenset(current))
        for i in range(start, len(chosen)):
            if all(not menu.overlapping(chosen[i], c) for c in current):
                extend(current + (chosen[i],), i + 1)

    extend((), 0)
    return found


def _measure_wide(facts: _Facts, component: Component) -> None:
    (c,) = component.options[0]
    memory = facts.rows.unmasked_memory((c,))
    effect = memory - facts.base
    nonzero = np.flatnonzero(effect)
    changes = np.flatnonzero(np.diff(effect)) + 1
    reaches = (int(nonzero[0]), int(nonzero[-1])) if len(nonzero) else (facts.rows.events, -1)
    _ranges(facts, component, [c], changes, reaches)
    start, stop = component.middle
    component.K = np.array([int(effect[start])], dtype=np.int64)
    core = _core_events(facts, component, {c})
    component.need = np.array([int(memory[core].max()) if len(core) else -(1 << 62)], dtype=np.int64)
    component.cost = np.array([float(facts.rows.cost[c])])


def _core_events(facts: _Facts, component: Component, twins_of: set[int]) -> np.ndarray:
    """The events of ``component``'s core that are rows: the trace's, and the twins of ``twins_of``."""
    lo, hi = component.window
    events = np.arange(max(lo, 0), min(hi, facts.rows.events - 1) + 1)
    start, stop = component.middle
    events = events[(events < start) | (events > stop)]
    owner = facts.rows.owner[events]
    valid = owner < 0
    if twins_of:
        valid |= np.isin(owner, list(twins_of))
    return events[valid]


def _unit_ranges(facts: _Facts, component: Component, additivity: _Additivity, index: int) -> None:
    choices = sorted({c for option in component.options for c in option})
    changes = [facts.points[c] for c in choices] + [np.array(additivity.changes.get(index, []), dtype=np.int64)]
    changes = np.concatenate(changes) if changes else np.zeros(0, dtype=np.int64)
    firsts = [int(facts.points[c][0]) for c in choices if len(facts.points[c])]
    lasts = [int(facts.points[c][-1]) - 1 for c in choices if len(facts.points[c])]
    reach = additivity.reach.get(index, [])
    reaches = (min(firsts + reach, default=facts.rows.events), max(lasts + reach, default=-1))
    _ranges(facts, component, choices, changes, reaches)


def _measure_unit(facts: _Facts, component: Component) -> None:
    """Each option's ``K``, ``need`` and ``cost`` from the rows, the option alone."""
    rows = facts.rows
    choices = sorted({c for option in component.options for c in option})
    core = _core_events(facts, component, set(choices))
    reference = component.middle[0]
    events = np.append(core, reference)
    effects = np.stack([facts.effect(c, events) for c in choices]) if choices else np.zeros((0, len(events)))
    column = {c: i for i, c in enumerate(choices)}
    incidence = np.zeros((len(component.options), len(choices)), dtype=np.int64)
    for i, option in enumerate(component.options):
        incidence[i, [column[c] for c in option]] = 1
    memory = facts.base[events][None, :] + incidence @ effects
    taken = incidence.astype(bool)
    for result in rows.shared:
        last = _alive_until(result, taken, column)
        if last is None:
            continue
        at_none = result.alive_until(set())
        longer = (events[None, :] > at_none) & (events[None, :] <= last[:, None])
        shorter = (events[None, :] > last[:, None]) & (events[None, :] <= at_none)
        memory += result.mem * (longer.astype(np.int64) - shorter.astype(np.int64))
    owner = rows.owner[core]
    valid = np.ones((len(component.options), len(core)), dtype=bool)
    twin_columns = np.flatnonzero(owner >= 0)
    if len(twin_columns):  # a recomputation's event is a row only under an option taking its choice
        valid[:, twin_columns] = taken[:, [column[int(o)] for o in owner[twin_columns]]]
    core_memory = np.where(valid, memory[:, :-1], -(1 << 62))
    component.need = core_memory.max(axis=1) if len(core) else np.full(len(component.options), -(1 << 62))
    component.K = memory[:, -1] - facts.base[reference]
    component.cost = np.array([float(sum(rows.cost[c] for c in option)) for option in component.options])


def _alive_until(result, taken: np.ndarray, column: dict[int, int]) -> np.ndarray | None:
    """:meth:`Shared.alive_until` for each row of ``taken`` (options x the choices of ``column``), or
    None when no choice of ``column`` moves ``result``."""
    last = np.full(len(taken), result.fixed, dtype=np.int64)
    moved = False
    for position, needs in zip(result.breaks, result.needs):
        active = np.zeros(len(taken), dtype=bool)
        for kind, what in needs:
            if kind == "added":
                if what in column:
                    active |= taken[:, column[what]]
                    moved = True
            else:
                mine = [column[c] for c in what if c in column]
                moved |= bool(mine)
                active |= ~taken[:, mine].any(axis=1) if mine else True
        last = np.where(active, position, last)
    return last if moved else None


def _together(a: Component, b: Component) -> bool:
    """Whether a plan can take components ``a`` and ``b`` together (their units do not overlap)."""
    return a.last < b.first or b.last < a.first


def _check_nesting(facts: _Facts, components: list[Component]) -> None:
    for a in components:
        for b in components:
            if a is b or not a.last < b.first:
                continue
            if not (a.middle[0] <= b.window[0] and b.window[1] <= a.middle[1]):
                raise _Failed(f"{facts.tree.bases[b.node]} is not within the middle of {facts.tree.bases[a.node]}",
                              [a.node, b.node])
    units = [q for q in components if not q.wide]
    for d in components:
        if not d.wide:
            continue
        for u in units[d.first - 1:d.last]:
            # With d taken the unit's recomputations are not rows: its trace events only.
            core = _core_events(facts, u, set())
            outside = core[(core < d.window[0]) | (core > d.window[1]) | ((core >= d.middle[0]) & (core <= d.middle[1]))]
            if len(outside):
                raise _Failed(f"the core of {facts.tree.bases[u.node]} is not within the core of "
                              f"{facts.tree.bases[d.node]}", [d.node])
    for q in components:  # a recomputation's event is a row only where its choice is taken: in its component's core
        mine = {c for option in q.options for c in option}
        twins = np.flatnonzero(np.isin(facts.rows.owner, list(mine)))
        if len(twins) and not all(q.in_core(t) for t in twins):
            raise _Failed(f"a recomputation of {facts.tree.bases[q.node]} outside its core", [q.node])


def _boundaries(facts: _Facts, components: list[Component], units: int) -> list[Boundary]:
    """The events outside every unit's core, each with its prefix and the wide cores holding it
    (module docstring, check 3)."""
    events = np.flatnonzero(~facts.is_twin)
    unit_list = components[:units]
    middle = np.array([(events >= u.middle[0]) & (events <= u.middle[1]) for u in unit_list])
    window = np.array([(events >= u.window[0]) & (events <= u.window[1]) for u in unit_list])
    in_core = (window & ~middle).any(axis=0)
    prefix = middle.sum(axis=0)
    found = []
    wides = [(i, q) for i, q in enumerate(components) if q.wide]
    for column in np.flatnonzero(~in_core):
        e, m = int(events[column]), int(prefix[column])
        if not middle[:m, column].all() or window[m:, column].any():
            holders = [unit_list[j].node for j in np.flatnonzero(window[:, column])]
            raise _Failed(f"event {e}: the units around it are not a chain", holders)
        cores = []
        for i, d in wides:
            if d.in_core(e):
                cores.append(i)
            elif d.last <= m and not d.in_middle(e) or d.first > m and d.in_window(e) or d.first <= m < d.last:
                raise _Failed(f"event {e}: {facts.tree.bases[d.node]} neither holds it in its core nor lies "
                              "before or after it", [d.node])
        found.append(Boundary(e, int(facts.base[e]), m, tuple(cores)))
    return found


def _attempt(facts: _Facts, units_at: set[int]) -> ChainStructure:
    tree = facts.tree
    components = _layout(tree, units_at)
    units = sum(not q.wide for q in components)
    too_big = [q for q in components if not q.wide and len(q.options) > OPTION_LIMIT]
    if too_big:
        raise _Failed(f"{tree.bases[too_big[0].node]}: more than {OPTION_LIMIT} plans")
    owner_of = {c: i for i, q in enumerate(components) for option in q.options for c in option}
    additivity = _Additivity(facts, owner_of, components, lambda nodes: _coarsened(tree, units_at, nodes) is not None)
    additivity.check()
    for i, q in enumerate(components):
        if q.wide:
            _measure_wide(facts, q)
        else:
            _unit_ranges(facts, q, additivity, i)
    _check_nesting(facts, components)
    boundaries = _boundaries(facts, components, units)
    for q in components:
        if not q.wide:
            _measure_unit(facts, q)
    return ChainStructure(components, units, boundaries)


def _coarsened(tree: Tree, units_at: set[int], nodes: Sequence[int]) -> int | None:
    """The node whose subtree, made one unit, holds ``nodes``; None where there is none new within
    :data:`OPTION_LIMIT` plans."""
    common = tree.common([n for n in nodes if n >= 0]) if nodes else -1
    if common < 0 or common in units_at or not tree.children[common] or tree.option_count(common) > OPTION_LIMIT:
        return None
    return common


def chain_structure(rows: PeakRows, model: RegionModel) -> ChainStructure | NoChain:
    """The rows as a verified chain (module docstring), or why they are not one."""
    tree = build_tree(rows.menu)
    if tree is None:
        return NoChain("the menu's regions cross (runs of a Sequential's children)")
    try:
        facts = _Facts.of(rows, model, tree)
    except _Hopeless as failure:
        return NoChain(str(failure))
    units_at: set[int] = set()
    for _ in range(ROUNDS):
        try:
            return _attempt(facts, units_at)
        except _Hopeless as failure:
            return NoChain(str(failure))
        except _Failed as failure:
            coarser = set(units_at)
            for group in failure.groups:
                common = _coarsened(tree, units_at, group)
                if common is None:
                    return NoChain(str(failure))
                coarser.add(common)
            # A unit within another is part of it.
            units_at = {n for n in coarser if not any(a in coarser for a in tree.ancestors(n)[1:])}
    return NoChain("no chain after coarsening the tree")
