"""Training iterations as users loop them, measured: a nanoGPT-like loop (AdamW with weight-decay
groups, zero_grad(set_to_none=True)) and its peak from the allocator's events (tests/test_optimizer.py,
benchmarks/optimizer_iteration.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from profiler.allocations import allocated_while
from profiler.memory import resident_bytes


def nanogpt_adamw(model: torch.nn.Module, **options) -> torch.optim.AdamW:
    """nanoGPT's configure_optimizers: weight decay on the matrices (a tied embedding among them),
    none on biases and norms; ``options`` such as ``foreach=True`` or ``fused=True``."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=6e-4, betas=(0.9, 0.95), **options)


def sgd_momentum(model: torch.nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> float:
    """One iteration of a nanoGPT-like loop over a Hugging Face causal LM: its output and loss held
    until the step returns, the gradients dropped after it."""
    out = model(**batch)
    loss = out.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def iteration_peak(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Callable[[int], dict],
                   iterations: int = 3) -> int:
    """The most bytes live over ``iterations`` training iterations (``batches(i)`` the i-th batch,
    made when its iteration starts, as a data loader gives it), from the allocator's events, the
    model's resident parameters and buffers included. A fresh optimizer creates its state in the
    first."""
    resident = resident_bytes(model)

    def loop():
        for i in range(iterations):
            train_step(model, optimizer, batches(i))

    peak, _ = allocated_while(loop)
    return resident + peak
