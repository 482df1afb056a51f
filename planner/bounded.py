"""The device as a bound on planning: how much memory the device has, and how much profiling may hold.

Planning a step that does not fit must not need the memory the step needs. The profile's sizes come
from the fake trace (exact, no memory); its op times are measured within a **bound**, evicting and
recomputing values (profiler/rematerialize.py). The bound is the lower of the device's memory and a
byte budget: a plan within the budget is what the device will run, so profiling within it runs
nothing larger than the plan's own step (never below what the largest single op needs).

Device memory (bytes the step may use, parameters, buffers and inputs included):

- given: ``plan(..., device_memory=)`` / ``--device-memory`` (a byte size, ``"8GiB"``);
- on CUDA by default: the free memory (``torch.cuda.mem_get_info``) plus what this process's
  caching allocator already holds (``torch.cuda.memory_reserved``, the parameters among it), at
  most the share ``torch.cuda.set_per_process_memory_fraction`` allows the allocator (its fraction
  of the total memory);
- on CPU by default: under an address-space limit (``ulimit -v``, ``RLIMIT_AS``), what the limit
  leaves free (the limit less the process's mapped size, ``VmSize``) plus the bytes of the model's
  parameters, buffers and inputs (already mapped); without a limit, none: only the budget bounds.

A byte budget above the device memory is refused before anything runs (:class:`DeviceMemoryError`).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from profiler.memory import resident_bytes
from profiler.oom import cpu_free_bytes

from .budget import Budget, BudgetError, format_bytes, parse_budget


class DeviceMemoryError(ValueError):
    """A budget above the device's memory, or a device memory that is not a size in bytes."""


def parse_device_memory(value) -> int | None:
    """``device_memory=`` as bytes: None, an int, or a size (``"8GiB"``; no percentage)."""
    if value is None:
        return None
    try:
        parsed = parse_budget(value)
    except BudgetError:
        raise DeviceMemoryError(f"device memory {value!r} is not a size; give a whole number of bytes or a size with a "
                                "unit (8GB = 8*10^9 bytes, 8GiB = 8*2^30 bytes; also MB/MiB, TB/TiB)") from None
    if parsed.bytes is None:
        raise DeviceMemoryError(f"device memory {value!r} is a percentage; give a size in bytes (e.g. 8GiB or 8000000000)")
    return parsed.bytes


def device_memory_of(model: torch.nn.Module, example_inputs, device_memory=None) -> int | None:
    """The bytes the step may use on the model's device (the module docstring), None when unknown
    (CPU without an address-space limit)."""
    given = parse_device_memory(device_memory)
    if given is not None:
        return given
    tensors = [t for t in pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor)]
    device = next((p.device for p in model.parameters()), None) or next((t.device for t in tensors), None)
    if device is not None and device.type == "cuda":
        return cuda_device_memory(device)
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return None
    free = cpu_free_bytes()
    return None if free is None else free + resident_bytes(model, tensors)


def cuda_device_memory(device: torch.device) -> int:
    """What the caching allocator may still hold on ``device`` (bytes), what it holds now included:
    the free memory plus its reserved bytes, capped by its per-process fraction of the total (the
    allocator refuses a segment that would take its reserved bytes past that share)."""
    free, total = torch.cuda.mem_get_info(device)
    available = free + torch.cuda.memory_reserved(device)
    return int(min(available, _memory_fraction(device) * total))


def _memory_fraction(device: torch.device) -> float:
    """The allocator's per-process fraction (1.0 where this torch cannot say)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        return float(getter(device))
    native = getattr(torch._C, "_cuda_getMemoryFraction", None)  # before torch exposed the getter
    return 1.0 if native is None else float(native(device.index or 0))


def profiling_bound(budget: Budget, device_memory: int | None) -> int | None:
    """What profiling may hold (bytes): the lower of a byte budget and the device memory; None when
    neither is known (a percentage budget without a device memory)."""
    bounds = [b for b in (budget.bytes, device_memory) if b is not None]
    return min(bounds) if bounds else None


def check_within_device(budget: Budget, budget_bytes: int | None, device_memory: int | None) -> None:
    """Refuse a budget above the device memory (``budget_bytes``: the budget resolved, for a
    percentage)."""
    if device_memory is None or budget_bytes is None or budget_bytes <= device_memory:
        return
    raise DeviceMemoryError(
        f"budget {budget} ({format_bytes(budget_bytes)}) is above the device's memory, {format_bytes(device_memory)} "
        f"({device_memory} bytes: device_memory= / --device-memory, by default the free memory on CUDA, or the "
        "address-space limit's on CPU): a plan for it could not run there; give a budget within the device's memory")


def predicted_step_fits(predicted_peak_bytes: int, bound: int | None, margin: float = 0.02) -> bool:
    """Whether the un-checkpointed step, predicted at ``predicted_peak_bytes``, may be run for real
    within ``bound`` (with ``margin`` for what eager allocates beyond the trace's tensors)."""
    return bound is None or predicted_peak_bytes * (1 + margin) <= bound
