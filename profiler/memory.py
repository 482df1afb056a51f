"""Measure a training step's peak memory and time, independently of any plan.

On CPU the peak comes from replaying the allocator's own events recorded by
``torch.profiler.profile(profile_memory=True)``: every allocation and free of the step, in order
(process RSS is no use: the allocator caches). On CUDA it is ``torch.cuda.max_memory_allocated``.
Either way the step's peak is reported whole: the bytes already resident when it starts
(parameters, buffers, inputs) plus the most the step allocated on top of them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree

from .allocations import allocated_while
from .capture import autocast_disabled, default_loss
from .inputs import normalise_inputs
from .library_memory import clear_cublas_workspaces
from .state import cuda_devices, preserved_state


@dataclass(frozen=True)
class StepMeasurement:
    """``peak_bytes``: resident bytes at the start of the step (``resident_bytes``: parameters,
    buffers, inputs), what the warm-up step left allocated beyond its tensors (``library_bytes``:
    on CUDA, cuBLAS's workspaces, profiler/library_memory.py) plus the largest amount the step
    allocated on top of them (``step_peak_bytes``). ``seconds``: median wall time of ``runs`` steps
    after one warm-up step."""

    peak_bytes: int
    resident_bytes: int
    step_peak_bytes: int
    seconds: float
    runs: int
    device: str
    library_bytes: int = 0


def resident_bytes(model: torch.nn.Module, tensors=()) -> int:
    """Bytes of the distinct storages of the model's parameters and buffers and of ``tensors``."""
    seen: dict = {}
    for t in [*model.parameters(), *model.buffers(), *tensors]:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _training_step(model, args, kwargs, loss_fn) -> Callable[[], None]:
    """One step as a training loop runs it under ``torch.autocast``: the forward and loss inside it,
    the backward outside (``with autocast: loss = ...; loss.backward()``, as PyTorch's AMP recipe
    and nanoGPT's train.py do). Autocast caches its casts of the parameters (their bfloat16 copies)
    until the outermost autocast context exits: a step measured inside one context the planner was
    called in found them cast by the step before, allocated before the measurement began, and
    measured low by their size (a nanoGPT under CPU bf16 autocast: 14,460,936 B, against
    14,870,536 B in its own loop; its 60% plan 8,501,000 B, 8,784,136 B in the loop, over its budget).
    So the cache is cleared where the loop's contexts would exit: after the loss and after the
    backward, and before the first step (:func:`measure_step`, outside the measured region). Outside autocast the clears do
    nothing."""
    def step():
        for p in model.parameters():
            p.grad = None
        output = model(*args, **kwargs)
        loss = loss_fn(output)
        torch.clear_autocast_cache()
        with autocast_disabled():
            loss.backward()
        # A checkpoint's recomputation casts again under the autocast it restores; in the loop that
        # context is the outermost and clears its casts on exit; here the planner's context encloses
        # it: cleared, or the next step's forward finds them cached and its selective checkpoints
        # count fewer casts than their recomputation ("aten._to_copy.default ... not found in storage").
        torch.clear_autocast_cache()
        del output, loss

    return step


def measure_step(model: torch.nn.Module, example_inputs, loss_fn: Callable | None = None, repeats: int = 5,
                 preserve_state: bool = True, warm_up: bool = True) -> StepMeasurement:
    """Run training steps of ``model`` (forward, ``loss_fn``, backward; gradients set to ``None``
    before each) and measure the peak memory of one and the median time of ``repeats`` (``repeats=0``:
    the peak alone, ``seconds`` NaN).

    With ``preserve_state`` the RNG and the buffers are restored afterwards; the parameters'
    ``.grad`` hold the last step's gradients. ``warm_up=False`` skips the warm-up step before the
    measured one on CPU, for a model whose every op ran in this process already (a profile); on
    CUDA the warm-up always runs (first steps allocate cuBLAS workspaces and streams).
    """
    args, kwargs = normalise_inputs(example_inputs)
    loss_fn = loss_fn or default_loss
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    devices = cuda_devices([*model.parameters(), *tensors])
    step = _training_step(model, args, kwargs, loss_fn)
    device = "cuda" if devices else "cpu"
    sync = torch.cuda.synchronize if devices else (lambda: None)
    guard = preserved_state(model, devices) if preserve_state else _nothing()
    with guard:
        torch.clear_autocast_cache()  # casts cached before the step (see _training_step)
        if devices:  # the warm-up allocates the workspaces again, as a training run's first step does
            clear_cublas_workspaces()
            before_warm_up = torch.cuda.memory_allocated(devices[0])
        if warm_up or devices:
            step()  # warm-up: lazy initialisation, allocator caches
        for p in model.parameters():
            p.grad = None
        # What the warm-up left allocated is held by every later step (cuBLAS's workspaces); the
        # measured step's own peak is above it.
        library = max(0, torch.cuda.memory_allocated(devices[0]) - before_warm_up) if devices else 0
        resident = resident_bytes(model, tensors)
        step_peak, _ = allocated_while(step, devices[0] if devices else None)
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times) if times else float("nan")
    return StepMeasurement(resident + library + step_peak, resident, step_peak, seconds, repeats, device, library)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
