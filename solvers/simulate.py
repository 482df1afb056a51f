"""Execute a schedule on a cost graph, exactly by the rules of docs/schedule.md.

From an empty set of held results:

- ``compute v``: every predecessor of ``v`` is held and ``v`` is not. Memory during the step is the
  bytes of everything held plus ``mem[v]`` (plus the optional ``workspace[v]``, docs/costgraph.md);
  afterwards ``v`` is held. Its ``cost`` is paid every time.
- ``free v``: ``v`` is held (and not ``pinned``); it is released.
- Valid when every node is computed at least once and every ``output`` node is held at the end.

Peak is the largest memory during any compute step; compute cost the sum of ``cost`` over all
compute steps; overhead = compute cost / (sum of all node costs) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Hashable, Iterable

from .graph import is_output, is_pinned, total_cost
from .schedule import COMPUTE, FREE


@dataclass(frozen=True)
class Simulation:
    """The outcome of running a schedule: ``valid`` and, when not, ``error`` says the first fault.

    ``peak_bytes`` (int) and ``compute_cost`` (seconds) cover the steps executed up to the fault.
    ``peak_step`` is the index of the compute step at the peak (-1 if none ran). ``memory`` holds
    the memory during each step (bytes; for a free step, what is held after it) when asked for.
    """

    valid: bool
    peak_bytes: int
    compute_cost: float
    total_cost: float
    error: str | None = None
    peak_step: int = -1
    memory: tuple[int, ...] = field(default=(), repr=False)

    @property
    def overhead(self) -> float:
        """compute cost / (sum of all node costs) - 1; 0 for a graph whose nodes cost nothing."""
        if self.total_cost <= 0:
            return 0.0
        return self.compute_cost / self.total_cost - 1.0

    def __bool__(self) -> bool:
        return self.valid


def simulate(graph, schedule: Iterable, record_memory: bool = False) -> Simulation:
    """Run ``schedule`` (a :class:`~solvers.Schedule` or any iterable of steps) on ``graph``."""
    nodes = graph.nodes
    held: set[Hashable] = set()
    computed: set[Hashable] = set()
    held_bytes = 0
    peak = 0
    peak_step = -1
    cost = 0.0
    memory: list[int] = []
    base = total_cost(graph)

    def result(error: str | None) -> Simulation:
        return Simulation(error is None, peak, cost, base, error, peak_step, tuple(memory))

    for position, step in enumerate(schedule):
        try:
            kind, node = step
        except (TypeError, ValueError):
            return result(f"step {position}: {step!r} is not a (kind, node) pair")
        try:
            known = node in nodes
        except TypeError:  # an unhashable node (a list from JSON): not a node of any graph
            known = False
        if not known:
            return result(f"step {position}: {node!r} is not a node of the graph")
        data = nodes[node]
        if kind == COMPUTE:
            if node in held:
                return result(f"step {position}: compute {node!r} while it is already held")
            for pred in graph.predecessors(node):
                if pred not in held:
                    return result(f"step {position}: compute {node!r} needs {pred!r}, which is not held")
            during = held_bytes + data["mem"] + data.get("workspace", 0)
            if during > peak or peak_step < 0:
                peak, peak_step = max(peak, during), position
            cost += data["cost"]
            held.add(node)
            computed.add(node)
            held_bytes += data["mem"]
            if record_memory:
                memory.append(during)
        elif kind == FREE:
            if node not in held:
                return result(f"step {position}: free {node!r} which is not held")
            if is_pinned(graph, node):
                return result(f"step {position}: free {node!r}, which is pinned (held to the end of the step)")
            held.remove(node)
            held_bytes -= data["mem"]
            if record_memory:
                memory.append(held_bytes)
        else:
            return result(f"step {position}: unknown step kind {kind!r} (expected 'compute' or 'free')")

    missing = [node for node in graph.nodes if node not in computed]
    if missing:
        return result(f"{len(missing)} node(s) never computed, e.g. {missing[0]!r}")
    dropped = [node for node in graph.nodes if is_output(graph, node) and node not in held]
    if dropped:
        return result(f"output node {dropped[0]!r} is not held at the end")
    return result(None)
