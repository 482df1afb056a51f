"""Small real models for the profiler, runtime and end-to-end tests."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 64, depth: int = 6, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(width, 4))


class TwoBranches(nn.Module):
    """Two independent dropout branches: a schedule may run either first."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.left = nn.Sequential(nn.Linear(width, width), nn.Dropout(0.5))
        self.right = nn.Sequential(nn.Linear(width, width), nn.Dropout(0.5))

    def forward(self, x):
        return self.left(x) * self.right(x)


class ResidualBlock(nn.Module):
    """x + dropout(down(gelu(up(norm(x))))): at module depth 1 a block is one node whose result is
    everything it saves for its backward; at depth 2 its output alone can be a checkpoint."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def residual_mlp(width: int = 32, hidden: int = 128, depth: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[ResidualBlock(width, hidden) for _ in range(depth)], nn.Linear(width, 4))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),
    )


def gpt2(layers: int = 4, embd: int = 128, heads: int = 4, vocab: int = 1000, positions: int = 128, dropout: float = 0.1):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_embd=embd, n_head=heads, vocab_size=vocab, n_positions=positions, use_cache=False,
        bos_token_id=0, eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def gpt2_inputs(batch: int = 4, tokens: int = 128, vocab: int = 1000) -> dict:
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def hf_loss(output):
    return output.loss


def training_step(model: nn.Module, inputs, loss_fn=None, seed: int = 1234):
    """One step from a fixed seed: (loss, {name: grad}, RNG state after the step)."""
    torch.manual_seed(seed)
    for p in model.parameters():
        p.grad = None
    output = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    loss = loss_fn(output) if loss_fn else output.float().sum()
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, torch.get_rng_state()


def max_relative_error(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    worst = 0.0
    for name in a:
        scale = a[name].abs().max().item() or 1.0
        worst = max(worst, (a[name] - b[name]).abs().max().item() / scale)
    return worst
