"""What native checkpointing of a set of regions executes, and its predicted peak and time: the
region graph (a twin node per recomputed op), the one schedule PyTorch runs on it, and
``solvers.simulate`` of that schedule (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from ..autograd_nodes import autograd_node_holds
from ..extractions import count_extractions_once
from ..in_place import count_in_place_once
from ..liveness import schedule_from_computes
from ..schedule import Schedule
from ..simulate import Simulation, simulate
from .candidates import checkpointable
from .costs import region_costs
from .early_stop import program_holds
from .members import forward_nodes_of, trace_order
from .names import RECOMPUTE, twin


@dataclass(frozen=True)
class RegionPlan:
    """The chosen regions with the schedule that predicts them (see the package docstring, solvers/regions/__init__.py)."""

    regions: tuple[str, ...]
    graph: nx.DiGraph = field(repr=False)
    schedule: Schedule = field(repr=False)
    outcome: Simulation = field(repr=False)


def as_eager_runs(graph: nx.DiGraph) -> nx.DiGraph:
    """The op graph's memory as eager autograd holds it (solvers/autograd_nodes.py,
    solvers/extractions.py, solvers/in_place.py): what the native executor runs."""
    return count_in_place_once(count_extractions_once(autograd_node_holds(graph)))


def _check_disjoint(graph: nx.DiGraph, regions: Sequence[str]) -> None:
    owner: dict[Hashable, str] = {}
    for region in regions:
        for v in forward_nodes_of(graph, region):
            if v in owner:
                raise ValueError(f"checkpoint regions {owner[v]!r} and {region!r} overlap; nested checkpoints are "
                                 "not planned: give one of them")
            owner[v] = region


def region_graph(graph: nx.DiGraph, regions: Iterable[str]) -> nx.DiGraph:
    """``graph`` with the recomputations of ``regions`` as twin nodes (see the package docstring, solvers/regions/__init__.py).

    A twin ``"recompute:v"`` costs and holds what ``v`` does and reads the twins of its
    predecessors inside the recomputed prefix, the originals otherwise (the region's held inputs,
    the results its policy saved). Backward ops of the region read twins instead of the originals.
    Liveness edges (``hold=True``, not data) to the region's last backward op keep what the
    checkpoint holds until then: the region's inputs, and saved results no one reads again (the
    policy's cache keeps them while the recomputation stops before it reaches them)."""
    regions = list(regions)
    _check_disjoint(graph, regions)
    graph = as_eager_runs(graph)
    result = graph.copy()
    for region in regions:
        reason = checkpointable(graph, region)
        if reason is not None:
            raise ValueError(reason)
        parts = region_costs(graph, region)
        recomputed = set(parts.recomputed)
        backward = set(parts.backward)
        if parts.overhead_seconds:  # what the checkpoint itself costs, on the op that enters it
            entry = result.nodes[parts.nodes[0]]
            entry["cost"] = float(entry["cost"]) + parts.overhead_seconds
            entry["checkpoint_overhead"] = parts.overhead_seconds
        for v in parts.recomputed:
            data = dict(graph.nodes[v])
            data.update(kind=RECOMPUTE, recomputes=v)
            data.pop("pinned", None)
            data.pop("output", None)
            result.add_node(twin(v), **data)
            for p in graph.predecessors(v):
                result.add_edge(twin(p) if p in recomputed else p, twin(v))
            for s in list(graph.successors(v)):
                if s in backward:
                    data = result.edges[v, s]
                    result.remove_edge(v, s)
                    result.add_edge(twin(v), s, **data)
        for v, holder in program_holds(graph, parts.recomputed):  # what the program holds (early_stop.py)
            if not result.has_edge(twin(v), twin(holder)):
                result.add_edge(twin(v), twin(holder), hold=True)
        if not parts.backward:
            continue
        last = parts.backward[-1]
        for p in parts.held_to_the_end(graph):
            if not result.has_edge(p, last):
                result.add_edge(p, last, hold=True)
    return result


def region_computes(graph: nx.DiGraph, regions: Iterable[str]) -> list[Hashable]:
    """The order native checkpointing computes ``region_graph(graph, regions)``'s nodes in: trace
    order, each region's twins right before its trigger (the first backward op that unpacks
    something the region packed)."""
    triggers: dict[Hashable, list[Hashable]] = {}
    for region in regions:
        parts = region_costs(graph, region)
        if parts.trigger is not None and parts.recomputed:
            triggers.setdefault(parts.trigger, []).extend(twin(v) for v in parts.recomputed)
    computes: list[Hashable] = []
    for v in trace_order(graph):
        computes.extend(triggers.get(v, ()))
        computes.append(v)
    return computes


def region_schedule(graph: nx.DiGraph, regions: Iterable[str]) -> tuple[nx.DiGraph, Schedule]:
    """The region graph and the schedule native checkpointing of ``regions`` executes on it."""
    regions = list(regions)
    augmented = region_graph(graph, regions)
    return augmented, schedule_from_computes(augmented, region_computes(graph, regions))


def evaluate(graph: nx.DiGraph, regions: Iterable[str]) -> RegionPlan:
    """Simulate native checkpointing of ``regions``: peak (bytes, the schedule's part) and time."""
    regions = tuple(regions)
    augmented, schedule = region_schedule(graph, regions)
    outcome = simulate(augmented, schedule)
    if not outcome.valid:  # a bug in this module: the region graph is built to be executable
        raise AssertionError(f"region schedule is not executable: {outcome.error}")
    return RegionPlan(regions, augmented, schedule, outcome)
