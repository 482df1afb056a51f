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
from .capture import default_loss
from .inputs import normalise_inputs
from .state import cuda_devices, preserved_state


@dataclass(frozen=True)
class StepMeasurement:
    """``peak_bytes``: resident bytes at the start of the step (``resident_bytes``: parameters,
    buffers, inputs) plus the largest amount the step allocated on top of them (``step_peak_bytes``).
    ``seconds``: median wall time of ``runs`` steps after one warm-up step."""

    peak_bytes: int
    resident_bytes: int
    step_peak_bytes: int
    seconds: float
    runs: int
    device: str


def resident_bytes(model: torch.nn.Module, tensors=()) -> int:
    """Bytes of the distinct storages of the model's parameters and buffers and of ``tensors``."""
    seen: dict = {}
    for t in [*model.parameters(), *model.buffers(), *tensors]:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _training_step(model, args, kwargs, loss_fn) -> Callable[[], None]:
    def step():
        for p in model.parameters():
            p.grad = None
        output = model(*args, **kwargs)
        loss = loss_fn(output)
        loss.backward()
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
        if warm_up or devices:
            step()  # warm-up: lazy initialisation, allocator caches
        for p in model.parameters():
            p.grad = None
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
    return StepMeasurement(resident + step_peak, resident, step_peak, seconds, repeats, device)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
