"""Cost graphs for tests: random DAGs, chains, skip-connection graphs and training graphs.

Every generator is deterministic in its ``seed`` and returns a valid cost graph (docs/costgraph.md): ``cost``
float seconds, ``mem`` int bytes, ``output`` on the nodes that must be held at the end.
"""

from __future__ import annotations

import random

import networkx as nx

from solvers import simulate
from solvers.store_all import store_all_schedule


def _attributes(graph: nx.DiGraph, rng: random.Random, max_cost: int = 5, max_mem: int = 5) -> nx.DiGraph:
    for node in graph.nodes:
        graph.nodes[node]["cost"] = float(rng.randint(1, max_cost))
        graph.nodes[node]["mem"] = rng.randint(1, max_mem)
    return graph


def mark_sinks_as_outputs(graph: nx.DiGraph) -> nx.DiGraph:
    for node in graph.nodes:
        graph.nodes[node]["output"] = graph.out_degree(node) == 0
    return graph


def random_dag(n: int, edge_probability: float = 0.3, seed: int = 0, outputs: str = "sinks") -> nx.DiGraph:
    """Nodes 0..n-1, each edge i -> j (i < j) with the given probability; node i > 0 gets >= 1 input.

    ``outputs``: "sinks" marks every sink as an output, "last" only node n-1, "none" none.
    """
    rng = random.Random(seed)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for j in range(1, n):
        for i in range(j):
            if rng.random() < edge_probability:
                graph.add_edge(i, j)
        if graph.in_degree(j) == 0:
            graph.add_edge(rng.randrange(j), j)
    _attributes(graph, rng)
    if outputs == "sinks":
        mark_sinks_as_outputs(graph)
    elif outputs == "last":
        graph.nodes[n - 1]["output"] = True
    return graph


def layered_dag(layers: int, width: int, seed: int = 0, max_inputs: int = 3) -> nx.DiGraph:
    """``layers`` layers of ``width`` nodes, each node after the first layer reading 1 to
    ``max_inputs`` random nodes of the layer before; sinks are outputs. Wide graphs whose order of
    computation is free within a layer: the hard case for model sizes (cpsat's model of a
    250-node one took minutes to build)."""
    rng = random.Random(seed)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(layers * width))
    for layer in range(1, layers):
        previous = range((layer - 1) * width, layer * width)
        for node in range(layer * width, (layer + 1) * width):
            for source in rng.sample(previous, rng.randint(1, min(max_inputs, width))):
                graph.add_edge(source, node)
    _attributes(graph, rng)
    return mark_sinks_as_outputs(graph)


def chain(n: int, seed: int | None = 0, unit: bool = False) -> nx.DiGraph:
    """A path 0 -> 1 -> ... -> n-1 whose last node is the output."""
    rng = random.Random(seed)
    graph = nx.path_graph(n, create_using=nx.DiGraph)
    for node in graph.nodes:
        graph.nodes[node]["cost"] = 1.0 if unit else float(rng.randint(1, 5))
        graph.nodes[node]["mem"] = 1 if unit else rng.randint(1, 5)
    graph.nodes[n - 1]["output"] = True
    return graph


def training_graph(layers: int, seed: int | None = 0, unit: bool = False, skips: int = 0) -> nx.DiGraph:
    """Checkmate's "linear training graph": forward 0..L (L is the loss), gradients L..2L, and the
    edges i -> 2L-i (the backward of layer i reads its forward activation).

    ``skips`` adds that many random forward skip connections (i -> j, j > i + 1, j <= L) and their
    backward mirrors (2L-j -> 2L-i), as residual networks have. Node 2L (the last gradient) is the
    output; the graph attribute ``loss_node`` names node L.
    """
    rng = random.Random(seed)
    last = 2 * layers
    graph = nx.DiGraph(loss_node=layers)
    graph.add_nodes_from(range(last + 1))
    for i in range(last):
        graph.add_edge(i, i + 1)
    for i in range(layers):
        graph.add_edge(i, last - i)
    for _ in range(skips):
        if layers < 3:
            break
        i = rng.randrange(0, layers - 1)
        j = rng.randrange(i + 2, layers + 1)
        graph.add_edge(i, j)
        graph.add_edge(last - j, last - i)
    for node in graph.nodes:
        graph.nodes[node]["cost"] = 1.0 if unit else float(rng.randint(1, 5))
        graph.nodes[node]["mem"] = 1 if unit else rng.randint(1, 5)
    graph.nodes[last]["output"] = True
    return graph


