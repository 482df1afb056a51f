"""Dropout on a non-contiguous tensor draws the eager step's mask.

CPU dropout is ``torch.empty_like(x).bernoulli_(1 - p)``: the noise takes ``x``'s strides (a
transposed activation: ``nn.TransformerEncoder(batch_first=True)``'s attention, an ``nn.LSTM``'s
batch-first output) and ``bernoulli_`` fills it in place. Functionalization rewrites the in-place
op as ``aten.bernoulli.p``, whose kernel allocates a *contiguous* result and fills that: the same
draws land on other elements, and the planned step's masks differed from eager's (a linear layer
followed by a dropout on its transposed output: max relative gradient error 0.55; a 1-layer LSTM
language model: 0.18).

:func:`bernoulli_strided` draws exactly as the in-place op does, into a new tensor of the given
shape and strides. Before functionalization, :func:`draw_in_place_masks_like_eager`
puts it in place of every ``bernoulli_`` on a non-contiguous tensor, followed by a copy into that
tensor; :func:`drop_copies_into_fresh_tensors` then removes the copy that functionalization makes
of it (a copy into an uninitialised tensor of the same layout is its source). On a contiguous
tensor both ops fill the same memory in the same order, and the graph is left as it was.
"""

from __future__ import annotations

import torch
from torch import fx

aten = torch.ops.aten


@torch.library.custom_op("plan_checkpoints::bernoulli_strided", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded, torch.Tag.flexible_layout))
def bernoulli_strided(size: list[int], stride: list[int], p: float, dtype: torch.dtype, *,
                      device: torch.device) -> torch.Tensor:
    """``torch.empty_strided(size, stride).bernoulli_(p)``: what ``t.bernoulli_(p)`` writes into a
    tensor ``t`` of that layout, in a new tensor. Tagged random: the runtime saves and replays the
    generator state around it as around any random op. It reads no tensor, so that a compiler
    cannot hand it another layout than the one it is given (hence ``flexible_layout``: inductor
    refuses a random op that needs its inputs' exact strides)."""
    return torch.empty_strided(size, stride, dtype=dtype, device=device).bernoulli_(p)


@bernoulli_strided.register_fake
def _(size, stride, p, dtype, *, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def draw_in_place_masks_like_eager(graph_module: fx.GraphModule) -> int:
    """Replace each ``t.bernoulli_(p)`` on a non-contiguous tensor of the first (non-functional)
    trace by ``t.copy_(bernoulli_strided(t.shape, t.stride(), p, ...))``; returns how many were replaced. The new
    nodes carry the old one's metadata (its module and phase tags)."""
    graph = graph_module.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.bernoulli_.float or node.kwargs.get("generator"):
            continue
        target, p = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        value = target.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.is_contiguous():
            continue
        # The device is keyword-only: torch's run_and_save_rng_state (the compiled runtime's wrapper
        # of random ops) finds an op's device in its tensors or its ``device`` keyword, and the
        # replay through functionalization would make a positional one positional.
        layout = (list(value.shape), list(value.stride()), p, value.dtype)
        with graph.inserting_before(node):
            drawn = graph.call_function(torch.ops.plan_checkpoints.bernoulli_strided.default, layout,
                                        {"device": value.device})
            copied = graph.call_function(aten.copy_.default, (target, drawn))
        drawn.meta = dict(node.meta)
        copied.meta = dict(node.meta)
        node.replace_all_uses_with(copied)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        graph_module.recompile()
    return replaced


_FRESH = (aten.empty_like.default, aten.empty.memory_format, aten.empty_strided.default)


def drop_copies_into_fresh_tensors(graph_module: fx.GraphModule) -> int:
    """In the functional graph, ``aten.copy(dst, src)`` where ``dst`` is a new uninitialised tensor
    (``empty_like``, ``empty``, ``empty_strided``) of ``src``'s shape, strides, dtype and device is
    ``src`` itself: its readers read ``src``. Returns how many copies were removed (the caller
    removes what is then dead)."""
    removed = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target is not aten.copy.default or len(node.args) != 2:
            continue
        dst, src = node.args
        if not (isinstance(dst, fx.Node) and isinstance(src, fx.Node) and dst.target in _FRESH):
            continue
        a, b = dst.meta.get("val"), src.meta.get("val")
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if (a.shape, a.stride(), a.dtype, a.device) != (b.shape, b.stride(), b.dtype, b.device):
            continue
        node.replace_all_uses_with(src)
        removed += 1
    return removed
