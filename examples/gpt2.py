"""A Hugging Face GPT-2 built from a config (nothing is downloaded), dropout on, loss from labels.

    pip install transformers
    plan-checkpoints examples/gpt2.py --budget 60%

The sizes are keyword arguments, so that a batch sweep can vary them (configs/gpt2-tiny.yaml):
``build_model(layers=..., width=..., heads=..., vocab=..., tokens=...)``,
``example_inputs(batch=..., tokens=..., vocab=...)``.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, TOKENS, LAYERS, WIDTH, HEADS, VOCAB = 4, 128, 6, 256, 8, 8192


def build_model(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, vocab: int = VOCAB,
                tokens: int = TOKENS) -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=tokens, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # set explicitly: otherwise transformers logs a notice on every call
    return model


def example_inputs(batch: int = BATCH, tokens: int = TOKENS, vocab: int = VOCAB):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, tokens), generator=generator)
    return {"input_ids": ids, "labels": ids}


def loss_fn(output) -> torch.Tensor:
    return output.loss
