"""The CPU allocator's events, as ``torch.profiler.profile(profile_memory=True)`` records them,
replayed in order: what was live at the peak and at the end (bytes). On CUDA the allocator's own
statistics say the same (:func:`allocated_while`)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Send the process's native stderr (fd 2) to /dev/null: starting and stopping the profiler
    makes this torch build print trace lines ("USDT: ... profiler_start") that a user of the
    command line must not see. Python's own ``sys.stderr`` is flushed first and restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def cpu_memory_profile() -> Iterator:
    """``torch.profiler.profile(profile_memory=True)`` on CPU, started and stopped with the native
    stderr silenced (:func:`quiet_native_stderr`), and stopped whatever happens inside: a profiler
    left enabled by an exception made the process crash at exit (rc 139), even when the caller had
    caught the error. Yields the profiler, whose events are read after the block."""
    import torch

    recorder = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with quiet_native_stderr():
        recorder.__enter__()
    try:
        yield recorder
    finally:
        with quiet_native_stderr():
            recorder.__exit__(None, None, None)


def cpu_allocations(roots: Iterable) -> list[tuple[int, int]]:
    """(start time in ns, bytes; negative for a release) of every CPU allocation event under
    ``roots`` (profiler events, with their descendants), in time order."""
    from torch._C._profiler import _EventType

    found = []
    pending = list(roots)
    while pending:
        event = pending.pop()
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
            found.append((event.start_time_ns, event.typed[1].alloc_size))
        pending.extend(event.children)
    return sorted(found, key=lambda item: item[0])


def replay(allocations: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(most bytes live at once, bytes live at the end) over ``allocations`` in order, from zero."""
    live = peak = 0
    for _, size in allocations:
        live += size
        peak = max(peak, live)
    return peak, live


def allocated_while(step: Callable[[], object], cuda_device: int | None = None) -> tuple[int, int]:
    """(most bytes allocated at once on top of what was allocated when ``step`` began, bytes it left
    allocated): on CPU (``cuda_device`` None) from the allocator's events, else from the CUDA
    caching allocator's statistics of that device."""
    import torch

    if cuda_device is not None:
        torch.cuda.synchronize(cuda_device)
        torch.cuda.reset_peak_memory_stats(cuda_device)
        before = torch.cuda.memory_allocated(cuda_device)
        step()
        torch.cuda.synchronize(cuda_device)
        return (torch.cuda.max_memory_allocated(cuda_device) - before,
                torch.cuda.memory_allocated(cuda_device) - before)
    with cpu_memory_profile() as recorder:
        step()
    return replay_addressed(cpu_allocation_events(recorder.profiler.kineto_results.experimental_event_tree()))


def cpu_allocation_events(roots: Iterable) -> list[tuple[int, int, int]]:
    """(start time in ns, bytes, address; bytes negative for a release) of every CPU allocation
    event under ``roots``, in time order."""
    from torch._C._profiler import _EventType

    found, pending = [], list(roots)
    while pending:
        event = pending.pop()
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
            fields = event.typed[1]
            found.append((event.start_time_ns, fields.alloc_size, fields.ptr))
        pending.extend(event.children)
    return sorted(found, key=lambda item: item[0])


def replay_addressed(events: Iterable[tuple[int, int, int]]) -> tuple[int, int]:
    """(most bytes live at once, bytes live at the end) over ``events`` (time, bytes, address) in
    order, from zero, counting only blocks allocated in the window: an upper bound of what the step
    allocated, whatever thread freed what.

    Why not :func:`replay` of every event: the profiler records frees only on the threads it
    watches, and sizes a free from a process-wide table of the blocks it saw allocated. A block freed
    by another thread (gloo's worker, after a collective) stays in that table, and a later block at
    the same address, freed in a window, is recorded at the stale size: a native plan's step measured
    in a rank after FSDP2 steps read 202,512 B (the model's flat all-gather) below the same step in a
    fresh process. So a free counts only for a block allocated in the window, and a block allocated
    at an address still live in the replay frees the block recorded there first (the allocator cannot
    hand out a live address: its free happened, unrecorded). A step that frees a tensor made before
    it (none of the measured training steps does: gradients are dropped before the window) is then
    over-counted, never under."""
    live: dict[int, int] = {}
    total = peak = 0
    for _, size, address in events:
        if size > 0:
            total -= live.pop(address, 0)
            live[address] = size
            total += size
        elif address in live:
            total -= live.pop(address)
        peak = max(peak, total)
    return peak, total
