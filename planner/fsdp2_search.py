"""The op graph the native search sees under per-block FSDP2: each unit's parameter gradients held
as the shard FSDP2 keeps of them, not whole, and each op's workspace raised by FSDP2's own buffers
held while it runs (bytes).

The unsharded step holds every parameter's whole gradient from when the backward makes it to the
end, so on a model whose parameters outweigh one rank's activations its peak is at the end of the
backward, where checkpointing changes nothing: searched on that step, the least plan is any plan
whose activations stay under the gradients' floor (a few projections), and priced exactly under
FSDP2 (planner/fsdp2_timeline.py: each unit's gradients reduce-scattered to a shard after its
backward) it came out at 96-100% of the un-checkpointed per-rank peak, though checkpointing every
layer holds far less (docs/native.md, "A model that only fits sharded"). With the gradients at
their shards the search's peak is where FSDP2's is, in the activations. The whole gradients of the
one unit being reduce-scattered are not counted here; the exact price of each plan found is
(planner/fsdp2_exact.py).

FSDP2's buffers (the gathered unit, the all-gather output kept or prefetched beside it, the last
reduce-scatter input) vary over the step; counted as one constant (their most, FSDP2's upper bound),
the search could not rank plans by where the rank really peaks: on a 4-layer Llama (width 1024,
4 ranks) the least it named was 93.6% of the un-checkpointed per-rank peak, while checkpointing
every layer holds 88.9% (docs/native.md, "A model that only fits sharded"). Each op's workspace
now carries the buffers held while it runs in the un-checkpointed step (planner/fsdp2_timeline.py);
a recomputation runs where its unit is gathered for its backward anyway.
"""

from __future__ import annotations

import networkx as nx
import torch

from profiler.grouping import GRADIENT

from solvers.regions import evaluate
from solvers.schedule import COMPUTE

from .fsdp2_timeline import BACKWARD_KINDS, ROOT, _unit_of, fsdp2_buffers_by_op, sharded_groups
from .sharding import FSDP2


def sharded_gradients_graph(graph: nx.DiGraph, model: torch.nn.Module, spec: FSDP2) -> nx.DiGraph:
    """A copy of ``graph`` (an op-level cost graph) whose gradient nodes made in a unit hold the
    unit's shard share of their bytes (``shard / whole`` of its gradients, rounded up); the root's
    group's gradients stay whole (FSDP2 reduces them at the end of the backward)."""
    groups = sharded_groups(model, spec)
    units = tuple(u for u in groups if u != ROOT)
    sharded = graph.copy()
    for _, data in sharded.nodes(data=True):
        if data.get("value_class") != GRADIENT:
            continue
        group = groups[_unit_of(str(data.get("module", "")), units)]
        if group is groups[ROOT] or not group.grads:
            continue
        data["mem"] = -(-int(data["mem"]) * group.shard // group.grads)
    return sharded


def fsdp2_search_graph(graph: nx.DiGraph, model: torch.nn.Module, spec: FSDP2) -> nx.DiGraph:
    """:func:`sharded_gradients_graph`, each op's ``workspace`` raised by what FSDP2 holds while it
    runs in the un-checkpointed step beyond that graph (bytes; the module docstring): its own buffers,
    and in a unit's backward the unit's gradients made so far whole (reduce-scattered to their shard
    only after the unit's last backward op). Neither depends on which regions a plan checkpoints:
    recomputation adds forward ops, not buffers, and leaves the backward's order as it is."""
    searched = sharded_gradients_graph(graph, model, spec)
    unplanned = evaluate(graph, ())
    buffers = fsdp2_buffers_by_op(unplanned.graph, unplanned.schedule, model, spec)
    groups = sharded_groups(model, spec)
    units = tuple(u for u in groups if u != ROOT)
    whole_beyond_shards = dict.fromkeys(units, 0)  # unit -> its gradients made so far, whole less shards
    nodes = unplanned.graph.nodes
    for action, node in unplanned.schedule:
        if action != COMPUTE or node not in searched:
            continue
        unit = _unit_of(str(nodes[node].get("module", "")), units)
        data = searched.nodes[node]
        if unit != ROOT and nodes[node].get("value_class") == GRADIENT:
            whole_beyond_shards[unit] += int(graph.nodes[node]["mem"]) - int(data["mem"])
        gradients = whole_beyond_shards[unit] if unit != ROOT and nodes[node].get("kind") in BACKWARD_KINDS else 0
        data["workspace"] = int(data.get("workspace", 0)) + int(buffers.get(node, 0)) + gradients
    return searched


__all__ = ["fsdp2_search_graph", "sharded_gradients_graph"]
