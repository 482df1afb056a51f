"""Gloo ranks for the distributed tests, and a rank's memory measured in spite of gloo's threads.

:func:`run_ranks` spawns ``world`` processes (torch.multiprocessing), joins them in one gloo process
group and runs ``work(rank, folder)`` on each; each rank's returned dict (JSON) comes back to the
caller, a rank's exception as its traceback in the test's failure.

:func:`allocated_bound` is :func:`profiler.allocations.allocated_while`, whose replay
(``replay_addressed``) counts only blocks allocated in the window, so that it is an upper bound
whatever thread freed what; :func:`least_bound` tightens it over repeats. The CPU memory profile records an allocator event on the thread that makes it, and only while that
thread is profiled: gloo runs a collective on a worker thread (profiled while the collective runs)
and, by our reading of the figures, the work object holding the collective's tensors is released by
whichever of that worker and the calling thread lets go last; when it is the worker, the tensors'
free goes unrecorded. Measured (2 gloo ranks, two busy processes on the 2 cores): of 40
DistributedDataParallel wrappings of the test model, most left the buckets' 202,512 B in the replay,
the others 202,536, 203,328 or 405,024 B: DDP's flat broadcast copy of the parameters (202,512 B) and
one of two 816 B tensors it allocates while wrapping, freed but unrecorded. That is the 1,077,688 B a CI run measured
against a 956,116 B budget (203,328 B over the 874,360 B measured locally). FSDP2's all-gather and
reduce-scatter buffers go the same way (13 and 11 of 20 steps on the two ranks, idle machine).

A missing free only ever makes the replay larger than what was allocated, never smaller (the
allocations are on the profiled threads). So each window is an upper bound of the truth, made
tighter by two facts: a block whose address the allocator hands out again must have been freed
before (its free is placed there), and the same deterministic work measured ``repeats`` times has
the same truth, so the least of the bounds is a bound too.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import traceback
from collections.abc import Callable

import pytest

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, work: Callable[[int, str], dict], folder: str, port: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = work(rank, folder)
    except Exception:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as file:
        json.dump(result, file)
    # Tear down together: a rank that destroyed its group while its peer's gloo connection was still
    # active aborted once in CI ("terminate called without an active exception", SIGABRT).
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(work: Callable[[int, str], dict], folder: str, world: int = WORLD) -> list[dict]:
    """``work(rank, folder)`` on ``world`` gloo ranks; the ranks' results, rank 0 first. ``work``
    must be a module-level function (the ranks are spawned and import it); ``folder`` is shared."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        pytest.skip("torch was built without torch.distributed")
    mp.spawn(_rank_main, args=(work, folder, free_port(), world), nprocs=world, join=True)
    results = []
    for rank in range(world):
        with open(os.path.join(folder, f"rank{rank}.json")) as file:
            results.append(json.load(file))
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
    return results


def allocated_bound(step: Callable[[], object]) -> tuple[int, int]:
    """(most bytes allocated at once on top of what was allocated when ``step`` began, bytes it left
    allocated), CPU, each an upper bound whatever thread freed what (module docstring)."""
    from profiler.allocations import allocated_while

    return allocated_while(step)


def least_bound(step: Callable[[], object], repeats: int = 3,
                between: Callable[[], object] | None = None) -> tuple[int, int]:
    """:func:`allocated_bound` of ``step`` run ``repeats`` times, the least peak and the least end:
    for work that allocates the same each time, both still bounds, and rarely inflated.
    ``between()`` runs before each, unmeasured (to free what the last one left)."""
    bounds = []
    for _ in range(repeats):
        if between is not None:
            between()
        bounds.append(allocated_bound(step))
    return min(b[0] for b in bounds), min(b[1] for b in bounds)


def rank_peak(build: Callable[[], object], forward_backward: Callable[[object], object], repeats: int = 5) -> int:
    """One rank's peak over a training step, in bytes, beyond what existed before (the batch, made
    by the caller, is not in it): what ``build()`` (the model, its plan, the wrapper) and two
    warm-up steps leave allocated (parameters or their shards, DDP's buckets, rebuilt at the second
    forward, FSDP2's lazily initialised state), plus the most one more ``forward_backward(module)``
    allocates on top. Each part is the least of ``repeats`` upper bounds (:func:`least_bound`); each
    step starts without gradients, as a plan's measurement does.

    Five, not three: a window's end takes every missed free of its collectives (a peak only those
    before it), and the build-and-warm window runs two steps' worth. Measured on the test model,
    12 steps per rank under per-block FSDP2: 2 and 2 peaks inflated, 3 and 9 ends clean; with
    three, fully_shard on the whole model once had all three build-and-warm windows 202,512 B high."""
    holder: dict = {}

    def step():
        forward_backward(holder["module"])

    def build_and_warm():
        holder["module"] = build()
        for _ in range(2):
            holder["module"].zero_grad(set_to_none=True)
            step()
        holder["module"].zero_grad(set_to_none=True)

    def drop():  # the last build's memory is freed unmeasured, cycles included
        holder.clear()
        gc.collect()

    _, held = least_bound(build_and_warm, repeats, between=drop)
    step_peak, _ = least_bound(step, repeats, between=lambda: holder["module"].zero_grad(set_to_none=True))
    return held + step_peak
