"""Allocation failures while profiling or measuring, said as what they are.

An allocation the device refuses (``torch.OutOfMemoryError`` on CUDA; on CPU a ``RuntimeError``
from ``DefaultCPUAllocator: can't allocate memory``, which an address-space limit such as
``ulimit -v`` or ``resource.setrlimit(RLIMIT_AS)`` produces) is the device's limit, not the model's
fault: it becomes :class:`OutOfMemory`, "out of memory on DEVICE: N bytes asked, M free".
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

CPU_MESSAGE = "DefaultCPUAllocator: can't allocate memory"
_CPU_ASKED = re.compile(r"you tried to allocate (\d+) bytes")
_SIZE = r"([\d.]+) (bytes|B|KiB|MiB|GiB|TiB)"  # c10's format_size
_CUDA_ASKED = re.compile(r"Tried to allocate " + _SIZE)
_CUDA_FREE = re.compile(r"of which " + _SIZE + " is free")
# Under torch.cuda.set_per_process_memory_fraction the message adds "N allowed;" (the allocator's
# share) and what the allocator holds: allocated, and reserved but unallocated.
_CUDA_ALLOWED = re.compile(_SIZE + " allowed;")
_CUDA_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + " is allocated by PyTorch")
_CUDA_CACHED = re.compile(_SIZE + " is reserved by PyTorch but unallocated")
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class OutOfMemory(RuntimeError):
    """The device refused an allocation while the planner profiled or measured the step.
    ``asked_bytes`` and ``free_bytes`` are None where they are not known."""

    def __init__(self, device: str, asked_bytes: int | None, free_bytes: int | None, during: str = "",
                 advice: str = ""):
        self.device, self.asked_bytes, self.free_bytes = device, asked_bytes, free_bytes
        asked = "? bytes" if asked_bytes is None else f"{asked_bytes} bytes"
        free = "? free" if free_bytes is None else f"{free_bytes} free"
        where = f" while {during}" if during else ""
        advice = advice or ("Planning holds at most the budget (or --device-memory / device_memory=, when lower) "
                            "plus the largest single op; give a lower budget, or free memory on the device")
        super().__init__(f"out of memory on {device}: {asked} asked, {free}{where}. {advice}")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def cpu_free_bytes() -> int | None:
    """Bytes this process may still allocate on CPU: below an address-space limit (RLIMIT_AS), the
    limit less the process's mapped size; else the system's available memory; None where neither
    can be read."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            return max(0, soft - _status_bytes("VmSize:"))
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, ImportError):
        return None
    return None


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no {field} in /proc/self/status")


def cuda_free_bytes(message: str) -> int | None:
    """The bytes a CUDA out-of-memory ``message`` says were free to this process: under a per-process
    fraction, its allowed share less what the caching allocator held (allocated and cached); else
    the device's free memory."""
    allowed, allocated, cached = (pattern.search(message) for pattern in (_CUDA_ALLOWED, _CUDA_ALLOCATED, _CUDA_CACHED))
    if allowed and allocated and cached:
        return max(0, _bytes(*allowed.groups()) - _bytes(*allocated.groups()) - _bytes(*cached.groups()))
    free = _CUDA_FREE.search(message)
    return _bytes(*free.groups()) if free else None


def out_of_memory(error: BaseException, during: str = "") -> OutOfMemory | None:
    """``error`` as an :class:`OutOfMemory` when it is the device refusing an allocation, else None."""
    import torch

    text = str(error)
    if isinstance(error, torch.OutOfMemoryError):
        asked = _CUDA_ASKED.search(text)
        return OutOfMemory("cuda", _bytes(*asked.groups()) if asked else None, cuda_free_bytes(text), during)
    if isinstance(error, RuntimeError) and CPU_MESSAGE in text:
        asked = _CPU_ASKED.search(text)
        return OutOfMemory("cpu", int(asked.group(1)) if asked else None, cpu_free_bytes(), during)
    return None


def raise_if_out_of_memory(error: BaseException, during: str = "") -> None:
    """Raise ``error`` as an :class:`OutOfMemory` (chained) when it is one."""
    found = out_of_memory(error, during)
    if found is not None:
        raise found from error


@contextlib.contextmanager
def reported_out_of_memory(during: str) -> Iterator[None]:
    """Turn an allocation failure inside the block into :class:`OutOfMemory`; anything else passes."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as error:
        raise_if_out_of_memory(error, during)
        raise
