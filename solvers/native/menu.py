"""The native executor's menu: every region a plan may checkpoint, each plain or under a save
policy, and which of them overlap.

A *choice* is a region name as plan files keep it (``"transformer.h.3"``, ``"layers[2:5]@matmuls"``,
solvers/regions/). A plan is a set of choices whose regions are disjoint: no forward op in two of
them (nested checkpoints are not on the menu). The menu's order is the order plans list their regions
in (:func:`solvers.regions.evaluate` inserts the recomputations of regions that start at the same
backward op in that order).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import networkx as nx

from ..regions.candidates import candidate_regions, checkpointable
from ..regions.members import ModuleNodes
from ..regions.names import segment
from ..regions.policies import split_policy
from ..regions.prediction import as_eager_runs
from ..regions.region_model import RegionModel


@dataclass(frozen=True)
class Menu:
    """``choices`` in plan order; ``bases[i]`` the region of choice ``i`` without its policy;
    ``cliques``: sets of choice indices of which a plan takes at most one (they share a forward op);
    ``spans``: each choice's forward ops as (first, last) positions among the trace's forward ops (a
    checkpointable region's forward ops are one contiguous run: :func:`~solvers.regions.checkpointable`)."""

    choices: tuple[str, ...]
    bases: tuple[str, ...]
    cliques: tuple[tuple[int, ...], ...]
    spans: tuple[tuple[int, int], ...]

    def overlapping(self, first: int, second: int) -> bool:
        """Whether choices ``first`` and ``second`` cannot be in one plan (a choice overlaps itself)."""
        (a, b), (c, d) = self.spans[first], self.spans[second]
        return a <= d and c <= b

    def one_clique(self, indices) -> bool:
        """Whether every two of the choices ``indices`` overlap: a plan takes at most one of them.
        Intervals overlap pairwise exactly when the latest start is at or before the earliest end."""
        spans = [self.spans[i] for i in indices]
        return not spans or max(a for a, _ in spans) <= min(b for _, b in spans)


def all_segments(graph: nx.DiGraph, sequentials: dict[str, int]) -> list[str]:
    """Every run of two or more children of each ``nn.Sequential`` in ``sequentials`` (path ->
    number of children) that :func:`~solvers.regions.checkpointable` accepts, fewer than all of them
    (all of them is the container itself, a module region)."""
    runs = []
    for path, count in sequentials.items():
        for start in range(count):
            for stop in range(start + 2, count + (1 if start > 0 else 0)):
                run = segment(path, start, stop)
                if checkpointable(graph, run) is None:
                    runs.append(run)
    return runs


def build_menu(graph: nx.DiGraph, candidates: Sequence[str] | None = None, sequentials: dict[str, int] | None = None,
               policies: Sequence[str] = (), model: RegionModel | None = None) -> Menu:
    """The menu over ``candidates`` (module regions, default every checkpointable module) and every
    run of the ``sequentials``' children, each plain and under each of ``policies`` (names of
    solvers/regions/policies.py ``SAVE_POLICIES``). With ``model`` (the graph's :class:`RegionModel`), a
    choice that checkpoints exactly as an earlier one does (the same recomputed ops, backward ops,
    trigger and held results: ``projections`` in a region without ``bmm``, where it saves what
    ``matmuls`` saves) is left out: the same plan, half the columns on such models."""
    graph = as_eager_runs(graph)
    if candidates is None:
        candidates = candidate_regions(graph)
    plain = list(dict.fromkeys([*candidates, *all_segments(graph, sequentials or {})]))
    choices = plain + [f"{r}@{policy}" for policy in policies for r in plain]
    if model is not None:
        first: dict[tuple, str] = {}
        for choice in choices:
            recomputed, backward, trigger, held, overhead = model.parts(choice)
            first.setdefault((tuple(recomputed), tuple(backward), trigger, tuple(held), overhead), choice)
        kept = set(first.values())
        choices = [c for c in choices if c in kept]
    by_module = ModuleNodes.of(graph)
    nodes_of = {r: by_module.within(r, "forward") for r in dict.fromkeys(split_policy(c)[0] for c in choices)}
    owners: dict[Hashable, list[int]] = {}
    for index, choice in enumerate(choices):
        for v in nodes_of[split_policy(choice)[0]]:
            owners.setdefault(v, []).append(index)
    distinct = {tuple(sorted(group)) for group in owners.values() if len(group) > 1}
    # A clique inside a larger one adds no row.
    cliques = [c for c in distinct if not any(len(o) > len(c) and set(c) <= set(o) for o in distinct)]
    forward = {v: i for i, v in enumerate(v for v, kind in graph.nodes(data="kind") if kind == "forward")}
    spans = {r: (forward[nodes[0]], forward[nodes[-1]]) for r, nodes in nodes_of.items()}
    bases = tuple(split_policy(c)[0] for c in choices)
    return Menu(tuple(choices), bases, tuple(sorted(cliques)), tuple(spans[b] for b in bases))