def parameter_gradient_graph(layers: int, seed: int = 0) -> nx.DiGraph:
    """A training graph whose backward also emits one parameter gradient per layer (an output),
    like a real model: forward f_i, loss, input-gradient chain b_i and weight gradients w_i."""
    rng = random.Random(seed)
    graph = nx.DiGraph(loss_node="loss")
    previous = None
    for i in range(layers):
        graph.add_node(f"f{i}")
        if previous:
            graph.add_edge(previous, f"f{i}")
        previous = f"f{i}"
    graph.add_node("loss", pinned=True)
    graph.add_edge(previous, "loss")
    gradient = "loss"
    for i in reversed(range(layers)):
        graph.add_node(f"w{i}", output=True)
        graph.add_edge(gradient, f"w{i}")
        if i > 0:
            graph.add_edge(f"f{i - 1}", f"w{i}")
            graph.add_node(f"b{i}")
            graph.add_edge(gradient, f"b{i}")
            graph.add_edge(f"f{i}", f"b{i}")
            gradient = f"b{i}"
    return _attributes(graph, rng)


def projection_head_graph(layers: int, seed: int = 0, head_bytes: int = 120) -> nx.DiGraph:
    """A language model's shape: a mask read by every layer, a chain of layers, an output projection
    whose result (the logits, ``head_bytes``, larger than anything else) is a pinned model output,
    and a loss that saves a result as large (log-probabilities). The projection's backward reads its *input* and the logits' gradient, not its
    output, like a linear layer's; its weight gradient is an output."""
    rng = random.Random(seed)
    graph = nx.DiGraph(loss_node="loss")
    graph.add_edge("embed", "mask")
    previous = "embed"
    for i in range(layers):
        graph.add_edge(previous, f"f{i}")
        graph.add_edge("mask", f"f{i}")
        previous = f"f{i}"
    graph.add_node("head", pinned=True)
    graph.add_edge(previous, "head")
    graph.add_edge("head", "log_probs")  # the loss's saved result (a log-softmax)
    graph.add_node("loss", pinned=True)
    graph.add_edge("log_probs", "loss")
    graph.add_edge("loss", "g_head")  # the logits' gradient
    graph.add_edge("log_probs", "g_head")
    graph.add_node("w_head", output=True)
    for reader in ("g_in", "w_head"):
        graph.add_edge("g_head", reader)
        graph.add_edge(previous, reader)
    gradient = "g_in"
    for i in reversed(range(layers)):
        graph.add_edge(gradient, f"b{i}")
        graph.add_edge(f"f{i}", f"b{i}")
        gradient = f"b{i}"
    graph.add_edge(gradient, "g_embed")
    graph.nodes["g_embed"]["output"] = True
    _attributes(graph, rng, max_mem=30)
    graph.nodes["mask"]["mem"] = 2  # small: worth holding throughout, within 2% of the peak
    for node in ("head", "log_probs", "g_head"):
        graph.nodes[node]["mem"] = head_bytes
    return graph


