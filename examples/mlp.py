"""A deep MLP with dropout: the smallest model to try plan-checkpoints on.

    plan-checkpoints examples/mlp.py --budget 60%

The sizes are keyword arguments, so that a batch sweep can vary them (configs/mlp-sweep.yaml):
``build_model(width=..., depth=...)``, ``example_inputs(batch=..., width=...)``.
"""

import torch
from torch import nn

WIDTH, DEPTH, BATCH = 512, 16, 512


def build_model(width: int = WIDTH, depth: int = DEPTH) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def example_inputs(batch: int = BATCH, width: int = WIDTH):
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(batch, width, generator=generator),)
