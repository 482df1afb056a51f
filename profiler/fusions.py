"""Rewrites of the joint graph that lower its memory without changing what it computes.

Only one so far, for the cross-entropy a language model ends with (``log_softmax`` then ``nll_loss``).
Autograd differentiates it in two ops, each allocating a tensor of the logits' size:
``nll_loss_backward`` (a dense, almost all-zero gradient of the log-probabilities) and
``_log_softmax_backward_data`` (the gradient of the logits, computed from it). With a large
vocabulary these are the largest tensors of the step, and both are alive at once, next to the
logits and the log-probabilities: that moment is the peak of a checkpointed language model (GPT-2,
BERT: 4 x the logits' bytes; Hugging Face's per-layer checkpointing peaks there).
:func:`cross_entropy_backward` runs the same two kernels a chunk of rows at a time into the result,
so the dense intermediate never exists whole: 3 x the logits' bytes, the same bits.
:func:`recompute_log_probs` gives a second trace whose backward reads the logits instead and
recomputes the log-probabilities a chunk at a time: 2 x the logits' bytes when the logits are held
anyway (a model output), for one more log-softmax; the planner turns to it when a budget is out of
reach on the first.

(A closed form, ``exp(log_probs) * -c`` plus ``c`` at the targets, would need no intermediate at all,
but torch's log-softmax backward computes its exp with a faster, less exact kernel than
``torch.exp``: one element in ten then differs in the last bit, and gradients equal to the
un-checkpointed model's would no longer be exactly equal.)
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

if TYPE_CHECKING:
    from .capture import JointGraph
    from .measure import OpTimes

aten = torch.ops.aten

# torch's Reduction enum, as nll_loss_backward receives it.
REDUCTION_NONE = 0
# The dense intermediate is computed CHUNK_BYTES of rows at a time, or in at most MAX_CHUNKS chunks
# when that is larger: the fused op's scratch, against a loop iteration and two kernel launches a
# chunk (1.6% of a logits tensor of 64 MiB or more, which on a GPU can be gigabytes).
CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 64


def _rows_per_chunk(rows: int, classes: int, element_size: int) -> int:
    return max(1, CHUNK_BYTES // max(1, classes * element_size), -(-rows // MAX_CHUNKS))


def chunk_bytes(values: torch.Tensor) -> int:
    """Bytes of one chunk of rows of ``values`` (rows, classes), as the fused ops cut them."""
    rows, classes = values.shape
    return _rows_per_chunk(rows, classes, values.element_size()) * classes * values.element_size()


def _chunked_backward(grad_output, rows_of, target, weight, reduction, ignore_index, total_weight,
                      from_logits: bool) -> torch.Tensor:
    rows, classes = rows_of.shape
    rows_per_chunk = _rows_per_chunk(rows, classes, rows_of.element_size())
    gradient = torch.empty_like(rows_of)
    for start in range(0, rows, rows_per_chunk):
        chunk = slice(start, min(rows, start + rows_per_chunk))
        log_probs = aten._log_softmax(rows_of[chunk], 1, False) if from_logits else rows_of[chunk]
        chunk_grad_output = grad_output[chunk] if reduction == REDUCTION_NONE else grad_output
        dense = aten.nll_loss_backward(chunk_grad_output, log_probs, target[chunk], weight, reduction,
                                       ignore_index, total_weight)
        aten._log_softmax_backward_data.out(dense, log_probs, 1, log_probs.dtype, out=gradient[chunk])
        del dense, log_probs  # before the next chunk's are allocated
    return gradient


@torch.library.custom_op("plan_checkpoints::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(grad_output: torch.Tensor, log_probs: torch.Tensor, target: torch.Tensor,
                           weight: torch.Tensor | None, reduction: int, ignore_index: int,
                           total_weight: torch.Tensor) -> torch.Tensor:
    """``_log_softmax_backward_data(nll_loss_backward(grad_output, log_probs, target, weight,
    reduction, ignore_index, total_weight), log_probs, 1, log_probs.dtype)``, holding the dense
    intermediate for a chunk of rows at a time (:data:`CHUNK_BYTES`, :data:`MAX_CHUNKS`) instead of
    all of it.

    ``log_probs``: (rows, classes); ``target``: (rows,) class indices; ``grad_output``: () or, for
    reduction "none", (rows,). Each chunk runs torch's own two kernels, whose results do not depend
    on the other rows, so the gradient is bit-for-bit torch's.
    """
    return _chunked_backward(grad_output, log_probs, target, weight, reduction, ignore_index, total_weight,
                             from_logits=False)


@torch.library.custom_op("plan_checkpoints::cross_entropy_backward_from_logits", mutates_args=())
def cross_entropy_backward_from_logits(grad_output: torch.Tensor, logits: torch.Tensor, target: torch.Tensor,
                                       weight: torch.Tensor | None, reduction: int, ignore_index: int,
                                       total_weight: torch.Tensor) -> torch.Tensor:
    """:func:`cross_entropy_backward` with ``log_probs = _log_softmax(logits, 1)`` recomputed a chunk
    of rows at a time (the same kernel on the same rows: the same bits), so that the backward reads
    the logits, which a language model returns and so holds anyway, instead of log-probabilities
    of the same size held from the forward (:func:`recompute_log_probs`)."""
    return _chunked_backward(grad_output, logits, target, weight, reduction, ignore_index, total_weight,
                             from_logits=True)


@cross_entropy_backward_from_logits.register_fake
def _(grad_output, logits, target, weight, reduction, ignore_index, total_weight):
    return torch.empty_like(logits)


@cross_entropy_backward.register_fake
def _(grad_output, log_probs, target, weight, reduction, ignore_index, total_weight):
    return torch.empty_like(log_probs)


def _through_detach(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and node.target is aten.detach.default:
        node = node.args[0]
    return node


def _fusable(softmax_backward: fx.Node) -> bool:
    """A log-softmax backward over the classes of an ``nll_loss_backward`` that nothing else reads,
    both over the same log-probabilities, in one dtype."""
    if softmax_backward.kwargs or len(softmax_backward.args) != 4:
        return False
    grad, output, dim, input_dtype = softmax_backward.args
    if not (isinstance(grad, fx.Node) and grad.op == "call_function" and grad.target is aten.nll_loss_backward.default):
        return False
    if grad.kwargs or len(grad.args) != 7 or len(grad.users) != 1:
        return False
    log_probs = output.meta.get("val")
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 2:
        return False
    if dim not in (1, -1) or input_dtype != log_probs.dtype:
        return False
    return _through_detach(grad.args[1]) is _through_detach(output)


def fuse_cross_entropy_backward(graph_module: fx.GraphModule) -> int:
    """Replace each fusable ``nll_loss_backward`` -> ``_log_softmax_backward_data`` pair in place by
    :func:`cross_entropy_backward`; returns how many were replaced."""
    graph = graph_module.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten._log_softmax_backward_data.default:
            continue
        if not _fusable(node):
            continue
        nll = node.args[0]
        grad_output, _, target, weight, reduction, ignore_index, total_weight = nll.args
        with graph.inserting_before(node):
            fused = graph.call_function(
                torch.ops.plan_checkpoints.cross_entropy_backward.default,
                (grad_output, node.args[1], target, weight, reduction, ignore_index, total_weight),
            )
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(nll)
        replaced += 1
    if replaced:
        graph.lint()
        graph_module.recompile()
    return replaced


def _log_softmax_read_by(fused: fx.Node) -> fx.Node | None:
    """The ``_log_softmax(logits, 1, False)`` whose result a fused backward reads, if it is one."""
    source = _through_detach(fused.args[1])
    if source.op != "call_function" or source.target is not aten._log_softmax.default:
        return None
    _, dim, half_to_float = source.args
    return source if dim in (1, -1) and half_to_float is False else None


def recompute_log_probs(joint: JointGraph) -> JointGraph | None:
    """A copy of ``joint`` whose fused cross-entropy backwards read the logits and recompute the
    log-probabilities in chunks (:func:`cross_entropy_backward_from_logits`): the log-probabilities
    then die with the forward's loss. Fx node names are kept, so the same measured times apply
    (:func:`recomputed_times`). None when ``joint`` has no such backward."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(joint.graph_module.graph, {}))
    replaced = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.plan_checkpoints.cross_entropy_backward.default:
            source = _log_softmax_read_by(node)
            if source is None:
                continue
            node.target = torch.ops.plan_checkpoints.cross_entropy_backward_from_logits.default
            node.args = (node.args[0], source.args[0], *node.args[2:])
            replaced += 1
    if not replaced:
        return None
    unread = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.detach.default and not n.users]
    while unread:  # detaches nothing reads now: those the fused op read the log-probabilities through
        node = unread.pop()
        parent = node.args[0]
        graph.erase_node(node)
        if parent.op == "call_function" and parent.target is aten.detach.default and not parent.users:
            unread.append(parent)
    graph.lint()
    return replace(joint, graph_module=fx.GraphModule(joint.graph_module, graph), log_probs_recomputed=True)


def recomputed_times(joint: JointGraph, times: OpTimes) -> OpTimes:
    """``times`` (measured on the graph :func:`recompute_log_probs` copied) for its copy: each
    backward that recomputes the log-probabilities takes the measured forward log-softmax's time
    more, and one chunk of them more scratch."""
    seconds = dict(times.seconds)
    scratch = dict(times.scratch_bytes)
    from_logits = torch.ops.plan_checkpoints.cross_entropy_backward_from_logits.default
    for node in joint.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is from_logits:
            source = next(u for u in node.args[1].users if u.target is aten._log_softmax.default)
            seconds[node.name] = seconds.get(node.name, 0.0) + seconds.get(source.name, 0.0)
            scratch[node.name] = scratch.get(node.name, 0) + chunk_bytes(node.args[1].meta["val"])
    return replace(times, seconds=seconds, scratch_bytes=scratch)