def with_extras(graph: nx.DiGraph, seed: int = 0) -> nx.DiGraph:
    """A copy with the docs/costgraph.md extensions: ``workspace`` bytes on about a third of the
    nodes, and the loss node (or else the first output) ``pinned``."""
    rng = random.Random(seed)
    graph = graph.copy()
    for node in graph.nodes:
        if rng.random() < 0.35:
            graph.nodes[node]["workspace"] = rng.randint(1, 4)
    pinned = graph.graph.get("loss_node")
    if pinned is None:
        pinned = next(v for v in graph.nodes if graph.nodes[v].get("output"))
    graph.nodes[pinned]["pinned"] = True
    return graph


# docs/algorithms.md, "Checkmate": the optima (compute cost) of the linear training graph with unit
# costs and sizes, training_graph(layers, unit=True), by layers and then by budget (bytes).
CHECKMATE_LINEAR_OPTIMA = {
    4: {3: 15, 4: 11, 5: 10, 6: 9},
    8: {3: 45, 4: 26, 5: 22, 6: 21, 7: 20, 8: 19, 9: 18, 10: 17},
}


def trap_graph() -> nx.DiGraph:
    """docs/algorithms.md, Checkmate trap 1: at budget 4 the order of first computations 0, 1, 2, 3
    costs 13 at best, while the optimum (10) computes node 3 before nodes 1 and 2."""
    graph = nx.DiGraph()
    for node, (cost, mem) in enumerate(zip([3, 1, 1, 5], [1, 2, 2, 3])):
        graph.add_node(node, cost=float(cost), mem=mem)
    graph.add_edges_from([(0, 1), (1, 2), (0, 3)])
    return graph


SMALL_KINDS = ("dag", "chain", "training", "skips")


def small_graph(kind: str, size: int, seed: int, extras: bool) -> nx.DiGraph:
    """A graph of the kinds the property tests draw (``SMALL_KINDS``): a random DAG of ``size``
    nodes, a chain, or a training graph of ``size // 2`` layers with or without skips; ``extras``:
    with workspace and a pinned node (:func:`with_extras`)."""
    if kind == "dag":
        graph = random_dag(size, edge_probability=0.3, seed=seed)
    elif kind == "chain":
        graph = chain(size, seed=seed)
    else:
        graph = training_graph(max(2, size // 2), seed=seed, skips=2 if kind == "skips" else 0)
    return with_extras(graph, seed) if extras else graph


def random_small_graph(rng: random.Random, max_nodes: int, largest_seed: int = 10_000) -> nx.DiGraph:
    """:func:`small_graph` of a kind, size (3 to ``max_nodes``), seed and extras drawn from ``rng``."""
    kind, size, seed = rng.choice(SMALL_KINDS), rng.randint(3, max_nodes), rng.randint(0, largest_seed)
    return small_graph(kind, size, seed, rng.random() < 0.5)


def store_all_peak(graph) -> int:
    return simulate(graph, store_all_schedule(graph)).peak_bytes


def budget_sweep(graph, points: int = 8) -> list[int]:
    """Budgets from 0 to just above the store-all peak (bytes)."""
    top = store_all_peak(graph)
    budgets = {0, 1, top - 1, top, top + 1}
    budgets.update(round(top * k / points) for k in range(1, points))
    return sorted(b for b in budgets if b >= 0)


def method_sweep_graphs():
    """(name, graph) pairs the chain methods' budget sweeps run on (tests/test_chen.py, test_revolve.py)."""
    for seed in range(3):
        yield f"training{seed}", training_graph(9 + 4 * seed, seed=seed, skips=2 * seed)
        yield f"unit{seed}", training_graph(6 + 5 * seed, seed=seed, unit=True)
        yield f"chain{seed}", chain(7 + 3 * seed, seed=seed)
        yield f"params{seed}", parameter_gradient_graph(5 + 2 * seed, seed=seed)
        yield f"dag{seed}", random_dag(11 + seed, seed=seed)
        yield f"extras{seed}", with_extras(training_graph(10 + 3 * seed, seed=seed, skips=seed), seed=seed)
    yield "projection", projection_head_graph(8, seed=1, head_bytes=60)
