"""Time a CPU op on memory the process has already touched, as a bounded and a whole run alike.

A fresh allocation's first write makes the kernel map and zero its pages (minor page faults), and the
CPU-time clock an op is timed by (profiler/measure.py) counts that kernel time. Whether an op's
output lands on such pages depends on the allocator's state, not on the op: glibc serves a block
above its mmap threshold (dynamic, at most 32 MiB) from new pages every time, and a smaller one
from its heap, where a block freed just before is reused untouched by the kernel. A memory-bounded
run (profiler/rematerialize.py) frees evicted values right before an op allocates; the whole step's
run holds them. Measured interleaved in one process at one thread on the benchmark GPT-2 (6 layers,
width 256, 4 x 256 tokens), before this: the bounded run's op times summed 7% under the whole
run's, its loss ops (logits-sized outputs) 70-91% under, its matmuls 5% under. With an
``MALLOC_MMAP_THRESHOLD_`` that maps every large block afresh both sums rose by 60% and agreed.

So before a timed call, the op's output storages (their sizes exact from the trace) are allocated,
written and freed: the allocator hands the same memory to the op, already mapped, wherever it
would have come from the heap, in either kind of run; a block above the threshold is mapped anew
for the op in either kind of run alike.

Not quite alike: glibc maps a block afresh only when no free chunk of its heap can hold it. A whole
step's run fills the heap with its activations, so an output of 32 MiB or more (above any threshold
glibc sets itself) lands on fresh pages; a bounded run frees evicted values beside each other, whose
chunks merge into free space that large, already touched. Measured on the benchmark Llama (6 layers,
width 256, vocabulary 8192, 4 x 256 tokens: logits-sized outputs of exactly 32 MiB), bounded at a
tenth of its peak, one thread, least of two rounds each: ``_log_softmax`` 13.75 ms in the whole run
against 4.13 ms bounded, its backward 15.14 against 3.43, ``nll_loss_backward`` 10.19 against 0.76;
those ops alone 33.6 ms of the bounded op times' 23.2 ms (3.9%) under the whole run's 594.3 ms (the
others 10 ms over). So before an op with such an output, the heap's free pages are handed back to
the kernel (``malloc_trim(0)``, glibc): the output lands on fresh pages in either kind of run, as
in the whole step.

That is the step of a process whose malloc maps such blocks (glibc's default). One whose malloc
keeps what it frees (``mallopt(M_MMAP_MAX, 0)`` and a trim threshold above the block, or
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...``: benchmarks/paired_steps.py's
``keep_freed_memory``) serves the block from its heap, on pages its earlier steps touched, in every
step after the first: there the large output is touched first like any other
(:func:`large_blocks_land_fresh`, probed at each timed run). Releasing the pages in such a process
had timed the benchmark Llama's logits-sized ops with the kernel's faults its steps never take:
the profile's step summed 599 ms against 541 ms without (one thread, CPU time), 10% that every
plan's predicted overhead was divided by (docs/benchmarks/clock-cold-caches.md, its third run).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch
import torch.fx as fx

from .rematerialize import output_storage_bytes

# Outputs smaller than this come from memory already mapped in any run (glibc's smallest mmap
# threshold, 128 KiB): nothing to touch first.
SMALLEST_MAPPED = 128 * 1024
# glibc's dynamic mmap threshold never rises above this (DEFAULT_MMAP_THRESHOLD_MAX on 64 bits): an
# output this large is mapped afresh wherever the heap holds no free chunk as large (the docstring).
ALWAYS_MAPPED = 32 * 2**20


def prefault_sizes(node: fx.Node) -> tuple[int, ...]:
    """The byte sizes of ``node``'s fresh output storages worth touching before it is timed (none
    for an op whose outputs alias its inputs)."""
    return tuple(size for size in output_storage_bytes(node) if size >= SMALLEST_MAPPED)


def prepare_outputs(sizes: tuple[int, ...], large_fresh: bool = True) -> None:
    """Before a timed op with output storages of ``sizes`` bytes (:func:`prefault_sizes`): those
    the heap serves touched (:func:`touch_then_free`); with ``large_fresh`` (the process's malloc
    maps large blocks afresh: :func:`large_blocks_land_fresh`), for one of :data:`ALWAYS_MAPPED` or
    more, the heap's free pages released first, so that it lands on fresh pages (the module
    docstring); without, every output touched first."""
    if not large_fresh:
        touch_then_free(sizes)
        return
    heap = tuple(size for size in sizes if size < ALWAYS_MAPPED)
    if len(heap) < len(sizes):
        release_free_heap_pages()
    touch_then_free(heap)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded for this module alone (its functions' argument types are set here),
    or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    return getattr(_libc(), "malloc_trim", None)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33 and later): sizes in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def large_blocks_land_fresh() -> bool:
    """Whether a block of :data:`ALWAYS_MAPPED` bytes lands on fresh pages in this process now: glibc
    maps it (``mmap``, its default) or, served from the heap, gives its pages back to the kernel
    when it is freed (trimming). False where malloc serves it from the heap and keeps it when freed
    (the module docstring). One untouched block allocated and freed, its effect read from
    ``mallinfo2``; True where the C library has none (not glibc, or glibc before 2.33: the default
    assumed)."""
    libc = _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return True
    mallinfo2.restype = _MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    before = mallinfo2()
    block = libc.malloc(ALWAYS_MAPPED)
    if not block:
        return True
    during = mallinfo2()
    libc.free(block)
    after = mallinfo2()
    mapped = during.hblkhd > before.hblkhd
    trimmed = after.arena < during.arena
    return mapped or trimmed


def release_free_heap_pages() -> None:
    """Hand the C heap's free pages back to the kernel (``malloc_trim(0)``); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def touch_then_free(sizes: tuple[int, ...]) -> None:
    """Allocate blocks of ``sizes`` bytes on the CPU, write every page of each, and free them."""
    blocks = [torch.empty(size, dtype=torch.uint8) for size in sizes]
    for block in blocks:
        block.fill_(0)
    del blocks
