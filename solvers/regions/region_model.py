"""The predicted peak and time of any set of regions without building graphs: the fast twin of
:func:`solvers.regions.prediction.evaluate`, equal to it on every plan (tests/test_regions.py), for
searches that try thousands of region sets (search.py, solvers/native/).
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from .costs import region_costs
from .early_stop import program_holds
from .members import ModuleNodes, trace_order
from .prediction import as_eager_runs


class RegionModel:
    """:func:`evaluate`'s peak and time without building graphs: the graph's numbers indexed once,
    each region's parts cached, so that a search can try thousands of region sets. Equal to
    :func:`evaluate` (tests/test_regions.py checks it)."""

    def __init__(self, graph: nx.DiGraph):
        graph = as_eager_runs(graph)
        self.graph = graph
        self.order = trace_order(graph)
        self.index = {v: i for i, v in enumerate(self.order)}
        nodes = graph.nodes
        self.mem = [int(nodes[v]["mem"]) for v in self.order]
        self.workspace = [int(nodes[v].get("workspace", 0)) for v in self.order]
        self.cost = [float(nodes[v]["cost"]) for v in self.order]
        self.kept = [bool(nodes[v].get("output") or nodes[v].get("pinned")) for v in self.order]
        self.preds = [[self.index[p] for p in graph.predecessors(v)] for v in self.order]
        self._parts: dict[str, tuple] = {}
        self._holds: dict[str, dict[int, list[int]]] = {}
        self._by_module = ModuleNodes.of(graph)

    def parts(self, region: str) -> tuple:
        """(recomputed indices, backward indices, trigger index or None, held-until-last indices, the
        checkpoint's own seconds)."""
        if region not in self._parts:
            costs = region_costs(self.graph, region, self._by_module)
            index = self.index
            held = [index[v] for v in costs.held_to_the_end(self.graph)]
            holds: dict[int, list[int]] = {}
            for v, holder in program_holds(self.graph, costs.recomputed):
                holds.setdefault(index[holder], []).append(index[v])
            self._holds[region] = holds
            self._parts[region] = (
                [index[v] for v in costs.recomputed], [index[b] for b in costs.backward],
                None if costs.trigger is None else index[costs.trigger], held, costs.overhead_seconds,
            )
        return self._parts[region]

    def twin_holds(self, region: str) -> dict[int, list[int]]:
        """What the region's program holds in its recomputation beyond the graph's reads
        (early_stop.py, :func:`program_holds`): the index of a recomputed op -> the indices of the
        recomputed results held until its twin has run."""
        self.parts(region)
        return self._holds[region]

    def peak_and_cost(self, regions: Iterable[str]) -> tuple[int, float]:
        """(peak bytes of the schedule's part, compute seconds) of checkpointing ``regions``."""
        n = len(self.order)
        twin_base: list[int] = []  # instance n + k is the twin of base node twin_base[k]
        twin_of: dict[tuple[int, int], int] = {}  # (region number, base index) -> twin instance
        backward_region: dict[int, int] = {}
        trigger: dict[int, list[int]] = {}
        hold: dict[int, list[int]] = {}
        parts = [self.parts(r) for r in regions]
        holds = [self.twin_holds(r) for r in regions]
        for number, (recomputed, backward, first, held, _) in enumerate(parts):
            for b in backward:
                backward_region[b] = number
            if backward:
                hold.setdefault(backward[-1], []).extend(held)
            if first is None or not recomputed:
                continue
            instances = []
            for i in recomputed:
                twin_of[(number, i)] = n + len(twin_base)
                instances.append(n + len(twin_base))
                twin_base.append(i)
            trigger.setdefault(first, []).extend(instances)

        def reads(instance: int) -> list[int]:
            if instance >= n:
                base, number = twin_base[instance - n], twin_region[instance]
                return [twin_of.get((number, p), p) for p in self.preds[base]] + \
                    [twin_of[(number, v)] for v in holds[number].get(base, ())]
            number = backward_region.get(instance)
            result = self.preds[instance] if number is None else \
                [twin_of.get((number, p), p) for p in self.preds[instance]]
            return result + hold.get(instance, [])

        twin_region = {t: k for (k, _), t in twin_of.items()}
        sequence: list[int] = []
        for i in range(n):
            sequence.extend(trigger.get(i, ()))
            sequence.append(i)
        last_use = {}
        read_lists = []
        for position, instance in enumerate(sequence):
            read = reads(instance)
            read_lists.append(read)
            for r in read:
                last_use[r] = position
            last_use.setdefault(instance, position)
        frees_after: dict[int, list[int]] = {}
        for instance, position in last_use.items():
            base = instance if instance < n else twin_base[instance - n]
            if instance < n and self.kept[base]:
                continue
            frees_after.setdefault(position, []).append(instance)
        held = peak = 0
        cost = sum(part[4] for part in parts)  # what the checkpoints themselves cost
        for position, instance in enumerate(sequence):
            base = instance if instance < n else twin_base[instance - n]
            peak = max(peak, held + self.mem[base] + self.workspace[base])
            held += self.mem[base]
            cost += self.cost[base]
            for freed in frees_after.get(position, ()):
                held -= self.mem[freed if freed < n else twin_base[freed - n]]
        return peak, cost
