"""The whole training iteration in the budget (docs/native.md, "The whole iteration").

A nanoGPT-like loop: Hugging Face GPT-2 (tied embeddings, dropout on), AdamW with nanoGPT's
weight-decay groups (or SGD with momentum), zero_grad(set_to_none=True), several iterations. For each
optimizer and budget: the native plan made with ``optimizer=`` (predicted iteration peak, the
optimizer's state and step peak) against the loop's peak from the CPU allocator's events with the
plan applied, and the un-checkpointed loop's; then the plan made without ``optimizer=`` at the same
budget, run in the same loop (what the budget meant before).

    python benchmarks/optimizer_iteration.py [--layers 4 --width 128 --vocab 4096 --batch 8 --tokens 128]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

import planner  # noqa: E402
from iterations import iteration_peak, nanogpt_adamw, sgd_momentum  # noqa: E402
from models import gpt2, hf_loss  # noqa: E402

OPTIMIZERS = {
    "AdamW (nanoGPT groups, for-loop)": nanogpt_adamw,
    "AdamW (nanoGPT groups, foreach)": lambda model: nanogpt_adamw(model, foreach=True),
    "SGD momentum 0.9": sgd_momentum,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--budgets", default="60%,80%")
    args = parser.parse_args()

    def build():
        model = gpt2(layers=args.layers, embd=args.width, heads=4, vocab=args.vocab, positions=args.tokens)
        model.train()
        return model

    def batch(i: int) -> dict:
        ids = torch.randint(0, args.vocab, (args.batch, args.tokens), generator=torch.Generator().manual_seed(i + 1))
        return {"input_ids": ids, "labels": ids}

    model = build()
    profile = planner.profile_for(model, batch(0), loss_fn=hf_loss)
    print(f"GPT-2 {args.layers} layers, width {args.width}, vocab {args.vocab}, {args.batch} x {args.tokens} tokens; "
          f"{args.iterations} iterations; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| optimizer | budget | state | step peak | budget bytes | predicted | measured | pred/meas | "
          "of unplanned iteration | step-only plan, measured in the loop |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, make in OPTIMIZERS.items():
        plain = build()
        unplanned = iteration_peak(plain, make(plain), batch, args.iterations)
        for budget in args.budgets.split(","):
            plan = planner.plan(model, batch(0), budget, loss_fn=hf_loss, profile=profile, optimizer=make(model))
            trained = planner.apply(build(), plan)
            measured = iteration_peak(trained, make(trained), batch, args.iterations)
            step_only = planner.plan(model, batch(0), budget, loss_fn=hf_loss, profile=profile)
            trained = planner.apply(build(), step_only)
            before = iteration_peak(trained, make(trained), batch, args.iterations)
            print(f"| {name} | {budget} | {plan.optimizer_state_bytes:,} | {plan.optimizer_step_peak_bytes:,} | "
                  f"{plan.budget_bytes:,} | {plan.predicted_peak_bytes:,} | {measured:,} | "
                  f"{plan.predicted_peak_bytes / measured - 1:+.2%} | {measured / unplanned:.1%} of {unplanned:,} | "
                  f"{before:,} ({before / unplanned:.1%}{', over' if before > plan.budget_bytes else ''}) |")


if __name__ == "__main__":
    main()
