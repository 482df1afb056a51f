"""Where ``torch.utils.checkpoint``'s non-reentrant recomputation of a region stops, and what the
region's program holds when it does.

The recomputation runs the region's forward again under a pack hook that counts the tensors the
forward saved; when the last one is packed again it raises ``_StopRecomputationError`` and the
replay unwinds (torch/utils/checkpoint.py, early stop). A tensor is packed by the op that *saves*
it, as autograd's generated code builds that op's node: an input before the op runs (its output is
never made), an output after. So the replay ends at the last op of the region that saved anything,
not at the last value a backward op reads: nanoGPT's attention ends with its output dropout,
``x * noise``, whose multiply saves the noise; the replay stops at the multiply with ``x`` (the
output projection) still alive, beside the noise.

And at the stop the replay holds what the program holds, not only what the graph reads later:
Python variables until their function returns (nanoGPT's ``q, k, v``, views of the fused
projection's output, to the end of the attention's ``forward``), a composite op's C++ locals
until it returns, the stopping op's arguments. profiler/lifetimes.py records both from the trace,
as node attributes of the op graph:

- ``forward_op``: the op's ordinal in the forward;
- ``autograd_seq``: on a forward op, the sequence number of the autograd node it created; on a
  backward op, that of the node it belongs to (the saving op of what a backward op reads is the
  forward op of its node);
- ``released_after``: the ordinal of the last forward op the result was alive through (absent when
  it outlived the forward: saved, or an output).

A graph without them (an eager profile, an older one) keeps the rule of earlier versions: the replay
ends at the last value a backward op reads, and holds each value to its last reader.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import networkx as nx

FORWARD_OP = "forward_op"
AUTOGRAD_SEQ = "autograd_seq"
RELEASED_AFTER = "released_after"


def has_lifetimes(graph: nx.DiGraph, nodes: Sequence[Hashable]) -> bool:
    """Whether every one of ``nodes`` (a region's forward ops) carries the trace's lifetime tags."""
    return bool(nodes) and all(FORWARD_OP in graph.nodes[v] for v in nodes)


def stopping_op(graph: nx.DiGraph, nodes: Sequence[Hashable], backward: Sequence[Hashable]) -> int | None:
    """The position in ``nodes`` of the op whose saved tensors are packed last: the last op that
    created an autograd node among those whose backward ops (``backward``) read a forward value.
    None when no op of the region saves anything the graph shows."""
    saving_nodes = {graph.nodes[b].get(AUTOGRAD_SEQ) for b in backward
                    if any(graph.nodes[p].get("kind") == "forward" for p in graph.predecessors(b))}
    saving_nodes.discard(None)
    positions = [i for i, v in enumerate(nodes) if graph.nodes[v].get(AUTOGRAD_SEQ) in saving_nodes]
    return positions[-1] if positions else None


def replay_end(graph: nx.DiGraph, nodes: Sequence[Hashable], backward: Sequence[Hashable],
               read: set[Hashable], last_needed: int | None) -> int | None:
    """How many of ``nodes`` the recomputation passes (cached ones included): up to the stopping op,
    which runs only when it saves its own output (a value some backward op reads, in ``read``); at
    least through ``last_needed`` (the position of the last value a backward op reads). None: no
    recomputation."""
    stop = stopping_op(graph, nodes, backward) if has_lifetimes(graph, nodes) else None
    if stop is None:
        return None if last_needed is None else last_needed + 1
    end = stop + 1 if nodes[stop] in read else stop
    return max(end, 0 if last_needed is None else last_needed + 1) or None


def program_holds(graph: nx.DiGraph, recomputed: Sequence[Hashable]) -> list[tuple[Hashable, Hashable]]:
    """(value, holder) pairs: each recomputed value is held until ``holder`` (a later recomputed
    op) has run, because the region's program holds it that long (``released_after``), or until
    the last recomputed op when the program still holds it where the replay stops. Empty for a graph
    without the trace's lifetime tags."""
    if not has_lifetimes(graph, recomputed):
        return []
    ordinals = [int(graph.nodes[v][FORWARD_OP]) for v in recomputed]
    holds = []
    for i, v in enumerate(recomputed):
        released = graph.nodes[v].get(RELEASED_AFTER)
        last = len(recomputed) - 1 if released is None else \
            max(j for j in range(i, len(recomputed)) if ordinals[j] <= int(released))
        if last > i:
            holds.append((v, recomputed[last]))
    return holds
