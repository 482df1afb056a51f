"""The benchmark models, sized so that activations, not parameters, dominate the step's peak and a
step takes about a second on a 2-core CPU.

Each entry builds (model, example inputs, loss_fn, baselines): the baselines it supports besides
"no checkpointing" and torch.compile, as functions that return a checkpointed version of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from examples import gpt2 as example_gpt2


@dataclass
class Benchmark:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], object]
    loss_fn: Callable
    # baseline name -> function(model) -> module to train (the same parameters)
    baselines: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)


def _hf_loss(output):
    return output.loss


def _hf_per_layer(model: nn.Module) -> nn.Module:
    """Hugging Face's own per-layer checkpointing (torch.utils.checkpoint, non-reentrant)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


# -- GPT-2 -------------------------------------------------------------------------------------------
def gpt2() -> nn.Module:
    """The bundled example's GPT-2 (examples/gpt2.py: 6 layers, width 256), over 256 tokens."""
    return example_gpt2.build_model(tokens=256)


def token_batch(batch: int = 4, tokens: int = 256, vocab: int = example_gpt2.VOCAB) -> dict:
    return example_gpt2.example_inputs(batch=batch, tokens=tokens, vocab=vocab)


# -- BERT --------------------------------------------------------------------------------------------
def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=6, hidden_size=256, num_attention_heads=8, intermediate_size=1024,
                        vocab_size=8192, max_position_embeddings=256)
    return BertForMaskedLM(config)


# -- residual MLP chain ----------------------------------------------------------------------------
class ResidualBlock(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def residual_mlp(width: int = 256, hidden: int = 1024, depth: int = 24) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[ResidualBlock(width, hidden) for _ in range(depth)], nn.LayerNorm(width), nn.Linear(width, 16))


def mlp_batch(batch: int = 1024, width: int = 256):
    return (torch.randn(batch, width, generator=torch.Generator().manual_seed(1)),)


def _checkpoint_sequential(model: nn.Sequential) -> nn.Module:
    """torch.utils.checkpoint.checkpoint_sequential with sqrt(N) segments (non-reentrant)."""
    segments = max(1, round(math.sqrt(len(model))))

    class Segmented(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint_sequential(self.inner, segments, x, use_reentrant=False)

    return Segmented(model)


# -- U-Net-like CNN ----------------------------------------------------------------------------------
def _conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Encoder-decoder with skip connections: the graph is not a chain."""

    def __init__(self, channels=(16, 32, 64, 128)):
        super().__init__()
        self.down = nn.ModuleList()
        cin = 3
        for c in channels:
            self.down.append(_conv(cin, c))
            cin = c
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        for c in reversed(channels[:-1]):
            self.up.append(nn.ConvTranspose2d(cin, c, 2, stride=2))
            self.merge.append(_conv(2 * c, c))
            cin = c
        self.head = nn.Conv2d(cin, 2, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x)
            if i < len(self.down) - 1:
                skips.append(x)
                x = torch.nn.functional.max_pool2d(x, 2)
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)


def unet() -> nn.Module:
    torch.manual_seed(0)
    return UNet()


def image_batch(batch: int = 8, size: int = 128):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def unet_channels_last() -> nn.Module:
    """The same U-Net in the channels-last layout, which inductor picks for convolutions on its own
    (torch.compile converts to it; the compiled plans keep the layout the model was profiled in)."""
    return unet().to(memory_format=torch.channels_last)


def image_batch_channels_last():
    return tuple(x.contiguous(memory_format=torch.channels_last) for x in image_batch())


def _segmentation_loss(output: torch.Tensor) -> torch.Tensor:
    target = torch.zeros(output.shape[0], output.shape[2], output.shape[3], dtype=torch.long)
    return torch.nn.functional.cross_entropy(output, target)


def _mean_square(output: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


BENCHMARKS = {
    "gpt2": Benchmark("gpt2", gpt2, token_batch, _hf_loss, {"hf-per-layer": _hf_per_layer}),
    "bert": Benchmark("bert", bert, token_batch, _hf_loss, {"hf-per-layer": _hf_per_layer}),
    "residual-mlp": Benchmark("residual-mlp", residual_mlp, mlp_batch, _mean_square,
                              {"checkpoint-sequential": _checkpoint_sequential}),
    "unet": Benchmark("unet", unet, image_batch, _segmentation_loss, {}),
    "unet-channels-last": Benchmark("unet-channels-last", unet_channels_last, image_batch_channels_last,
                                    _segmentation_loss, {}),
}
