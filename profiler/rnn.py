"""oneDNN's LSTM layer (``nn.LSTM`` on CPU) as an op any graph executor can run.

``aten.mkldnn_rnn_layer`` returns, next to the layer's output and final states, a ``workspace``
(the gates of every time step) that its backward, ``mkldnn_rnn_layer_backward``, reads. Two things
break when the traced step is run op by op:

- the kernel writes the workspace only while grad mode is on: under ``torch.no_grad()``, where the
  profiler and the runtime run the graph (it is already differentiated), it returns an undefined
  tensor and the backward fails ("Expected a proper Tensor but got None ... argument #22
  'workspace'");
- its fake-tensor kernel gives the workspace 0 bytes, so the cost graph would not count it, and it
  is held from the layer's forward to its backward (28 KiB for a 5-step, 2-sequence, 16-wide layer,
  44 times the layer's output).

:func:`mkldnn_rnn_layer` is the same kernel, run with grad mode on (its inputs do not require grad,
so nothing is recorded), and its fake kernel gives the workspace the size the real kernel gives it,
learnt by running the kernel once on zeros of the same shapes (cached per shape). The tracer
records it in place of the aten op (profiler/capture.py, ``_DECOMPOSITIONS``), and the backward
as :func:`mkldnn_rnn_layer_backward` (the same kernel; its two bias gradients as two tensors). Same kernels, so the gradients are the eager model's, bit
for bit, and the layer is timed as one op.

GRU, and LSTM without oneDNN, are traced as their time steps' matmuls and pointwise ops: nothing to
do for them.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


@torch.library.custom_op("plan_checkpoints::mkldnn_rnn_layer", mutates_args=())
def mkldnn_rnn_layer(input: torch.Tensor, weight0: torch.Tensor, weight1: torch.Tensor, weight2: torch.Tensor,
                     weight3: torch.Tensor, hx_: torch.Tensor, cx_: torch.Tensor, reverse: bool,
                     batch_sizes: list[int], mode: int, hidden_size: int, num_layers: int, has_biases: bool,
                     bidirectional: bool, batch_first: bool,
                     train: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten.mkldnn_rnn_layer`` with grad mode on, so that a training call writes its workspace."""
    with torch.enable_grad():
        outputs = aten.mkldnn_rnn_layer.default(input, weight0, weight1, weight2, weight3, hx_, cx_, reverse,
                                                batch_sizes, mode, hidden_size, num_layers, has_biases,
                                                bidirectional, batch_first, train)
    return tuple(t.detach() for t in outputs)


@functools.lru_cache(maxsize=256)
def _workspace_numel(shapes: tuple, dtypes: tuple, flags: tuple) -> int:
    """Elements (bytes: the workspace is uint8) of the workspace the real CPU kernel writes for
    inputs of these shapes, dtypes and flags: measured by running it once on zeros."""
    with _disable_current_modes():  # real tensors, outside the fake and tracing modes
        tensors = [torch.zeros(shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes)]
        reverse, batch_sizes, *rest = flags
        workspace = mkldnn_rnn_layer(*tensors, reverse, list(batch_sizes), *rest)[3]
        return workspace.numel()


@mkldnn_rnn_layer.register_fake
def _(input, weight0, weight1, weight2, weight3, hx_, cx_, reverse, batch_sizes, mode, hidden_size, num_layers,
      has_biases, bidirectional, batch_first, train):
    tensors = (input, weight0, weight1, weight2, weight3, hx_, cx_)
    output, hy, cy, _ = aten.mkldnn_rnn_layer.default(*tensors, reverse, batch_sizes, mode, hidden_size, num_layers,
                                                      has_biases, bidirectional, batch_first, train)
    numel = 0
    if train:
        numel = _workspace_numel(tuple(tuple(t.shape) for t in tensors), tuple(t.dtype for t in tensors),
                                 (reverse, tuple(batch_sizes), mode, hidden_size, num_layers, has_biases,
                                  bidirectional, batch_first, train))
    return output, hy, cy, input.new_empty((numel,), dtype=torch.uint8)


@torch.library.custom_op("plan_checkpoints::mkldnn_rnn_layer_backward", mutates_args=())
def mkldnn_rnn_layer_backward(input: torch.Tensor, weight1: torch.Tensor, weight2: torch.Tensor,
                              weight3: torch.Tensor, weight4: torch.Tensor, hx_: torch.Tensor, cx_tmp: torch.Tensor,
                              output: torch.Tensor, hy_: torch.Tensor, cy_: torch.Tensor,
                              grad_output: torch.Tensor | None, grad_hy: torch.Tensor | None,
                              grad_cy: torch.Tensor | None, reverse: bool, mode: int, hidden_size: int,
                              num_layers: int, has_biases: bool, train: bool, bidirectional: bool,
                              batch_sizes: list[int], batch_first: bool,
                              workspace: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                                torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten.mkldnn_rnn_layer_backward``, whose two bias gradients (one tensor: the kernel returns
    it twice) come back as two tensors. Fake tensors kept the two as one object on a first call and
    made two on a cached one, so the same model traced to graphs of different structure (and a plan
    refused the model it was made for)."""
    grads = list(aten.mkldnn_rnn_layer_backward.default(
        input, weight1, weight2, weight3, weight4, hx_, cx_tmp, output, hy_, cy_, grad_output, grad_hy, grad_cy,
        reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional, batch_sizes, batch_first,
        workspace))
    seen: set[int] = set()
    for i, grad in enumerate(grads):
        if id(grad) in seen or any(grad is t for t in (input, weight1, weight2, weight3, weight4, hx_, cx_tmp)):
            grads[i] = grad.clone()
        seen.add(id(grads[i]))
    return tuple(grads)


@mkldnn_rnn_layer_backward.register_fake
def _(input, weight1, weight2, weight3, weight4, hx_, cx_tmp, output, hy_, cy_, grad_output, grad_hy, grad_cy,
      reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional, batch_sizes, batch_first, workspace):
    return (torch.empty_like(input), torch.empty_like(weight1), torch.empty_like(weight2), torch.empty_like(weight3),
            torch.empty_like(weight4), torch.empty_like(hx_), torch.empty_like(cx_tmp))


def _record_our_layer(*args, **kwargs):
    """The tracer's decomposition of ``aten.mkldnn_rnn_layer``: our op in its place."""
    return mkldnn_rnn_layer(*args, **kwargs)


def _record_our_backward(*args, **kwargs):
    return mkldnn_rnn_layer_backward(*args, **kwargs)


# aten op -> what the tracer records instead (profiler/capture.py adds these to its decompositions).
DECOMPOSITIONS = {aten.mkldnn_rnn_layer.default: _record_our_layer,
                  aten.mkldnn_rnn_layer_backward.default: _record_our_backward}
