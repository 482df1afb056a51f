"""Hand-written schedules of profiled graphs, for runtime tests."""

from __future__ import annotations

import dataclasses

import networkx as nx

from solvers import schedule_from_computes, simulate
from solvers.graph import topological_order


def forward_and_backward(graph):
    order = topological_order(graph)
    loss = graph.graph["loss_node"]
    ancestors = nx.ancestors(graph, loss)
    forward = [v for v in order if v in ancestors]
    backward = [v for v in order if v not in ancestors and v != loss]
    return forward, loss, backward


def recompute_everything(graph):
    """Forward, loss, the whole forward again (pinned nodes excepted), backward."""
    forward, loss, backward = forward_and_backward(graph)
    again = [v for v in forward if not graph.nodes[v].get("pinned")]
    return schedule_from_computes(graph, forward + [loss] + again + backward)


def thrice(graph, node):
    """Store-all order, but ``node`` is computed twice more in the backward: right after the loss
    and right before its first backward reader."""
    forward, loss, backward = forward_and_backward(graph)
    first_reader = next(i for i, v in enumerate(backward) if graph.has_edge(node, v))
    computes = forward + [loss, node] + backward[:first_reader] + [node] + backward[first_reader:]
    schedule = schedule_from_computes(graph, computes)
    assert schedule.computes().count(node) == 3
    return schedule


def saved_forward_node(graph, random: bool | None = None):
    """A forward node that some backward node reads (an activation saved for the backward)."""
    forward, _, backward = forward_and_backward(graph)
    back = set(backward)
    for v in forward:
        data = graph.nodes[v]
        if data.get("pinned") or (random is not None and bool(data.get("random")) != random):
            continue
        if any(s in back for s in graph.successors(v)):
            return v
    raise LookupError("no saved forward node")


def with_schedule(plan, schedule):
    """The plan, running ``schedule`` instead (predicted figures updated)."""
    outcome = simulate(plan.graph, schedule)
    assert outcome.valid, outcome.error
    return dataclasses.replace(
        plan, schedule=schedule, predicted_peak_bytes=plan.fixed_bytes + outcome.peak_bytes,
        predicted_seconds=outcome.compute_cost,
    )
