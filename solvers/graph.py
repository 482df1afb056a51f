"""The cost graph: validation and the read-only views every solver shares.

A cost graph is a ``networkx.DiGraph`` whose nodes carry ``cost`` (seconds), ``mem`` (bytes) and
optionally ``output`` (docs/costgraph.md). Two more optional attributes extend that basic model;
a graph without them behaves as one whose nodes all have ``workspace=0`` and ``pinned=False``:

- ``workspace`` (int bytes, default 0): transient memory while the node is being computed,
  released when it finishes (the scratch space of a fused group of ops).
- ``pinned`` (bool, default False): once computed, the result stays held until the end of the
  step and is never computed again (the model outputs that the caller holds, the incoming
  gradients that autograd holds). A pinned node is an output.

The graph attribute ``loss_node`` names the node where the forward pass turns into the backward
pass; chain methods use it (docs/costgraph.md says what they do without it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Hashable, Iterable, Sequence

import networkx as nx

from .errors import InvalidGraph

Node = Hashable


@dataclass(frozen=True)
class NodeCosts:
    """Per-node numbers in the graph's topological order, as plain lists (fast to index)."""

    order: tuple[Node, ...]
    index: dict
    cost: tuple[float, ...]
    mem: tuple[int, ...]
    workspace: tuple[int, ...]
    output: tuple[bool, ...]
    pinned: tuple[bool, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return len(self.order)


def _check_number(node: Node, name: str, value, integer: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidGraph(f"node {node!r}: attribute {name!r} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise InvalidGraph(f"node {node!r}: attribute {name!r} must be a whole number of bytes, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidGraph(f"node {node!r}: attribute {name!r} must be finite and >= 0, got {value!r}")


def validate(graph) -> None:
    """Raise :class:`InvalidGraph` with the reason when ``graph`` is not a valid cost graph."""
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise InvalidGraph(f"a cost graph is a networkx.DiGraph, got {type(graph).__name__}")
    for node, data in graph.nodes(data=True):
        for name in ("cost", "mem"):
            if name not in data:
                raise InvalidGraph(f"node {node!r} has no {name!r} attribute (cost: seconds, mem: bytes)")
        _check_number(node, "cost", data["cost"], integer=False)
        _check_number(node, "mem", data["mem"], integer=True)
        _check_number(node, "workspace", data.get("workspace", 0), integer=True)
        for flag in ("output", "pinned"):
            if not isinstance(data.get(flag, False), bool):
                raise InvalidGraph(f"node {node!r}: attribute {flag!r} must be True or False")
    if nx.number_of_selfloops(graph):
        raise InvalidGraph("the cost graph has a self-loop; it must be acyclic")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise InvalidGraph(f"the cost graph must be acyclic; it has the cycle {cycle}")
    loss = graph.graph.get("loss_node")
    if loss is not None and loss not in graph:
        raise InvalidGraph(f"graph attribute loss_node={loss!r} is not a node of the graph")


def topological_order(graph) -> list[Node]:
    """A deterministic topological order: ties broken by the order nodes were added.

    Profiler graphs add nodes in trace order, so this is the order the model ran in.
    """
    rank = {node: i for i, node in enumerate(graph.nodes)}
    return list(nx.lexicographical_topological_sort(graph, key=rank.__getitem__))


def is_topological_order(graph, order: Sequence[Node]) -> bool:
    """Whether ``order`` lists every node of ``graph`` once, each after all its predecessors."""
    position = {node: i for i, node in enumerate(order)}
    if len(position) != len(order) or len(order) != graph.number_of_nodes() or any(v not in graph for v in order):
        return False
    return all(position[u] < position[v] for u, v in graph.edges)


def node_costs(graph, order: Sequence[Node] | None = None) -> NodeCosts:
    """Index the graph once; solvers work on integer positions in topological order.

    ``order``: the topological order to index by (default :func:`topological_order`); a
    ``ValueError`` when it is not one.
    """
    if order is None:
        order = tuple(topological_order(graph))
    else:
        order = tuple(order)
        if not is_topological_order(graph, order):
            raise ValueError("node_costs: the order given is not a topological order of the graph's nodes")
    index = {node: i for i, node in enumerate(order)}
    nodes = graph.nodes
    return NodeCosts(
        order=order,
        index=index,
        cost=tuple(float(nodes[v]["cost"]) for v in order),
        mem=tuple(int(nodes[v]["mem"]) for v in order),
        workspace=tuple(int(nodes[v].get("workspace", 0)) for v in order),
        output=tuple(bool(nodes[v].get("output", False) or nodes[v].get("pinned", False)) for v in order),
        pinned=tuple(bool(nodes[v].get("pinned", False)) for v in order),
        preds=tuple(tuple(sorted(index[u] for u in graph.predecessors(v))) for v in order),
        succs=tuple(tuple(sorted(index[w] for w in graph.successors(v))) for v in order),
    )


def total_cost(graph) -> float:
    """Seconds to compute every node once: the un-checkpointed step's compute time."""
    return float(sum(data["cost"] for _, data in graph.nodes(data=True)))


def is_output(graph, node: Node) -> bool:
    data = graph.nodes[node]
    return bool(data.get("output", False) or data.get("pinned", False))


def is_pinned(graph, node: Node) -> bool:
    return bool(graph.nodes[node].get("pinned", False))


def node_by_name(graph, names: Iterable[str]) -> dict[str, Node]:
    """Map the string form of each node (as schedules serialise them) back to the node."""
    table = {str(node): node for node in graph.nodes}
    if len(table) != graph.number_of_nodes():
        raise InvalidGraph("two nodes have the same string form; schedules cannot name them apart")
    missing = [name for name in names if name not in table]
    if missing:
        raise InvalidGraph(f"the schedule names nodes that are not in the graph: {missing[:5]}")
    return table
