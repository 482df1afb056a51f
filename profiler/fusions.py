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

(A closed form, ``exp(log_probs) * -c`` plus ``c`` at the targets, would need no intermediate at all,
but torch's log-softmax backward computes its exp with a faster, less exact kernel than
``torch.exp``: one element in ten then differs in the last bit, and gradients equal to the
un-checkpointed model's would no longer be exactly equal.)
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

# torch's Reduction enum, as nll_loss_backward receives it.
REDUCTION_NONE = 0
# The dense intermediate is computed CHUNK_BYTES of rows at a time, or in at most MAX_CHUNKS chunks
# when that is larger: the fused op's scratch, against a loop iteration and two kernel launches a
# chunk (1.6% of a logits tensor of 64 MiB or more, which on a GPU can be gigabytes).
CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 64


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
    rows, classes = log_probs.shape
    rows_per_chunk = max(1, CHUNK_BYTES // max(1, classes * log_probs.element_size()), -(-rows // MAX_CHUNKS))
    gradient = torch.empty_like(log_probs)
    for start in range(0, rows, rows_per_chunk):
        chunk = slice(start, min(rows, start + rows_per_chunk))
        chunk_grad_output = grad_output[chunk] if reduction == REDUCTION_NONE else grad_output
        dense = aten.nll_loss_backward(chunk_grad_output, log_probs[chunk], target[chunk], weight, reduction,
                                       ignore_index, total_weight)
        aten._log_softmax_backward_data.out(dense, log_probs[chunk], 1, log_probs.dtype, out=gradient[chunk])
        del dense  # before the next chunk's is allocated
    return gradient


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
