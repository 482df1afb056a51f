"""An in-place op counted as eager runs it: no new buffer.

The profiler's graph is functionalized: dropout's ``torch.empty_like(x).bernoulli_(1 - p)`` then
``.div_(1 - p)``, three ops on one buffer in eager PyTorch, are ``empty_like``, ``bernoulli`` and
``div``, each a new value of the buffer's size, and while ``div`` runs its input (the draw) is still
held: one buffer counted twice, inside every dropout. It matters where the step peaks there: a
checkpoint's recomputation that stops inside a dropout (solvers/regions/early_stop.py; nanoGPT's
last attention, whose replay stops at its output dropout's multiply, was predicted 786,432 B, one
``(4, 128, 384)`` float mask, high).

profiler/lifetimes.py tags such an op (``in_place_of``: the forward op that made the version it
overwrote). When that version is read by the in-place op alone, eager's buffer is the same: the
op's ``workspace`` is lowered by the version's bytes, so that while it runs (held + mem +
workspace) the buffer counts once; the version is freed right after it, and from then on the new
value alone holds it. The same for its recomputed twin, which reads the twin of the version.
"""

from __future__ import annotations

import networkx as nx

IN_PLACE_OF = "in_place_of"
FORWARD_OP = "forward_op"


def count_in_place_once(graph: nx.DiGraph) -> nx.DiGraph:
    """``graph`` (a copy) with each in-place op's ``workspace`` lowered by the bytes of the version
    it overwrote (see the module docstring); ``graph`` itself when it has none."""
    lowered: dict = {}
    for v, data in graph.nodes(data=True):
        if IN_PLACE_OF not in data:
            continue
        overwritten = [p for p in graph.predecessors(v) if graph.nodes[p].get(FORWARD_OP) == data[IN_PLACE_OF]]
        if len(overwritten) != 1:
            continue
        p = overwritten[0]
        version = graph.nodes[p]
        if set(graph.successors(p)) != {v} or version.get("output") or version.get("pinned"):
            continue  # read after the op, or held to the end: two buffers after all
        lowered[v] = min(int(version["mem"]), int(data["mem"]))
    if not lowered:
        return graph
    graph = graph.copy()
    for v, bytes_ in lowered.items():
        graph.nodes[v]["workspace"] = int(graph.nodes[v].get("workspace", 0)) - bytes_
    return graph
