"""A small CNN with BatchNorm and a classification loss.

    plan-checkpoints examples/cnn.py --budget 50%
"""

import torch
from torch import nn
from torch.nn import functional as F

BATCH, SIZE, CLASSES = 16, 64, 10


def _block(channels_in: int, channels_out: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        _block(3, 32, 1), _block(32, 32, 1), _block(32, 64, 2), _block(64, 64, 1),
        _block(64, 128, 2), _block(128, 128, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, CLASSES),
    )


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 3, SIZE, SIZE, generator=generator),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    # Labels made to the output's batch and device: any batch size (--max-batch), CPU or CUDA.
    labels = torch.arange(output.shape[0], device=output.device) % CLASSES
    return F.cross_entropy(output, labels)
