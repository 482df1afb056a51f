"""What a tensor's storage costs on its device: the bytes its allocator hands out for it."""

from __future__ import annotations

import torch

# Memory the CUDA caching allocator hands out comes in blocks of this many bytes.
CUDA_BLOCK_BYTES = 512


def allocated_bytes(nbytes: int, device: torch.device) -> int:
    """Bytes the allocator of ``device`` hands out for a storage of ``nbytes`` bytes."""
    if device.type == "cuda":
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes the allocator hands out for a tensor's storage on its device."""
    return allocated_bytes(tensor.untyped_storage().nbytes(), tensor.device)
