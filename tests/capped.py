"""Run Python in a subprocess whose address space is capped: the CPU's stand-in for a smaller device.

The cap is measured from the subprocess's own baseline: after torch, transformers and the planner
are imported and a tiny GPT-2 has been planned once at 80% of its peak, so that it checkpoints
(torch's tracer imports much of itself lazily on first use, and so does the checkpoint clock's
calibration: code and thread stacks, not memory a device would hold; the GPT-2's rows are a chain,
planned without the exact search's MILP, so HiGHS and its worker thread are not warmed),
``RLIMIT_AS`` is set to the mapped size then
(``VmSize``) plus ``cap_bytes``. One thread; ``MALLOC_ARENA_MAX=2`` (each glibc arena reserves 64 MiB
of address space; ``malloc_arenas=1`` where the body's allocations must not be served by a second
arena reserved before the cap); ``MALLOC_MMAP_THRESHOLD_=131072``: glibc otherwise raises its mmap threshold as
large blocks are freed and then keeps freed blocks in its heap, which holds address space no
allocator counts (a bounded profile's process grew 220 MB for an 80 MB bound without it, 13 MB with
it: docs/profiler.md, "Planning what does not fit").

The script's last stdout line starting with ``RESULT `` is returned as parsed JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """
import json, resource, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
import planner
from models import gpt2, gpt2_inputs, hf_loss

def mapped_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

def cap(cap_bytes):
    \"\"\"Cap the address space at what is mapped now plus cap_bytes.\"\"\"
    limit = mapped_bytes() + cap_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return limit

def result(**figures):
    print("RESULT " + json.dumps(figures), flush=True)

_tiny = gpt2(layers=2, embd=32, heads=2, vocab=100, positions=16)
planner.plan(_tiny, gpt2_inputs(batch=8, tokens=16, vocab=100), "80%", loss_fn=hf_loss)
del _tiny
"""


def capped_env(malloc_arenas: int = 2) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MALLOC_ARENA_MAX=str(malloc_arenas), MALLOC_MMAP_THRESHOLD_="131072")
    return env


def run_capped(body: str, timeout: float = 900, malloc_arenas: int = 2) -> tuple[dict | None, subprocess.CompletedProcess]:
    """Run PRELUDE then ``body`` (which calls ``cap(bytes)`` where the cap starts) in a fresh
    interpreter; returns the RESULT figures (None without a RESULT line) and the process.
    ``malloc_arenas``: glibc's arenas at most (with 2, a second arena reserved before the cap, 64 MiB
    of address space, can serve the body's allocations when the cap refuses new mappings)."""
    script = PRELUDE.format(tests=str(ROOT / "tests")) + body
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=capped_env(malloc_arenas), cwd=str(ROOT))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[-1][len("RESULT "):]) if lines else None), done
