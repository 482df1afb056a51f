"""The cost model of one checkpoint region: what its forward saves, what its recomputation runs
again and when, what the checkpoint holds, and the seconds it adds to the step (its ops run again
and what ``torch.utils.checkpoint`` itself costs, at rates measured by profiler/checkpoint_cost.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import networkx as nx

from ..autograd_nodes import first_of_node
from .early_stop import replay_end
from .members import MUTATION, ModuleNodes
from .policies import SAVE_POLICIES, draw_chains, saved_by_policy, split_policy


@dataclass(frozen=True)
class RegionCosts:
    """One region's parts, in trace order: its forward ``nodes``; those its policy ``saved``; those
    its recomputation runs again (``recomputed``: up to where PyTorch's early stop ends it, the op
    that packs the region's last saved tensor (early_stop.py), less the saved); its ``backward`` ops; its ``inputs`` (results from
    outside that it reads, held by the checkpoint); ``seconds`` the region adds to the step: its
    recomputation and ``overhead_seconds``, what the checkpoint itself costs
    (:func:`checkpoint_overhead`); ``aliased``: saved results that are one buffer with a later saved
    one (:func:`draw_chains`), held through it."""

    region: str
    nodes: tuple[Hashable, ...]
    saved: tuple[Hashable, ...]
    recomputed: tuple[Hashable, ...]
    backward: tuple[Hashable, ...]
    inputs: tuple[Hashable, ...]
    seconds: float
    # The backward op at which the recomputation runs: the first that unpacks anything the region
    # packed (its forward results, recomputed or, under a policy, cached).
    trigger: Hashable | None = None
    aliased: tuple[Hashable, ...] = ()
    overhead_seconds: float = 0.0

    def held_to_the_end(self, graph: nx.DiGraph) -> list[Hashable]:
        """What the checkpoint holds until the region's last backward op: its inputs, and saved
        results no one reads again (the policy's cache keeps them while the recomputation stops
        before it reaches them), but for the ``aliased`` (their buffer is held as the later result)."""
        read_again = {p for v in self.recomputed for p in graph.predecessors(v)} | \
            {p for b in self.backward for p in graph.predecessors(b)}
        aliased = set(self.aliased)
        return [*self.inputs, *(v for v in self.saved if v not in read_again and v not in aliased)]


def region_costs(graph: nx.DiGraph, region: str, by_module: ModuleNodes | None = None) -> RegionCosts:
    """The parts of ``region`` (see :class:`RegionCosts`). ``by_module``: the graph's
    :class:`ModuleNodes`, when a caller asks for many regions of one graph."""
    base, policy = split_policy(region)
    by_module = by_module or ModuleNodes.of(graph)
    nodes = by_module.within(base, "forward")
    members = set(nodes)
    chained, aliased = draw_chains(graph, nodes) if policy and SAVE_POLICIES[policy].draws else (set(), set())
    saved = [v for v in nodes if v in chained or saved_by_policy(str(graph.nodes[v].get("op", "")), policy)]
    saved_set = set(saved)
    backward = by_module.within(base, "backward")
    read = {p for b in backward for p in graph.predecessors(b)}
    needed = [i for i, v in enumerate(nodes) if v in read and v not in saved_set]
    # PyTorch's early stop: at the op that packs the region's last saved tensor (early_stop.py).
    end = replay_end(graph, nodes, backward, read, needed[-1]) if needed else None
    recomputed = tuple(v for v in nodes[:end]
                       if v not in saved_set and graph.nodes[v].get("value_class") != MUTATION) if end else ()
    inputs = tuple(dict.fromkeys(p for v in nodes for p in graph.predecessors(v) if p not in members))
    trigger = next((b for b in backward if any(p in members for p in graph.predecessors(b))), None)
    if trigger is not None:  # the engine unpacks (and the checkpoint recomputes) as the node starts
        trigger = first_of_node(graph, trigger)
    passed = end or 0  # ops the recomputation passes, cached ones included
    overhead = checkpoint_overhead(graph, policy, len(nodes), passed, len(recomputed))
    seconds = sum(float(graph.nodes[v]["cost"]) for v in recomputed) + overhead
    return RegionCosts(region, tuple(nodes), tuple(saved), recomputed, tuple(backward), inputs, seconds, trigger,
                       tuple(v for v in nodes if v in aliased), overhead)


def checkpoint_overhead(graph: nx.DiGraph, policy: str | None, forward_ops: int, passed_ops: int,
                        recomputed_ops: int) -> float:
    """Seconds ``torch.utils.checkpoint`` itself adds for one region, beyond its ops run again: per
    call, per op recomputed, and under ``policy`` per op of the forward and of the recomputation's
    pass (``passed_ops``, cached ones included), at the rates measured on the model's device
    (profiler/checkpoint_cost.py) that the planner puts in ``graph.graph["checkpoint_costs"]``.
    0 for a graph without them: then only the ops are priced."""
    rates = graph.graph.get("checkpoint_costs")
    if not rates:
        return 0.0
    seconds = float(rates["region_seconds"]) + float(rates["recomputed_op_seconds"]) * recomputed_ops
    if policy is not None:
        seconds += float(rates["policy_region_seconds"].get(policy, 0.0))
        seconds += float(rates["policy_op_seconds"].get(policy, 0.0)) * (forward_ops + passed_ops)
    return seconds
