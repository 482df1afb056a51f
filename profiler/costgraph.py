"""Build the cost graph (docs/costgraph.md) from the grouped joint graph.

Nodes are groups of ops, extraction nodes and the loss; ``cost`` is the sum of the measured times
of the ops a group runs (seconds), ``mem`` the bytes of the storages it hands to others, deduplicated
(views do not count twice), and ``workspace`` the bytes its intermediates add while it runs.

The loss node stands for the caller's loss and its backward: it reads the model's outputs and
produces their gradients (``tangents``). It is pinned, because autograd holds the gradients it passes
into the backward until the backward returns; the model's outputs are pinned because the caller
holds them. Buffer mutations are applied by the runtime at the end of the forward pass: the nodes
that hold the new values feed the loss, so that they are computed in the forward.
"""

from __future__ import annotations

import hashlib
import json

import networkx as nx
import torch
import torch.fx as fx

from .capture import JointGraph
from .grouping import GRADIENT, MODEL_OUTPUT, MUTATION, Grouping, _tensors
from .measure import OpTimes
from .storage import allocated_bytes, storage_bytes

LOSS = "loss"
# Graph attribute: the trace's cross-entropy backward recomputes its log-probabilities from the
# logits (profiler/fusions.py); plans of such a graph must be run on a trace rewritten the same way.
LOG_PROBS_RECOMPUTED = "log_probs_recomputed"


def _value_storages(graph: fx.Graph) -> dict[str, dict]:
    """fx name -> {storage: bytes} of the tensors of that value."""
    from torch.multiprocessing.reductions import StorageWeakRef

    result = {}
    for node in graph.nodes:
        tensors = _tensors(node.meta.get("val"))
        result[node.name] = {StorageWeakRef(t.untyped_storage()): storage_bytes(t) for t in tensors}
    return result


def _bytes_of(values, storages: dict[str, dict]) -> int:
    merged: dict = {}
    for value in values:
        merged.update(storages.get(value, {}))
    return sum(merged.values())


def _workspace(nodes: list[str], exports: list[str], graph_nodes: dict, storages, base_of,
               scratch: dict[str, int] | None = None) -> int:
    """Peak bytes of a group's own allocations while it runs, beyond what it keeps (its exports).

    ``scratch`` (fx node name -> bytes, measured: profiler/measure.py) adds what an op's kernels
    allocate and release inside it, on top of everything live when it runs."""
    scratch = scratch or {}
    members = set(nodes)
    last_read: dict[str, int] = {}
    for position, name in enumerate(nodes):
        for arg in graph_nodes[name].all_input_nodes:
            if arg.name in members:
                last_read[base_of.get(arg.name, arg.name)] = position
    kept = {base_of.get(v, v) for v in exports}
    kept_storages = {s for v in kept for s in storages.get(v, {})}
    # A storage is released when the last value holding it is: a tuple result (native_layer_norm's)
    # shares its storages with the getitems that unpack it, and releasing the tuple after its last
    # getitem must not release what they still hold (that undercounted a residual block by 1 MiB).
    holders: dict = {}
    live: dict = {}
    peak = 0
    for position, name in enumerate(nodes):
        # Allocates (unit values). A lifted constant (get_attr) does not: the graph module holds it
        # for good, and the step reads it where it is.
        if base_of.get(name) == name and graph_nodes[name].op != "get_attr":
            for s, b in storages.get(name, {}).items():
                live[s] = b
                holders.setdefault(s, set()).add(name)
            peak = max(peak, sum(live.values()) + scratch.get(name, 0))
        for value, last in list(last_read.items()):
            if last == position and value not in kept:
                for s in storages.get(value, {}):
                    holders.get(s, set()).discard(value)
                    if not holders.get(s) and s not in kept_storages:
                        live.pop(s, None)
                del last_read[value]
    return max(0, peak - _bytes_of(kept, storages))


