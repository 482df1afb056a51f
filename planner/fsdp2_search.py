"""The op graph the native search sees under per-block FSDP2: each unit's parameter gradients held
as the shard FSDP2 keeps of them, not whole (bytes).

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
"""

from __future__ import annotations

import networkx as nx
import torch

from profiler.grouping import GRADIENT

from .fsdp2_timeline import ROOT, _unit_of, sharded_groups
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


__all__ = ["sharded_gradients_graph"]
