"""Turn an order of computations into a schedule by freeing every result as early as possible.

Many solvers decide only *what is computed when* (a chain method's sequence of stage runs, a
Checkmate solution's R matrix, a CP-SAT solution's interval starts). Given that sequence, the
cheapest-memory schedule frees each computed instance right after its last use before the node is
computed again, and keeps the last instance of an output to the end. No valid schedule with the same
computations holds less at any step, so this pass is exact, not a heuristic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .graph import is_output, is_pinned
from .schedule import COMPUTE, FREE, Schedule, SolverInfo


def schedule_from_computes(graph, computes: Sequence[Hashable], info: SolverInfo | None = None) -> Schedule:
    """Schedule that computes ``computes`` in order and frees each result after its last use.

    Raises ``ValueError`` when a computation reads a node that was never computed before it, or
    when a pinned node is computed twice.
    """
    # For each compute position, the position of the last step that reads this instance.
    end_of_instance: list[int | None] = [None] * len(computes)
    live_instance: dict[Hashable, int] = {}
    for position, node in enumerate(computes):
        for pred in graph.predecessors(node):
            instance = live_instance.get(pred)
            if instance is None:
                raise ValueError(f"computation {position} of {node!r} reads {pred!r} before it is computed")
            end_of_instance[instance] = position
        if node in live_instance and is_pinned(graph, node):
            raise ValueError(f"pinned node {node!r} is computed twice")
        live_instance[node] = position
        end_of_instance[position] = position
    for node, instance in live_instance.items():
        if is_output(graph, node):
            end_of_instance[instance] = None  # the last instance of an output is held to the end

    frees_after: dict[int, list[Hashable]] = {}
    for position, node in enumerate(computes):
        end = end_of_instance[position]
        if end is not None:
            frees_after.setdefault(end, []).append(node)

    steps: list[tuple[str, Hashable]] = []
    for position, node in enumerate(computes):
        steps.append((COMPUTE, node))
        for freed in frees_after.get(position, ()):
            steps.append((FREE, freed))
    return Schedule(steps, info)


def drop_redundant_computes(graph, computes: Sequence[Hashable]) -> list[Hashable]:
    """Remove computations whose instance is never read and is not needed as the final output.

    A solver's raw compute order may contain such steps (a recomputation nobody reads); they cost
    time and memory for nothing. The first computation of every node is kept, because a valid
    schedule computes every node at least once.
    """
    keep = [True] * len(computes)
    read = [False] * len(computes)
    live_instance: dict[Hashable, int] = {}
    for position, node in enumerate(computes):
        for pred in graph.predecessors(node):
            if pred in live_instance:
                read[live_instance[pred]] = True
        live_instance[node] = position
    final = set(live_instance.values())
    seen: set[Hashable] = set()
    for position, node in enumerate(computes):
        first = node not in seen
        seen.add(node)
        if not first and not read[position] and not (position in final and is_output(graph, node)):
            keep[position] = False
    kept = [node for node, k in zip(computes, keep) if k]
    if len(kept) == len(computes):
        return kept
    return drop_redundant_computes(graph, kept)  # dropping one may make its inputs' instances unread
