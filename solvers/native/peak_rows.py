"""The peak of a native plan as linear rows over the menu's choices: exact at every plan.

solvers/regions/ defines what checkpointing a set of regions does (:func:`~solvers.regions.evaluate`,
its fast twin :class:`~solvers.regions.RegionModel`): one sequence of *events* (every op of the
trace in order, each chosen region's recomputed ops, its *twins*, inserted right before its trigger),
every result held from its event until its last reader's. This module reads the same parts
(``RegionModel.parts``: each region's recomputed ops, backward ops, trigger and what its checkpoint
holds, from :func:`~solvers.regions.region_costs`) and writes the memory during each event as

    memory(e) = constant(e) + sum_c delta_c(e) x_c + sum_v mem_v z_v(e)

over binary ``x_c`` (choice ``c`` taken). A result's lifetime ends at its last reader, so a choice
changes the memory only through the results whose last reader it moves: it removes readers (a
backward op of the region reads the recomputed twin instead of the first run's result), or adds them
(a twin reads an input; the checkpoint holds its inputs to the region's last backward op).

- A result whose readers only choices of one *clique* move (choices that overlap, so a plan takes at
  most one of them: a module under its policies and its submodules) has one lifetime per choice:
  its change of lifetime under choice ``c`` alone is part of ``delta_c``, exactly.
- A result that non-overlapping choices move (a block's output, read again by the next block's
  recomputation and held by its checkpoint while the block that made it drops its other readers) is
  *shared*: ``z_v(e)`` is 1 while some reader at or after ``e`` is active, by rows
  ``z >= active(reader)`` (a removable reader is active unless the choice removing it is taken, an
  added one when its choice is), monotone in ``e``. At a binary ``x`` the least ``z`` is the
  lifetime itself, so the rows are exact there; relaxed, they never over-estimate.

Events are placed on one axis: each choice's twins before its trigger (choices with the same trigger
in menu order, as ``evaluate`` orders a plan's regions). A twin's event exists only when its choice
is taken: its row holds only then. Units: bytes for memory, seconds for cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..regions.region_model import RegionModel
from .menu import Menu

BASE = 1  # event kinds in the axis's sort key: a choice's twins (0) come before the op they precede (1)


@dataclass(frozen=True)
class Shared:
    """A result whose lifetime non-overlapping choices move: held on axis events ``(born, fixed]``
    whatever the plan; after ``fixed``, on the events up to breakpoint ``breaks[j]`` while ``z_j``.
    ``needs[j]``: what makes ``z_j`` 1: ``("added", c)`` (a reader of choice ``c``) or
    ``("removable", (c, ...))`` (a reader the choices ``c, ...`` each remove)."""

    node: int
    mem: int
    born: int
    fixed: int
    breaks: tuple[int, ...]
    needs: tuple[tuple[tuple[str, object], ...], ...]

    def alive_until(self, taken: set[int]) -> int:
        """The last axis event this result is held at under the plan ``taken`` (choice indices)."""
        last = self.fixed
        for position, needs in zip(self.breaks, self.needs):
            for kind, what in needs:
                if kind == "added" and what in taken or kind == "removable" and not taken.intersection(what):
                    last = position
        return last


@dataclass
class PeakRows:
    """The linear model of the module docstring for one graph and menu.

    ``constant[e]``: bytes held (and, at ``e``, computed) whatever the plan, on axis event ``e``;
    ``owner[e]``: the choice whose twin event ``e`` is (-1 for the trace's own events); ``cost[c]``:
    seconds choice ``c`` adds to the step; ``intervals``: ``delta_c`` as (start, stop, bytes,
    choice) arrays, ``bytes`` added on events ``start..stop`` inclusive; ``shared``: the results of
    :class:`Shared`."""

    menu: Menu
    base_cost: float
    cost: np.ndarray
    constant: np.ndarray
    owner: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    amounts: np.ndarray
    choice_of: np.ndarray
    shared: list[Shared] = field(default_factory=list)
    # Axis event of each choice's trigger (the trace op its twins precede), -1 for a choice without twins.
    trigger_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    own: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # bytes of the event's own result

    @property
    def events(self) -> int:
        return len(self.constant)

    def memory(self, taken: set[int]) -> np.ndarray:
        """Bytes during each axis event under the plan ``taken`` (choice indices); the events of twins
        of choices not taken hold no meaning (set to -1)."""
        memory = self.unmasked_memory(taken)
        chosen = np.zeros(len(self.menu.choices), dtype=bool)
        chosen[list(taken)] = True
        memory[(self.owner >= 0) & ~chosen[np.maximum(self.owner, 0)]] = -1
        return memory

    def unmasked_memory(self, taken) -> np.ndarray:
        """Bytes at every axis event under ``taken`` (choice indices), the events of twins of choices
        not taken included (the rows' value there: what solvers/native/chain.py's checks read)."""
        taken = set(taken)
        chosen = np.zeros(len(self.menu.choices), dtype=bool)
        chosen[list(taken)] = True
        mask = chosen[self.choice_of]
        change = np.zeros(self.events + 1, dtype=np.int64)
        np.add.at(change, self.starts[mask], self.amounts[mask])
        np.add.at(change, self.stops[mask] + 1, -self.amounts[mask])
        for result in self.shared:
            last = result.alive_until(taken)
            if last > result.fixed:
                change[result.fixed + 1] += result.mem
                change[last + 1] -= result.mem
        return self.constant + np.cumsum(change[:-1])

    def row(self, event: int) -> tuple[int, np.ndarray, list[tuple[int, int, int]]]:
        """Event ``event``'s row: (constant bytes, bytes per choice, [(shared index, breakpoint j, bytes)])."""
        covering = (self.starts <= event) & (event <= self.stops)
        per_choice = np.bincount(self.choice_of[covering], weights=self.amounts[covering],
                                 minlength=len(self.menu.choices)).astype(np.int64)
        terms = []
        for index, result in enumerate(self.shared):
            if result.fixed < event <= result.breaks[-1]:
                j = next(j for j, position in enumerate(result.breaks) if event <= position)
                terms.append((index, j, result.mem))
        return int(self.constant[event]), per_choice, terms

    def twin_row(self, event: int) -> tuple[int, np.ndarray, list[tuple[int, int, int]], int] | None:
        """The row of twin event ``event`` of choice ``d`` as the trigger's row plus ``x_d`` times what
        the twin event adds: (bytes the row may hold besides the terms, bytes per choice, shared
        terms, bytes on ``x_d``). At ``x_d = 0`` it is implied by the trigger's row (every term of it
        or less), so no big-M: at ``x_d = 1`` it is the event's memory, since every other choice
        moves memory alike at the event and at its trigger (none of them has an event between
        them). None where some choice that does not overlap ``d`` has the same trigger (its twins
        come between): the caller then uses the plain row with a big-M."""
        d = int(self.owner[event])
        trigger = int(self.trigger_at[d])
        menu = self.menu
        same = np.flatnonzero(self.trigger_at == trigger)
        if any(c != d and not menu.overlapping(int(c), d) for c in same):
            return None
        constant_t, per_choice_t, shared_t = self.row(trigger)
        constant_e, per_choice_e, shared_e = self.row(event)
        own_t = int(self.own[trigger])
        per_choice = per_choice_t.copy()
        per_choice[d] = 0
        on_d = int(per_choice_e[d]) + int(constant_e) - (int(constant_t) - own_t)
        added_after = {index for index, result in enumerate(self.shared)
                       if any(p >= event and ("added", d) in needs for p, needs in zip(result.breaks, result.needs))}
        for index, _, amount in shared_e:
            if index in added_after:
                on_d += amount  # read again by d's recomputation (or held by its checkpoint) after this event
        terms = [(index, j, amount) for index, j, amount in shared_t if index not in added_after]
        return int(constant_t) - own_t, per_choice, terms, on_d

    def cost_of(self, taken: set[int]) -> float:
        """Predicted seconds of the step under ``taken``."""
        return self.base_cost + float(sum(self.cost[c] for c in taken))


@dataclass(frozen=True)
class _Axis:
    """Where each event sits on the axis: ``at[i]`` the position of trace op ``i``; ``slot_at[c]`` the
    positions of choice ``c``'s twins (empty for a choice without twins); ``owner`` and ``own`` as in
    :class:`PeakRows` (own: bytes, the event's result and workspace)."""

    at: list[int]
    slot_at: list[list[int]]
    owner: np.ndarray
    own: np.ndarray

    @property
    def events(self) -> int:
        return len(self.owner)


@dataclass(frozen=True)
class _Lifetimes:
    """What the rows read of the trace: ``readers[v]`` (trace ops reading result ``v``), the axis, and
    the last event ``end`` (where results kept past the step are held to)."""

    model: RegionModel
    axis: _Axis
    readers: list[list[int]]

    @property
    def end(self) -> int:
        return self.axis.events - 1

    def last_without(self, v: int, removed: set[int]) -> int:
        """The axis event of result ``v``'s last reader other than the trace ops ``removed``."""
        if self.model.kept[v]:
            return self.end
        at = self.axis.at
        return max((at[r] for r in self.readers[v] if r not in removed), default=at[v])


@dataclass
class _Moves:
    """How the choices move the results' readers: ``removes[v][c]``, the trace readers of ``v`` that
    choice ``c`` removes; ``adds[v][c]``, the latest axis event at which ``c`` adds a reader of ``v``;
    ``intervals``, the twins' own lifetimes as (start, stop, bytes, choice)."""

    removes: dict[int, dict[int, set[int]]] = field(default_factory=dict)
    adds: dict[int, dict[int, int]] = field(default_factory=dict)
    intervals: list[tuple[int, int, int, int]] = field(default_factory=list)

    def add_reader(self, v: int, c: int, event: int) -> None:
        self.adds.setdefault(v, {})
        self.adds[v][c] = max(self.adds[v].get(c, -1), event)


def _choice_costs(model: RegionModel, parts: list[tuple]) -> np.ndarray:
    """Seconds each choice adds to the step: its recomputed ops' seconds and what the checkpoint itself
    costs (region_costs' ``seconds``, what RegionModel and evaluate add to the step for it;
    tests/test_regions_exact.py checks the sum)."""
    return np.array([float(sum(model.cost[w] for w in recomputed)) + float(overhead)
                     for recomputed, _, _, _, overhead in parts])


def _build_axis(model: RegionModel, parts: list[tuple]) -> _Axis:
    """The events on one axis: the trace's ops in order, each choice's twins right before its trigger
    (choices with the same trigger in menu order)."""
    n = len(model.order)
    keys = [(i, BASE, 0, 0) for i in range(n)]
    slots: list[list[int]] = []
    for c, (recomputed, _, trigger, _, _) in enumerate(parts):
        active = trigger is not None and bool(recomputed)
        slots.append([len(keys) + k for k in range(len(recomputed))] if active else [])
        if active:
            keys += [(trigger, 0, c, k) for k in range(len(recomputed))]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    position = np.empty(len(keys), dtype=np.int64)
    position[order] = np.arange(len(keys))
    events = len(keys)
    at = [int(position[i]) for i in range(n)]
    slot_at = [[int(position[s]) for s in choice_slots] for choice_slots in slots]
    owner = np.full(events, -1, dtype=np.int64)
    own = np.zeros(events, dtype=np.int64)
    for i in range(n):
        own[at[i]] = model.mem[i] + model.workspace[i]
    for c, (recomputed, *_rest) in enumerate(parts):
        for k, w in enumerate(recomputed if slot_at[c] else ()):
            owner[slot_at[c][k]] = c
            own[slot_at[c][k]] = model.mem[w] + model.workspace[w]
    return _Axis(at, slot_at, owner, own)


def _readers(model: RegionModel) -> list[list[int]]:
    """The trace ops reading each trace op's result, in trace order."""
    readers: list[list[int]] = [[] for _ in range(len(model.order))]
    for i in range(len(model.order)):
        for p in model.preds[i]:
            readers[p].append(i)
    return readers


def _twin_intervals(model: RegionModel, axis: _Axis, c: int, recomputed, backward,
                    holds: dict[int, list[int]]) -> list[tuple[int, int, int, int]]:
    """Choice ``c``'s twins' own lifetimes, from their event to their last reader (a later twin, a
    backward op) or the later twin until which the region's program holds them (``holds``:
    RegionModel.twin_holds), as (start, stop, bytes, choice)."""
    slots = axis.slot_at[c]
    if not slots:
        return []
    twin_index = {w: k for k, w in enumerate(recomputed)}
    last_twin = {w: slots[k] for w, k in twin_index.items()}
    for k, w in enumerate(recomputed):
        for p in [*model.preds[w], *holds.get(w, ())]:
            if p in twin_index:
                last_twin[p] = max(last_twin[p], slots[k])
    for b in backward:
        for p in model.preds[b]:
            if p in twin_index:
                last_twin[p] = max(last_twin[p], axis.at[b])
    return [(slots[k] + 1, last_twin[w], model.mem[w], c) for w, k in twin_index.items() if last_twin[w] > slots[k]]


def _choice_moves(trace: _Lifetimes, parts: list[tuple], holds: list[dict[int, list[int]]]) -> _Moves:
    """Every way each choice moves a result's readers: removed (backward ops reading the twin), added
    (a twin reading an input; the checkpoint holding what it holds to the region's last backward op)."""
    model, axis = trace.model, trace.axis
    moves = _Moves()
    for c, (recomputed, backward, _trigger, held, _) in enumerate(parts):
        inside = set(recomputed)
        backward_set = set(backward)
        for v in recomputed:
            gone = {r for r in trace.readers[v] if r in backward_set}
            if gone:
                moves.removes.setdefault(v, {})[c] = gone
        for k, w in enumerate(recomputed if axis.slot_at[c] else ()):
            for p in model.preds[w]:
                if p not in inside:
                    moves.add_reader(p, c, axis.slot_at[c][k])
        if backward:
            for v in held:
                moves.add_reader(v, c, axis.at[backward[-1]])
        moves.intervals += _twin_intervals(model, axis, c, recomputed, backward, holds[c])
    return moves


def _hold(change: np.ndarray, born: int, last: int, mem: int) -> None:
    """Add ``mem`` bytes held on events ``born + 1 .. last`` to the difference array ``change``."""
    if last > born:
        change[born + 1] += mem
        change[last + 1] -= mem


def _clique_intervals(trace: _Lifetimes, moves: _Moves, v: int, movers: set[int],
                      plain_last: int) -> list[tuple[int, int, int, int]]:
    """Result ``v``'s lifetime per choice of one clique (at most one is taken), as its change against
    ``plain_last`` (the last reader under no choice): (start, stop, bytes, choice)."""
    born, mem = trace.axis.at[v], trace.model.mem[v]
    removes, adds = moves.removes.get(v, {}), moves.adds.get(v, {})
    intervals = []
    for c in movers:
        last = max(trace.last_without(v, removes.get(c, set())), adds.get(c, -1))
        if last > plain_last:
            intervals.append((plain_last + 1, last, mem, c))
        elif last < plain_last:
            intervals.append((max(last, born) + 1, plain_last, -mem, c))
    return intervals


def _shared(trace: _Lifetimes, moves: _Moves, v: int, fixed: int) -> Shared:
    """Result ``v`` as a :class:`Shared`: held to ``fixed`` whatever the plan, after it while some reader
    is active (a removable one unless every choice removing it is taken; an added one when its choice is)."""
    at = trace.axis.at
    removes, adds = moves.removes.get(v, {}), moves.adds.get(v, {})
    needs: dict[int, list] = {}
    for r in trace.readers[v]:
        if at[r] <= fixed:
            continue
        who = tuple(sorted(c for c, gone in removes.items() if r in gone))
        needs.setdefault(at[r], []).append(("removable", frozenset(who)))
    for c, latest in adds.items():
        if latest > fixed:
            needs.setdefault(latest, []).append(("added", c))
    # Added readers earlier than a choice's latest one never end the lifetime later than it: the latest is enough.
    breaks = tuple(sorted(needs))
    return Shared(v, trace.model.mem[v], at[v], fixed, breaks, tuple(tuple(needs[p]) for p in breaks))


def _result_rows(trace: _Lifetimes, moves: _Moves, menu: Menu, v: int, constant_change: np.ndarray,
                 intervals: list, shared: list[Shared]) -> None:
    """Result ``v``'s bytes in the rows: held whatever the plan (into ``constant_change``), per choice
    of one clique (into ``intervals``) or as a :class:`Shared` (into ``shared``)."""
    born, mem = trace.axis.at[v], trace.model.mem[v]
    removes, adds = moves.removes.get(v, {}), moves.adds.get(v, {})
    plain_last = trace.last_without(v, set())
    if not (set(removes) | set(adds)) or trace.model.kept[v]:
        _hold(constant_change, born, plain_last, mem)
        return
    fixed = trace.last_without(v, set().union(*removes.values()) if removes else set())
    at = trace.axis.at
    movers = {c for c, gone in removes.items() if any(at[r] > fixed for r in gone)}
    movers |= {c for c, latest in adds.items() if latest > fixed}
    if menu.one_clique(movers):
        _hold(constant_change, born, plain_last, mem)
        intervals += _clique_intervals(trace, moves, v, movers, plain_last)
        return
    _hold(constant_change, born, fixed, mem)
    shared.append(_shared(trace, moves, v, fixed))


def build_rows(graph: nx.DiGraph, menu: Menu, model: RegionModel | None = None) -> PeakRows:
    """The :class:`PeakRows` of ``menu`` on ``graph`` (the profiler's op graph; ``model`` its
    :class:`RegionModel`, when the caller has one)."""
    model = model or RegionModel(graph)
    parts = [model.parts(choice) for choice in menu.choices]  # (recomputed, backward, trigger, held, overhead)
    axis = _build_axis(model, parts)
    trace = _Lifetimes(model, axis, _readers(model))
    moves = _choice_moves(trace, parts, [model.twin_holds(choice) for choice in menu.choices])
    constant_change = np.zeros(axis.events + 1, dtype=np.int64)
    intervals = list(moves.intervals)
    shared: list[Shared] = []
    for v in range(len(model.order)):
        _result_rows(trace, moves, menu, v, constant_change, intervals, shared)
    constant = axis.own + np.cumsum(constant_change[:-1])
    if intervals:
        starts, stops, amounts, choice_of = (np.array(column, dtype=np.int64) for column in zip(*intervals))
    else:
        starts = stops = amounts = choice_of = np.zeros(0, dtype=np.int64)
    trigger_at = np.array([axis.at[trigger] if axis.slot_at[c] else -1 for c, (_, _, trigger, _, _) in enumerate(parts)],
                          dtype=np.int64)
    return PeakRows(menu, model.peak_and_cost(())[1], _choice_costs(model, parts), constant, axis.owner,
                    starts, stops, amounts, choice_of, shared, trigger_at, axis.own)