def build_cost_graph(joint: JointGraph, grouping: Grouping, times: OpTimes) -> nx.DiGraph:
    graph = joint.graph_module.graph
    graph_nodes = {n.name: n for n in graph.nodes}
    storages = _value_storages(graph)
    base_of = grouping.base_of
    fixed_bytes = _bytes_of(grouping.fixed, storages)
    tangent_bytes = sum(
        spec_bytes(spec, joint) for spec in joint.loss.tangent_specs
    )
    # The caller's loss value (and its backward's seed) is held from the loss on: counted with what
    # the step holds throughout (planner/footprint.py), a few bytes early, so the fingerprint of a
    # graph the runtime rebuilds without running the loss stays the same.
    cost = nx.DiGraph(fixed_bytes=fixed_bytes, loss_node=LOSS, loss_value_bytes=int(joint.loss.value_bytes))
    if joint.log_probs_recomputed:
        cost.graph[LOG_PROBS_RECOMPUTED] = True
    loss_added = False
    extractions_of: dict[str, list] = {}
    for extraction in grouping.extractions:
        extractions_of.setdefault(extraction.source, []).append(extraction)

    def add_loss():
        cost.add_node(
            LOSS, cost=float(joint.loss.seconds), mem=int(tangent_bytes), workspace=int(joint.loss.workspace_bytes),
            structural_workspace=0, pinned=True, output=True, kind="loss", module="", ops=0, random=False,
        )

    for group in grouping.groups:
        if group.phase == "backward" and not loss_added:
            add_loss()
            loss_added = True
        mem = _bytes_of(group.exports, storages)
        structural = _workspace(group.nodes, group.exports, graph_nodes, storages, base_of)
        measured = (_workspace(group.nodes, group.exports, graph_nodes, storages, base_of, times.scratch_bytes)
                    if times.scratch_bytes else structural)
        cost.add_node(
            group.id,
            cost=float(sum(times.seconds.get(n, 0.0) for n in group.nodes)),
            mem=int(mem),
            workspace=int(measured),
            structural_workspace=int(structural),
            output=group.value_class == GRADIENT,
            pinned=group.value_class == MODEL_OUTPUT,
            kind=group.phase,
            module=group.module,
            ops=len(group.units),
            random=group.random,
            value_class=group.value_class,
            # The aten op of a one-op group ("aten.addmm.default"): what a selective-checkpoint
            # policy decides on (solvers/regions/); "" for a group of several ops.
            op=str(graph_nodes[group.units[0]].target) if len(group.units) == 1 else "",
        )
        if group.autograd_node is not None:
            cost.nodes[group.id]["autograd_node"] = group.autograd_node
        cost.nodes[group.id].update(group.lifetime)  # profiler/lifetimes.py's tags (solvers/regions/early_stop.py)
        for extraction in extractions_of.get(group.id, ()):
            cost.add_node(
                extraction.id, cost=0.0, mem=int(_bytes_of(extraction.values, storages)), workspace=0,
                output=extraction.value_class == GRADIENT, pinned=extraction.value_class == MODEL_OUTPUT,
                kind=group.phase, module=group.module, ops=0, random=False, value_class=extraction.value_class,
            )
            cost.add_edge(group.id, extraction.id)
    if not loss_added:
        add_loss()

    # Data edges: a group reads the bases it needs from their owners; tangents come from the loss.
    for group in grouping.groups:
        for base in group.inputs:
            if base in grouping.fixed:
                continue
            source = LOSS if base in grouping.tangents else grouping.source_for(base, group.phase)
            cost.add_edge(source, group.id)
    # The loss reads the model's outputs; the new values of buffers are computed before it.
    for node, data in list(cost.nodes(data=True)):
        if data.get("value_class") == MODEL_OUTPUT:
            cost.add_edge(node, LOSS)
    for node, data in list(cost.nodes(data=True)):
        if data.get("value_class") == MUTATION:
            if nx.has_path(cost, LOSS, node):
                data["output"] = True  # a mutation made in the backward: applied when it ends
            else:
                cost.add_edge(node, LOSS)
                # Held to the end, as the caller holds the model's outputs: a few bytes each
                # (BatchNorm's running statistics, its batch count), and read by the loss only,
                # they crossed every stage boundary of the chain view after them, which then saw
                # one stage where a ResNet has dozens (its least dp budget was 100% of its peak).
                data["pinned"] = True
    cost.graph["fingerprint"] = fingerprint(cost)
    return cost


def spec_bytes(spec, joint: JointGraph) -> int:
    numel = 1
    for size in spec.shape:
        numel *= size
    return allocated_bytes(numel * torch.empty((), dtype=spec.dtype).element_size(), torch.device(spec.device))


def fingerprint(graph: nx.DiGraph) -> str:
    """A hash of the graph's structure and sizes, not of its measured times or scratch memory: two
    profiles of the same model, inputs and granularity have the same fingerprint, and so does the
    graph the runtime rebuilds from a trace alone (the workspace without measured scratch)."""
    entries = []
    for node, data in graph.nodes(data=True):
        workspace = data.get("structural_workspace", data.get("workspace", 0))
        entries.append([
            str(node), sorted(str(p) for p in graph.predecessors(node)), int(data["mem"]),
            int(workspace), bool(data.get("output", False)), bool(data.get("pinned", False)),
        ])
    entries.sort()
    # The libraries' workspaces (profiler/library_memory.py) are measured, not traced: a graph the
    # runtime rebuilds from a trace alone has none.
    traced_fixed_bytes = int(graph.graph.get("fixed_bytes", 0)) - int(graph.graph.get("library_bytes", 0))
    identity = {"nodes": entries, "fixed_bytes": traced_fixed_bytes}
    if graph.graph.get(LOG_PROBS_RECOMPUTED):  # a different trace of the step, even where the sizes agree
        identity[LOG_PROBS_RECOMPUTED] = True
    text = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
