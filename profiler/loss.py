"""The planning loss, run eagerly once before tracing (profiler/capture.py).

The gradients of the model's outputs (``tangents``) are inputs of the traced graph: the caller's
loss produces them. Running the loss on the model's real outputs tells which outputs it
differentiates and the tangents' shapes, and measures what the traced graph leaves out: the loss's
time, the memory it and its gradient allocate, and the loss value the caller holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from .allocations import allocated_while, quiet_native_stderr
from .errors import CaptureError, ModelCallError, first_line
from .inputs import TensorSpec
from .storage import storage_bytes
from .oom import raise_if_out_of_memory
from .state import cuda_devices


@dataclass(frozen=True)
class LossInfo:
    """The planning loss, run eagerly: its cost and which model outputs it differentiates.

    ``seconds``: the least time of the loss and its gradient wrt the outputs over the timed runs. ``workspace_bytes``: the
    most the loss and its gradient allocate at once beyond the gradients they hand back (a
    cross-entropy's log-softmax, say), measured; ``value_bytes``: what the caller holds from the
    loss on beyond those gradients (the loss value, and the gradient autograd seeds its backward
    with); both 0 when not measured."""

    seconds: float
    tangent_outputs: tuple[int, ...]  # indices into the model's tensor outputs
    tangent_specs: tuple[TensorSpec, ...]
    workspace_bytes: int = 0
    value_bytes: int = 0


def default_loss(output) -> torch.Tensor:
    """Without a loss function the loss is the sum of the output's floating-point tensors
    (docs/contract.md, "The Python API")."""
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise CaptureError("the model's output has no floating-point tensor to take a loss of; pass loss_fn")
    return sum(t.sum() for t in leaves)


def run_planning_loss(model: torch.nn.Module, args, kwargs, loss_fn: Callable, repeats: int = 3,
                      hold_activations: bool = True) -> tuple[LossInfo, list[torch.Tensor]]:
    """One eager forward, then the loss and its gradient wrt the outputs: timed ``repeats`` times,
    then run once more with its allocations recorded. Returns the loss's figures and its gradients
    (the tangents), contiguous.

    ``hold_activations=False`` (a memory-bounded profile): the forward runs under ``torch.no_grad``,
    holding none of what autograd would save, and which outputs require grad is learnt from the
    same forward on fake tensors (:func:`_outputs_without_autograd`). The loss sees the same
    values either way."""
    outputs = _eager_outputs(model, args, kwargs) if hold_activations else _outputs_without_autograd(model, args, kwargs)
    on_cuda = cuda_devices(outputs.tensors)
    run = _LossRun(outputs, loss_fn)
    seconds = _least_seconds(run, repeats, torch.cuda.synchronize if on_cuda else (lambda: None))
    # Outside the traced graph the loss's intermediates would go uncounted: with a cross-entropy on
    # a language model's logits, a log-softmax as large as the logits. (Quiet: torch warns on stderr
    # when a block allocated before the recording is released in it; the loss ran visibly above.)
    kept: list = []
    with quiet_native_stderr():
        peak, left = allocated_while(lambda: kept.append(run()), on_cuda[0] if on_cuda else None)
    used = [(i, g) for i, g in zip(outputs.differentiable, kept.pop()) if g is not None]
    if not used:
        raise CaptureError("the loss does not depend on any output of the model")
    info = LossInfo(
        seconds=seconds,
        tangent_outputs=tuple(i for i, _ in used),
        tangent_specs=tuple(TensorSpec.of(g) for _, g in used),
        workspace_bytes=max(0, peak - left),
        value_bytes=run.value_bytes,
    )
    # Contiguous, as the zeros a saved plan is traced with (capture(..., loss=...)): a gradient in
    # the strides of a transposed output traced another backward (a view where the zeros gave a
    # copy and a view), and the runtime refused the plan made on it (fingerprints differ). The
    # trace made with contiguous tangents copies whatever layout autograd passes in at run time.
    return info, [g.detach().contiguous() for _, g in used]


@dataclass
class _DetachedOutputs:
    """The model's output, flat, its tensors detached: the loss's gradient is wanted wrt each output
    as the caller sees it, not through the model (a Hugging Face model's ``loss`` output depends on
    its ``logits``)."""

    leaves: list
    spec: pytree.TreeSpec
    tensors: list[torch.Tensor]  # the tensor leaves, in order
    differentiable: list[int]  # indices into ``tensors`` of those that require grad


def _call_model(model: torch.nn.Module, args, kwargs):
    try:
        return model.forward(*args, **kwargs)
    except Exception as error:  # a user's mistake (inputs that do not fit the model), not a bug of ours
        raise_if_out_of_memory(error)  # the device's limit, not the model's fault
        raise ModelCallError(f"the model raised on the example inputs: {first_line(error)}") from error


def _eager_outputs(model: torch.nn.Module, args, kwargs) -> _DetachedOutputs:
    output = _call_model(model, args, kwargs)
    leaves, spec = pytree.tree_flatten(output)
    return _detached(leaves, spec, [isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in leaves])


def _outputs_without_autograd(model: torch.nn.Module, args, kwargs) -> _DetachedOutputs:
    """The model's outputs from a forward under ``torch.no_grad`` (nothing saved for a backward),
    each marked as requiring grad where the same forward on fake tensors with autograd says it does.
    A forward fake tensors cannot run (data-dependent control flow) is run eagerly with autograd,
    saving nothing for a backward (a saved-tensors hook drops what autograd would keep: the outputs
    are detached, nothing goes back through the model), so that which outputs require grad is
    autograd's own: the tracer will refuse such a model anyway, and its eager recording is bounded
    by profiler/eager_bound.py, which this forward must not pass first."""
    requires_grad = _fake_requires_grad(model, args, kwargs)
    if requires_grad is None:
        with torch.autograd.graph.saved_tensors_hooks(_dropped, _never_unpacked):
            return _eager_outputs(model, args, kwargs)
    with torch.no_grad():
        output = _call_model(model, args, kwargs)
    leaves, spec = pytree.tree_flatten(output)
    if len(leaves) != len(requires_grad):  # the fake forward returned another structure: trust autograd
        del output, leaves
        return _eager_outputs(model, args, kwargs)
    return _detached(leaves, spec, requires_grad)


def _dropped(tensor: torch.Tensor) -> None:
    return None


def _never_unpacked(packed) -> torch.Tensor:
    raise RuntimeError("the planning loss's forward saved nothing for a backward through the model")


def _fake_requires_grad(model: torch.nn.Module, args, kwargs) -> list[bool] | None:
    """Per output leaf, whether the forward with autograd makes it require grad, from a forward on
    fake tensors (sizes only, no memory); None when fake tensors cannot run the forward."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module

    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
            fake_state = {name: mode.from_tensor(t) for name, t in state.items()}
            fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (tuple(args), dict(kwargs)))
            with _reparametrize_module(model, fake_state, tie_weights=True):
                output = model.forward(*fake_args, **fake_kwargs)
            leaves = pytree.tree_leaves(output)
            return [isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in leaves]
    except Exception:  # the fake forward is only a shortcut: the eager forward decides below
        return None


