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
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .rematerialize import output_storage_bytes

# Outputs smaller than this come from memory already mapped in any run (glibc's smallest mmap
# threshold, 128 KiB): nothing to touch first.
SMALLEST_MAPPED = 128 * 1024


def prefault_sizes(node: fx.Node) -> tuple[int, ...]:
    """The byte sizes of ``node``'s fresh output storages worth touching before it is timed (none
    for an op whose outputs alias its inputs)."""
    return tuple(size for size in output_storage_bytes(node) if size >= SMALLEST_MAPPED)


def touch_then_free(sizes: tuple[int, ...]) -> None:
    """Allocate blocks of ``sizes`` bytes on the CPU, write every page of each, and free them."""
    blocks = [torch.empty(size, dtype=torch.uint8) for size in sizes]
    for block in blocks:
        block.fill_(0)
    del blocks
