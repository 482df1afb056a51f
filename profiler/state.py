"""Leave the model and the random number generators as they were while we trace and measure."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Iterator

import torch


@dataclass(frozen=True)
class RngState:
    """The global generators' states: CPU, and each CUDA device in use."""

    cpu: torch.Tensor
    cuda: tuple[tuple[int, torch.Tensor], ...] = ()


def cuda_devices(tensors) -> list[int]:
    return sorted({t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda"})


def get_rng_state(devices: list[int] = ()) -> RngState:
    cuda = tuple((d, torch.cuda.get_rng_state(d)) for d in devices)
    return RngState(torch.get_rng_state(), cuda)


def rng_state_bytes(devices: list[int] = ()) -> int:
    """Bytes of one :class:`RngState` for ``devices``: the CPU generator's (5056 on CPU: a Mersenne
    Twister) plus each CUDA device's."""
    state = get_rng_state(devices)
    return state.cpu.nbytes + sum(value.nbytes for _, value in state.cuda)


def set_rng_state(state: RngState) -> None:
    torch.set_rng_state(state.cpu)
    for device, value in state.cuda:
        torch.cuda.set_rng_state(value, device)


@contextlib.contextmanager
def preserved_state(model: torch.nn.Module, devices: list[int] = ()) -> Iterator[None]:
    """Restore the RNG states and every buffer's value (BatchNorm statistics...) on exit."""
    rng = get_rng_state(devices)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        set_rng_state(rng)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
