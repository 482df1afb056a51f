"""The host's caches emptied, as a training step empties them between a region's forward and its
recomputation.

In a step, the rest of the model runs between a checkpointed region's forward and its recomputation
in the backward: by then the checkpoint's own Python objects (its frame, holders, hooks, the saved
generator state) and the region's inputs have left the CPU's caches. Measured on the synthetic
region of profiler/checkpoint_cost.py (one CPU thread, an AMD EPYC with a 32 MiB L3): a checkpoint's
own cost per call was 88 us stepped back to back and 390-440 us with 64 MiB written between its
forward and its backward (running 50 unrelated small ops there instead added 15 us); in the
benchmark Llama, 13 RMSNorm regions cost 0.77 ms each in the step and 0.37 ms each stepped alone.
:class:`CacheEvictor` writes a buffer larger than the last-level cache, so that a measurement can
be made from cold caches.
"""

from __future__ import annotations

import glob

import torch

FALLBACK_CACHE_BYTES = 32 * 2**20  # where the system does not say (not Linux): a server L3's size
EVICTION_FACTOR = 1.5  # the buffer written is this many times the largest cache
MOST_EVICTION_BYTES = 256 * 2**20


def last_level_cache_bytes() -> int:
    """Bytes of the first CPU's largest cache (Linux's sysfs), :data:`FALLBACK_CACHE_BYTES` where
    it cannot be read."""
    largest = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as file:
                text = file.read().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "")
        if number.isdigit():
            largest = max(largest, int(number) * units.get(unit, 1))
    return largest or FALLBACK_CACHE_BYTES


class CacheEvictor:
    """A host buffer :data:`EVICTION_FACTOR` times the last-level cache (at most
    :data:`MOST_EVICTION_BYTES`); :meth:`evict` writes all of it."""

    def __init__(self, nbytes: int | None = None):
        if nbytes is None:
            nbytes = min(int(EVICTION_FACTOR * last_level_cache_bytes()), MOST_EVICTION_BYTES)
        self.buffer = torch.empty(nbytes // 4, dtype=torch.float32)

    def evict(self) -> None:
        self.buffer.fill_(1.0)


def cache_evictor() -> CacheEvictor | None:
    """A :class:`CacheEvictor`, or None where its buffer cannot be had (a process capped below it)."""
    try:
        return CacheEvictor()
    except (RuntimeError, MemoryError):
        return None


__all__ = ["CacheEvictor", "cache_evictor", "last_level_cache_bytes"]
