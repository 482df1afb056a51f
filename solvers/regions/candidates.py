"""The regions a graph offers: the modules (and runs of an ``nn.Sequential``'s children) that
``torch.utils.checkpoint`` can wrap (called once, computing no model output), and how they nest.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from .members import MUTATION, forward_nodes_of, trace_order
from .names import parse_segment, segment, within
from .policies import split_policy


def checkpointable(graph: nx.DiGraph, region: str) -> str | None:
    """Why ``region`` cannot be a checkpoint region of this graph, or None when it can.

    A region must be called once (its forward ops one contiguous run in trace order: a module called
    twice would be checkpointed at both calls, which the graph does not say how to split), and must
    not compute a model output (the caller holds it: recomputing it saves nothing)."""
    try:
        base, _ = split_policy(region)
    except ValueError as error:
        return str(error)
    if not base:
        return "the model itself is not a region: checkpointing it would recompute the whole forward"
    nodes = forward_nodes_of(graph, base)
    if not nodes:
        return f"module {region!r} runs no forward op in the trace"
    forward = [v for v in trace_order(graph) if graph.nodes[v].get("kind") == "forward"]
    first, last = forward.index(nodes[0]), forward.index(nodes[-1])
    if last - first + 1 != len(nodes):
        return f"module {region!r} is called more than once in the step, or interleaved with other modules"
    for v in nodes:
        data = graph.nodes[v]
        if data.get("value_class") == MUTATION:
            continue  # recomputed on copies of the buffers (runtime/native.py): updated once
        if data.get("pinned") or data.get("output"):
            return f"module {region!r} computes a model output, which the caller holds anyway"
    return None


def candidate_regions(graph: nx.DiGraph) -> list[str]:
    """Every module path (and every prefix of one) that :func:`checkpointable` accepts, in trace
    order of their first op."""
    seen: dict[str, None] = {}
    for _, data in graph.nodes(data=True):
        if data.get("kind") != "forward":
            continue
        parts = str(data.get("module", "")).split(".") if data.get("module") else []
        for depth in range(1, len(parts) + 1):
            seen.setdefault(".".join(parts[:depth]), None)
    return [r for r in seen if checkpointable(graph, r) is None]


def segmentations(graph: nx.DiGraph, sequentials: dict[str, int]) -> list[list[str]]:
    """For each ``nn.Sequential`` in ``sequentials`` (path -> number of children, named ``0..n-1``)
    and each length ``L`` from 2 to ``n - 1``: its children cut into runs of ``L`` (the last may be
    shorter), the runs that :func:`checkpointable` accepts."""
    result = []
    for path, count in sequentials.items():
        for length in range(2, count):
            runs = [segment(path, start, min(start + length, count)) for start in range(0, count, length)]
            runs = [r for r in runs if checkpointable(graph, r) is None]
            if runs:
                result.append(runs)
    return result


def children_of(region: str, candidates: Sequence[str]) -> list[str]:
    """The module candidates directly below ``region`` (the shallowest module candidates inside it),
    under ``region``'s policy. Plain candidates only are looked at: a module is inside its own policy
    variants (``within("h.5.attn", "h.5.attn@matmuls")``), so that with the variants among the
    candidates the children of ``"h.5"`` were ``"h.5.attn@matmuls"`` and those of
    ``"h.5@projections"`` ``"h.5"`` itself."""
    base, policy = split_policy(region)
    inside = [c for c in candidates if "@" not in c and c != base and parse_segment(c) is None and within(c, base)]
    found = [c for c in inside if not any(o != c and within(c, o) for o in inside)]
    return [c if policy is None else f"{c}@{policy}" for c in found]


def by_depth(modules: Sequence[str]) -> list[list[str]]:
    """The module candidates of each depth, shallowest first."""
    return [[c for c in modules if c.count(".") == depth] for depth in sorted({c.count(".") for c in modules})]
