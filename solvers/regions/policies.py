"""The save policies a checkpoint region may take, by the names plan files keep (``"h.3@matmuls"``).

A policy is PyTorch's selective checkpoint (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
named by aten op-name prefixes, so that ``solvers`` needs no torch: runtime/save_policies.py runs the
same table, the cost model (costs.py) prices it. Which policies, and why: docs/native.md, "Save policies".
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import networkx as nx


@dataclass(frozen=True)
class SavePolicy:
    """A selective-checkpoint policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``):
    inside a region, the outputs of the aten ops named by ``ops`` (op-name prefixes, ``"aten.mm."``,
    so that this module needs no torch) are saved in the forward (MUST_SAVE); every other op of the
    region is recomputed. runtime/native.py saves the same ops, matched by the same prefixes.

    ``draws``: the random draws are saved too (:func:`draw_chains`): the recomputation does not draw
    again. Eager dropout on CPU is ``torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)`` then a
    multiply, in place on one buffer: the run saves the allocation, the draw and the scaling (one
    buffer), and recomputes only the multiply."""

    ops: tuple[str, ...]
    draws: bool = False

    def saves(self, op: str) -> bool:
        """Whether the output of aten op ``op`` (``"aten.mm.default"``) is saved by name; a node of
        several ops (``op == ""``) is recomputed."""
        return bool(op) and op.startswith(self.ops)


_PROJECTIONS = ("aten.mm.", "aten.addmm.", "aten.convolution.", "aten._scaled_dot_product_")
_MATMULS = _PROJECTIONS + ("aten.bmm.", "aten.baddbmm.")
# New uninitialised tensors: under a policy with ``draws`` they are saved (the run cannot tell, when
# one is made, whether a draw will fill it; runtime/native.py).
ALLOCATIONS = ("aten.empty_like.", "aten.empty.", "aten.empty_strided.", "aten.new_empty.", "aten.new_empty_strided.")
# What scales a draw in place (dropout's ``noise.div_(1 - p)``), functionalized to ``div``/``mul`` of it.
_SCALINGS = ("aten.div.", "aten.mul.")

# The policies a region may take, by the names plan files keep (``"transformer.h.3@matmuls"``); the
# search takes the one with the cheapest predicted step that fits (the first listed on a tie). Which
# ones, and why not others, measured on GPT-2, BERT and Llama: docs/native.md, "Save policies".
SAVE_POLICIES: dict[str, SavePolicy] = {
    # The costly ops, whose outputs are cheap to hold next to the pointwise ops around them.
    "matmuls": SavePolicy(_MATMULS),
    # The same less bmm/baddbmm: in attention without a fused kernel (eager, or SDPA's math path
    # when attention dropout is on, on CPU) these are the score and context products, whose score
    # matrix is s^2 per head; recomputing them with the softmax and dropout around them holds no s^2
    # tensor, as Megatron's selective recompute of the attention core (Korthikanti et al. 2022,
    # "Reducing Activation Recomputation in Large Transformer Models"), and recomputes the pointwise
    # ops besides. The projections are mm/addmm in Hugging Face models (GPT-2's Conv1D, BERT's and
    # Llama's Linear), never bmm. With a fused attention kernel this saves what "matmuls" saves.
    "projections": SavePolicy(_PROJECTIONS),
    # Each of them with the random draws saved: on CPU a dropout's draw (bernoulli) is the costliest
    # op of a transformer block (GPT-2's attention dropout: 37.7 of the block's 84 ms forward), and
    # its mask is as large as the dropped tensor, so holding it trades bytes for time at about the
    # matmuls' rate (docs/native.md, "Save policies").
    "matmuls+draws": SavePolicy(_MATMULS, draws=True),
    "projections+draws": SavePolicy(_PROJECTIONS, draws=True),
}


def draw_chains(graph: nx.DiGraph, nodes: Sequence[Hashable]) -> tuple[set, set]:
    """The results of ``nodes`` (one region's forward ops) that a policy with ``draws`` saves besides
    its ops, and those of them that are one buffer with a later one (``aliased``: held through it).

    Saved: every allocation (:data:`ALLOCATIONS`) and every random op (node attribute ``random``).
    A draw that fills an allocation in place (read by one op only, a ``div``/``mul``: the
    functional form of dropout's ``div_``) is one buffer with that scaling, which is saved too; the
    allocation and the draw are then ``aliased``: the buffer is counted once, at the scaling."""
    members = set(nodes)
    saved: set = set()
    aliased: set = set()
    for v in nodes:
        data = graph.nodes[v]
        op = str(data.get("op", ""))
        if op.startswith(ALLOCATIONS):
            saved.add(v)
        if not data.get("random"):
            continue
        saved.add(v)
        filled = [p for p in graph.predecessors(v) if p in members and str(graph.nodes[p].get("op", "")).startswith(ALLOCATIONS)]
        aliased.update(filled)
        readers = list(graph.successors(v))
        if len(readers) == 1 and readers[0] in members and str(graph.nodes[readers[0]].get("op", "")).startswith(_SCALINGS):
            saved.add(readers[0])
            aliased.add(v)
    return saved, aliased


def split_policy(region: str) -> tuple[str, str | None]:
    """``"transformer.h.3@matmuls"`` -> ``("transformer.h.3", "matmuls")``; no ``@``: no policy."""
    base, _, policy = region.partition("@")
    if policy and policy not in SAVE_POLICIES:
        raise ValueError(f"unknown save policy {policy!r} in region {region!r}; known: {', '.join(SAVE_POLICIES)}")
    return base, policy or None


def saved_by_policy(op: str, policy: str | None) -> bool:
    """Whether ``policy`` saves the output of aten op ``op`` (its name, e.g. ``"aten.mm.default"``)."""
    return policy is not None and SAVE_POLICIES[policy].saves(op)
