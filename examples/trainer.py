"""Train a Hugging Face model with the Trainer under a memory budget: one call before training.

    python examples/trainer.py --budget 60% [--steps 20] [--out runs/trainer]

``planner.checkpoint(model, batch, budget=...)`` is the byte-budgeted counterpart of
``model.gradient_checkpointing_enable()``: it checkpoints, in place, the modules whose
recomputation buys the memory the budget needs at the least time, and returns the same model.
Plan with the largest batch you will train on; smaller ones (the last batch) run too.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import planner  # noqa: E402


class RandomTokens(Dataset):
    """Random token sequences, labels equal to inputs (a causal language-modelling set-up)."""

    def __init__(self, rows: int, tokens: int, vocab: int, seed: int):
        self.ids = torch.randint(0, vocab, (rows, tokens), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main(argv=None) -> int:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="60%")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", default=os.path.join("runs", "trainer"))
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    vocab = 2048
    config = GPT2Config(n_layer=args.layers, n_embd=128, n_head=4, vocab_size=vocab, n_positions=args.tokens,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    train, evaluation = RandomTokens(args.batch * 5 + 1, args.tokens, vocab, 0), RandomTokens(8, args.tokens, vocab, 1)

    batch = {key: torch.stack([train[i][key] for i in range(args.batch)]) for key in ("input_ids", "labels")}
    model = planner.checkpoint(model, batch, budget=args.budget, loss_fn=lambda output: output.loss)
    from runtime.native import native_regions

    print(f"checkpointed: {', '.join(native_regions(model)) or 'nothing'}")

    arguments = TrainingArguments(output_dir=args.out, per_device_train_batch_size=args.batch, max_steps=args.steps,
                                  report_to=[], use_cpu=not torch.cuda.is_available(), logging_steps=max(1, args.steps // 4),
                                  save_strategy="no")
    trainer = Trainer(model=model, args=arguments, train_dataset=train, eval_dataset=evaluation)
    trainer.train()
    print(f"eval_loss {trainer.evaluate()['eval_loss']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
