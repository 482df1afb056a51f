"""Keep an eager recording of the step within the device's memory: refuse before an op would pass it.

profiler/eager.py records the un-checkpointed step of a model the tracer cannot follow by running
it, with real tensors: unlike a traced step (profiler/rematerialize.py) it cannot evict and
recompute. So where that step does not fit the device, the recording stops before the allocation
that would pass the bound: before each op of the first recorded step, the bytes its outputs will
take are found by running the op on the meta device (shapes and dtypes only, nothing allocated),
and when the step's live bytes (the parameters, buffers and inputs, and every storage the step has
made and not freed) plus those would exceed the bound, or (on CPU under an address-space limit)
those alone exceed what the limit leaves free now, :class:`profiler.oom.OutOfMemory` is raised,
"out of memory on DEVICE: N bytes asked, M free". An op the meta device cannot run (a data-dependent
shape: ``nonzero``, an MoE's routing) is checked right after it runs instead, its outputs counted
then: the step never holds more than the bound plus that one op's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from .oom import OutOfMemory, cpu_free_bytes
from .storage import storage_bytes


def cpu_free_under_a_limit() -> int | None:
    """On CPU under an address-space limit (``RLIMIT_AS``), the bytes still free below it; else None."""
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return None
    return cpu_free_bytes()


def _to_meta(value):
    return value.to("meta") if isinstance(value, torch.Tensor) and value.device.type != "meta" else value


def predicted_output_bytes(func, args, kwargs) -> int | None:
    """Bytes of the fresh storages ``func(*args, **kwargs)`` will return (outputs that share no
    storage with an argument), from a run on the meta device; None when it cannot run there."""
    meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    try:
        out = func(*meta_args, **meta_kwargs)
    except Exception:  # data-dependent shapes, ops without a meta kernel: checked after the op runs
        return None
    inputs = {t.untyped_storage()._cdata for t in pytree.tree_leaves((meta_args, meta_kwargs))
              if isinstance(t, torch.Tensor)}
    fresh = {}
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs:
            fresh[t.untyped_storage()._cdata] = storage_bytes(t)
    return sum(fresh.values())


ADVICE = ("The step of a model the tracer cannot follow is recorded whole, un-checkpointed, and it holds more than "
          "the device's {bound} bytes (device_memory= / --device-memory, or what the device has free); plan it on a "
          "device that holds its un-checkpointed step, or on smaller example inputs")


# Left free below an address-space limit for the recording to stop cleanly: torch.profiler's events,
# turned into Python objects when it stops (it failed with std::bad_alloc where 1 MB was left).
FINISHING_BYTES = 8 * 2**20


@dataclass
class StepBound:
    """The bound an eager recording keeps to. ``bound_bytes``: what the step may hold, resident
    bytes included; ``resident_bytes``: the parameters', buffers' and inputs' (held throughout);
    ``held_bytes``: what the step has made and still holds (kept up to date by the recorder)."""

    bound_bytes: int
    resident_bytes: int
    device: str
    during: str = "recording the step eagerly"
    held_bytes: int = 0
    peak_bytes: int = 0
    # What the device has free now (bytes; None: not known), read before each op: on CPU under an
    # address-space limit the limit less the mapped size, which the planner's own objects and the
    # allocator's unused blocks also take (a cap's free memory, read when planning began, had
    # shrunk by 13 MB when the step was recorded after the tracer had tried).
    free_now: Callable[[], int | None] = lambda: None

    def before(self, func, args, kwargs) -> bool:
        """Refuse ``func`` if its outputs would pass the bound; False when they could not be
        predicted (:meth:`after` checks them once made)."""
        asked = predicted_output_bytes(func, args, kwargs)
        if asked is None:
            return False
        self._check(asked)
        free = self.free_now() if asked else None
        if free is not None and asked > free - FINISHING_BYTES:
            raise OutOfMemory(self.device, asked, max(free - FINISHING_BYTES, 0), self.during,
                              ADVICE.format(bound=self.bound_bytes))
        return True

    def after(self, made_bytes: int) -> None:
        """The step now holds ``made_bytes`` more (counted by the recorder), checked."""
        self.held_bytes += made_bytes
        self.peak_bytes = max(self.peak_bytes, self.resident_bytes + self.held_bytes)
        if self.resident_bytes + self.held_bytes > self.bound_bytes:
            self._check(0)

    def freed(self, freed_bytes: int) -> None:
        self.held_bytes -= freed_bytes

    def _check(self, asked: int) -> None:
        free = self.bound_bytes - self.resident_bytes - self.held_bytes
        if asked > free:
            raise OutOfMemory(self.device, asked, max(free, 0), self.during, ADVICE.format(bound=self.bound_bytes))
