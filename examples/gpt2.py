"""A Hugging Face GPT-2 built from a config (nothing is downloaded), dropout on, loss from labels.

    pip install transformers
    plan-checkpoints examples/gpt2.py --budget 60%
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, TOKENS = 4, 128


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=6, n_embd=256, n_head=8, vocab_size=8192, n_positions=TOKENS, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # set explicitly: otherwise transformers logs a notice on every call
    return model


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 8192, (BATCH, TOKENS), generator=generator)
    return {"input_ids": ids, "labels": ids}


def loss_fn(output) -> torch.Tensor:
    return output.loss
