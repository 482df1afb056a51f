"""A deep MLP with dropout: the smallest model to try plan-checkpoints on.

    plan-checkpoints examples/mlp.py --budget 60%
"""

import torch
from torch import nn

WIDTH, DEPTH, BATCH = 512, 16, 512


def build_model() -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, WIDTH, generator=generator),)
