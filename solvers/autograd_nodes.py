"""How long eager autograd holds what a backward op reads: until its autograd node's last op.

The cost graph's backward ops are single aten ops, but the autograd engine runs them in nodes: one
node (``BmmBackward0``, ``NativeLayerNormBackward0``) computes every input's gradient with one or
more ops, and the tensors it reads (the saved tensors it unpacked, the incoming gradient) are
released when the node's ``apply`` returns, not after the last op that reads each of them. A
schedule that frees each tensor after its last reading op is what the traced executor runs; what
eager PyTorch (the native executor) runs holds them to the node's end. The difference shows where a
node's ops run at the step's peak: a checkpointed last transformer layer, whose recomputation runs
at the start of the backward (BERT with 4 heads: 65,280 B measured above the per-op prediction,
``BmmBackward0`` holding the attention's value and incoming gradient while its second ``bmm`` runs).

The profiler tags each backward op with its node's number (``autograd_node``, profiler/capture.py);
:func:`autograd_node_holds` turns that into liveness edges (``hold=True``, not data), the form
solvers/regions/costs.py already uses for what a checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Hashable

import networkx as nx

AUTOGRAD_NODE = "autograd_node"


def node_runs(graph: nx.DiGraph) -> dict[int, list[Hashable]]:
    """Each autograd node's backward ops, in trace order (the graph's node order)."""
    runs: dict[int, list[Hashable]] = {}
    for v, data in graph.nodes(data=True):
        number = data.get(AUTOGRAD_NODE)
        if number is not None and data.get("kind") == "backward":
            runs.setdefault(number, []).append(v)
    return runs


def autograd_node_holds(graph: nx.DiGraph) -> nx.DiGraph:
    """``graph`` (a copy) where every tensor a backward op reads is also read, by a liveness edge,
    by the last op of that op's autograd node; ``graph`` itself when no op carries a node number
    (graphs from other tools, coarse groupings)."""
    runs = [ops for ops in node_runs(graph).values() if len(ops) > 1]
    if not runs:
        return graph
    result = graph.copy()
    for ops in runs:
        last = ops[-1]
        for op in ops[:-1]:
            for read in graph.predecessors(op):
                if read != last and not result.has_edge(read, last):
                    result.add_edge(read, last, hold=True)
    return result


def first_of_node(graph: nx.DiGraph, op: Hashable) -> Hashable:
    """The first op of ``op``'s autograd node: where the engine unpacks the node's saved tensors
    (a checkpoint recomputes there), ``op`` itself without a node number."""
    number = graph.nodes[op].get(AUTOGRAD_NODE)
    if number is None:
        return op
    return next(v for v, d in graph.nodes(data=True) if d.get(AUTOGRAD_NODE) == number and d.get("kind") == "backward")
