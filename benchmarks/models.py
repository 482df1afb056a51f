"""The benchmark models, sized so that activations, not parameters, dominate the step's peak and a
step takes about a second on a 2-core CPU.

Each entry builds (model, example inputs, loss_fn, baselines): the baselines it supports besides
"no checkpointing" and torch.compile, as functions that return a checkpointed version of the model.
"sac" is selective activation checkpointing with the policy of PyTorch's docs (save the outputs of
the matmuls, attention and convolutions, recompute the rest) on every layer or block.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, checkpoint_sequential,
                                    create_selective_checkpoint_contexts)

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


# -- selective activation checkpointing (SAC) with the usual policy ---------------------------------
_aten = torch.ops.aten
# The compute-intensive ops whose outputs PyTorch's SAC examples save; everything else is recomputed.
SAC_SAVE = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.convolution.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default, _aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _sac_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVE else CheckpointPolicy.PREFER_RECOMPUTE


sac_context = functools.partial(create_selective_checkpoint_contexts, _sac_policy)


def _hf_sac(model: nn.Module) -> nn.Module:
    """Hugging Face's per-layer checkpointing with the SAC policy (non-reentrant, context_fn)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                       "context_fn": sac_context})
    return model


class Checkpointed(nn.Module):
    """One block run under torch.utils.checkpoint (non-reentrant), with ``context_fn`` if given."""

    def __init__(self, inner: nn.Module, context_fn=None):
        super().__init__()
        self.inner = inner
        self.kwargs = {"context_fn": context_fn} if context_fn is not None else {}

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False, **self.kwargs)


def _sac_sequential_blocks(model: nn.Sequential) -> nn.Module:
    """SAC on each residual block of the residual MLP (the final norm and head stay as they are)."""
    for i, block in enumerate(model):
        if isinstance(block, ResidualBlock):
            model[i] = Checkpointed(block, sac_context)
    return model


def _unet_blocks(model: nn.Module, context_fn=None) -> nn.Module:
    """Each encoder block (model.down) and decoder block (model.merge, after its skip's concatenation)
    checkpointed; the up-convolutions, pooling and head stay as they are."""
    for blocks in (model.down, model.merge):
        for i, block in enumerate(blocks):
            blocks[i] = Checkpointed(block, context_fn)
    return model


def _unet_per_block(model: nn.Module) -> nn.Module:
    """checkpoint_sequential's kind of checkpointing for the U-Net, which is not a sequence: every
    encoder and decoder block in a region of its own (torch.utils.checkpoint, non-reentrant)."""
    return _unet_blocks(model)


def _unet_sac(model: nn.Module) -> nn.Module:
    return _unet_blocks(model, sac_context)


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


# -- Llama -------------------------------------------------------------------------------------------
def llama() -> nn.Module:
    """transformers' LlamaForCausalLM from a small config (6 layers, width 256, 8 heads, SwiGLU 688),
    attention dropout on, over token_batch's 4 x 256 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=6, hidden_size=256, num_attention_heads=8, num_key_value_heads=8,
                         intermediate_size=688, vocab_size=8192, max_position_embeddings=256,
                         attention_dropout=0.1, use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"  # as examples/gpt2.py: no notice on every call
    return model


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


_HF_BASELINES = {"hf-per-layer": _hf_per_layer, "sac": _hf_sac}
_UNET_BASELINES = {"per-block": _unet_per_block, "sac": _unet_sac}

BENCHMARKS = {
    "gpt2": Benchmark("gpt2", gpt2, token_batch, _hf_loss, dict(_HF_BASELINES)),
    "bert": Benchmark("bert", bert, token_batch, _hf_loss, dict(_HF_BASELINES)),
    "llama": Benchmark("llama", llama, token_batch, _hf_loss, dict(_HF_BASELINES)),
    "residual-mlp": Benchmark("residual-mlp", residual_mlp, mlp_batch, _mean_square,
                              {"checkpoint-sequential": _checkpoint_sequential, "sac": _sac_sequential_blocks}),
    "unet": Benchmark("unet", unet, image_batch, _segmentation_loss, dict(_UNET_BASELINES)),
    "unet-channels-last": Benchmark("unet-channels-last", unet_channels_last, image_batch_channels_last,
                                    _segmentation_loss, dict(_UNET_BASELINES)),
}
