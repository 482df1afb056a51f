"""An in-place op counted as eager runs it: no new buffer.

The profiler's graph is functionalized: dropout's ``torch.empty_like(x).bernoulli_(1 - p)`` then
``.div_(1 - p)``, three ops on one buffer in eager PyTorch, are ``empty_like``, ``bernoulli`` and
``div``, each a new value of the buffer's size, and while ``div`` runs its input (the draw) is still
held: one buffer counted twice, inside every dropout. It matters where the step peaks there: a
checkpoint's recomputation that stops inside a dropout (solvers/regions/early_stop.py; nanoGPT's
last attention, whose replay stops at its output dropout's multiply, was predicted 786,432 B, one
``(4, 128, 384)`` float mask, high).

profiler/lifetimes.py tags such an op (``in_place_of``: the forward op that made the version it
overwrote). When that version is read by the in-place op alone, and the in-place op runs right
after the op that made it (dropout's draw and scaling do), eager's buffer is one: the version's
bytes move into its op's ``workspace`` (counted while that op runs, as solvers/extractions.py
moves a model output's), so that from then on the in-place op's value alone holds them. The same
for the recomputed twins, which run in the same order.
"""

from __future__ import annotations

import networkx as nx

IN_PLACE_OF = "in_place_of"
FORWARD_OP = "forward_op"


def count_in_place_once(graph: nx.DiGraph) -> nx.DiGraph:
    """``graph`` (a copy) with the bytes of each version an in-place op overwrote moved into that
    version's ``workspace`` (see the module docstring); ``graph`` itself when there is none."""
    order = list(graph.nodes)
    position = {v: i for i, v in enumerate(order)}
    moved = []
    for v, data in graph.nodes(data=True):
        if IN_PLACE_OF not in data or position[v] == 0:
            continue
        p = order[position[v] - 1]  # the version overwritten, made by the op right before
        version = graph.nodes[p]
        if version.get(FORWARD_OP) != data[IN_PLACE_OF] or set(graph.successors(p)) != {v}:
            continue  # made earlier, or read after the op: two buffers after all
        if version.get("output") or version.get("pinned"):
            continue
        moved.append(p)
    if not moved:
        return graph
    graph = graph.copy()
    for p in moved:
        data = graph.nodes[p]
        data["workspace"] = int(data.get("workspace", 0)) + int(data["mem"])
        data["mem"] = 0
    return graph
