"""Measured overhead of native plans: CPU time of a training step with a plan applied over the
eager step's, eager and every plan stepped in turn in each round (paired, interleaved).

CPU time of the stepping thread (``time.thread_time``: user and kernel) on one torch thread: on a
machine shared with other jobs, the wall clock counts their time too; a step's own CPU time is what
the plan changes.

With glibc's default malloc the CPU step also counts the kernel's page faults of memory the
allocator gave back to the system and takes again: large blocks are mmap'ed and unmapped on free,
and the heap is trimmed above 128 KiB free. A step whose peak exceeds what the previous step left
mapped faults its pages in anew, one that stays below does not. Measured on benchmarks/models.py's
GPT-2 (2026-11-28, load 2): the eager step took 43k minor faults and 0.08 s of kernel time a step
(10% of it), its checkpointed steps none, so their CPU-time ratios came out 10-13 points below the
plans' predicted overheads while their user-time ratios matched them within 1 point. That is
the allocator's work, not the plan's (CUDA's caching allocator keeps its blocks), and the planner
does not price it (docs/benchmarks/clock.md):
:func:`keep_freed_memory` makes malloc keep what it frees, so that after the untimed round every
configuration steps on memory already mapped.
Used by benchmarks/clock.py and benchmarks/native_exact.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time

from profiler.inputs import normalise_inputs
from runtime.native import apply_native, remove_native


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory it frees in this process (no mmap'ed blocks, no heap
    trimming), so that a step does not page-fault in again what the step before gave back (module
    docstring). Returns whether it applied (False off glibc: nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def cpu_step(model, args, kwargs, loss_fn) -> float:
    """CPU seconds of the calling thread for one training step (gradients dropped first)."""
    for parameter in model.parameters():
        parameter.grad = None
    started = time.thread_time()
    loss_fn(model(*args, **kwargs)).backward()
    return time.thread_time() - started


def measured_overheads(model, inputs, loss_fn, configurations: list[tuple[str, ...]], rounds: int) -> dict:
    """Each configuration's (a tuple of native regions) step over eager's, per round (eager and the
    configurations stepped in turn in every round, after one untimed round; malloc keeping what it
    frees, :func:`keep_freed_memory`): configuration -> list of ratios."""
    keep_freed_memory()
    args, kwargs = normalise_inputs(inputs)
    ratios: dict[tuple[str, ...], list[float]] = {c: [] for c in configurations}
    for round_number in range(rounds + 1):
        eager = cpu_step(model, args, kwargs, loss_fn)
        for regions in configurations:
            apply_native(model, regions)
            try:
                seconds = cpu_step(model, args, kwargs, loss_fn)
            finally:
                remove_native(model)
            if round_number:
                ratios[regions].append(seconds / eager)
    for parameter in model.parameters():
        parameter.grad = None
    return ratios


def quartiles(values: list[float]) -> tuple[float, float]:
    """(first, third) quartile of ``values`` (the value itself when there is one)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def overhead_text(ratios: list[float]) -> str:
    """``"+12.3% (+10.1% to +14.0%)"``: the median ratio minus one, its quartiles in brackets."""
    low, high = quartiles(ratios)
    return f"{statistics.median(ratios) - 1:+.1%} ({low - 1:+.1%} to {high - 1:+.1%})"