def _detached(leaves: list, spec: pytree.TreeSpec, requires_grad: list[bool]) -> _DetachedOutputs:
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if not any(requires_grad[i] for i in positions):
        raise CaptureError("no output of the model requires grad: there is nothing to differentiate")
    detached = list(leaves)
    for i in positions:
        detached[i] = leaves[i].detach().requires_grad_(requires_grad[i])
    tensors = [detached[i] for i in positions]
    return _DetachedOutputs(detached, spec, tensors, [i for i, t in enumerate(tensors) if t.requires_grad])


@dataclass
class _LossRun:
    """The loss on the detached outputs and its gradients wrt the differentiable ones (None where
    it does not depend on one); ``value_bytes`` from the last run (:func:`_loss_value_bytes`)."""

    outputs: _DetachedOutputs
    loss_fn: Callable
    value_bytes: int = 0

    def __call__(self) -> tuple:
        outputs = self.outputs
        try:
            loss = self.loss_fn(pytree.tree_unflatten(outputs.leaves, outputs.spec))
        except Exception as error:
            raise_if_out_of_memory(error)
            raise ModelCallError(f"the loss function raised on the model's output: {first_line(error)}") from error
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            raise CaptureError(f"loss_fn must return a scalar floating-point tensor, got {_describe(loss)}")
        if not loss.requires_grad:
            raise CaptureError("the loss does not depend on any output of the model that requires grad")
        self.value_bytes = _loss_value_bytes(loss, outputs.tensors)
        return torch.autograd.grad(loss, [outputs.tensors[i] for i in outputs.differentiable], allow_unused=True)


def _least_seconds(run: Callable, repeats: int, sync: Callable) -> float:
    """The least wall time of ``repeats`` calls of ``run`` (seconds; ``sync`` waits for the device),
    as the op times are taken (profiler/measure.py): another process's load only adds to a call's
    time. (It does not undo contention that lasts: on 2 threads of a 2-core machine at load ~4, a
    CNN's cross-entropy and its gradient took 37-74 ms in every call, 0.7-1.7 ms on one thread.)
    Each call's result is held until the next returns, as a training loop holds its gradients."""
    times, result = [], None
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        result = run()
        sync()
        times.append(time.perf_counter() - start)
    del result
    return min(times)


def _loss_value_bytes(loss: torch.Tensor, outputs: list[torch.Tensor]) -> int:
    """Bytes the caller holds from the loss through the backward: the loss value and the gradient
    of the same size that ``loss.backward()`` seeds with (8 bytes for a float32 mean); 0 when
    the loss is a model output (``out.loss``): its seed is that output's tangent, counted already."""
    storage = loss.untyped_storage()
    if any(t.untyped_storage().data_ptr() == storage.data_ptr() for t in outputs):
        return 0
    return 2 * storage_bytes(loss)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    return type(value).__name__
