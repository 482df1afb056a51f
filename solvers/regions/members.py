"""Which ops of the op-level cost graph a region runs: the forward and backward ops of the modules
within it, in trace order (the profiler adds nodes in the order the step ran them).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import networkx as nx

from .names import within

# A buffer's new value (a batch norm's running statistics). The native executor runs a batch norm's
# recomputation on copies of its statistics (runtime/native.py), so a region may contain one, but
# the new values are computed once, by the first run: they get no twin.
MUTATION = "mutation"


def trace_order(graph: nx.DiGraph) -> list[Hashable]:
    """The graph's nodes in trace order: the profiler adds them in the order the step ran them."""
    return list(graph.nodes)


@dataclass(frozen=True)
class ModuleNodes:
    """A graph's forward and backward nodes grouped by the module that ran them, each group in trace
    order: a region's nodes are gathered from the modules within it, not found by a scan of the
    whole graph per region (the search tries ~450 regions, policy variants included, of a 12-layer
    GPT-2's ~2,100 ops: the scans took 2 of its 5 s)."""

    position: dict[Hashable, int]
    forward: dict[str, list[Hashable]]
    backward: dict[str, list[Hashable]]

    @classmethod
    def of(cls, graph: nx.DiGraph) -> ModuleNodes:
        position, forward, backward = {}, {}, {}
        for i, (v, data) in enumerate(graph.nodes(data=True)):
            position[v] = i
            kind = data.get("kind")
            if kind in ("forward", "backward"):
                (forward if kind == "forward" else backward).setdefault(data.get("module", ""), []).append(v)
        return cls(position, forward, backward)

    def within(self, region: str, kind: str) -> list[Hashable]:
        """The ``kind`` ("forward" or "backward") nodes of the modules within ``region``, in trace order."""
        groups = self.forward if kind == "forward" else self.backward
        found = [v for module, nodes in groups.items() if within(module, region) for v in nodes]
        return sorted(found, key=self.position.__getitem__)


def forward_nodes_of(graph: nx.DiGraph, region: str) -> list[Hashable]:
    """The forward nodes of the modules within ``region``, in trace order (one region: for many, index
    the graph once with :class:`ModuleNodes`)."""
    return ModuleNodes.of(graph).within(region, "forward")
