"""What recomputing the cross-entropy's log-probabilities from the logits buys (profiler/fusions.py).

    python benchmarks/log_probs.py [--models gpt2,bert] [--time-limit 30]

Per model, on the profile of the first trace (the backward holds the log-probabilities) and on the
second (it reads the logits, a model output, and recomputes them a chunk at a time):

- the least budget ``auto`` reaches on each (the step's bytes);
- the predicted step time of ``auto``'s plan on each at Hugging Face per-layer checkpointing's
  measured peak (where the planner keeps the first trace, because it fits);
- the plan ``planner.plan`` makes halfway between the two least budgets, which only the second
  trace meets: its predicted and measured peak.

Writes the table to docs/benchmarks/log-probs.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
import profiler  # noqa: E402
from models import BENCHMARKS  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.granularity import solve_over_groupings  # noqa: E402
from solvers import Infeasible  # noqa: E402

MiB = 2**20


def least_budget(profile, time_limit: float) -> int:
    try:
        solve_over_groupings(profile, 0, "auto", time_limit, finer=True)
    except Infeasible as error:
        return int(error.min_budget)
    raise AssertionError("a budget of 0 bytes was met")


def model_rows(name: str, time_limit: float) -> list[str]:
    bench = BENCHMARKS[name]
    torch.manual_seed(0)
    model = bench.build()
    model.train()
    inputs = bench.inputs()
    first = profiler.profile(model, inputs, loss_fn=bench.loss_fn)
    second = first.with_log_probs_recomputed()
    least_first, least_second = least_budget(first, time_limit), least_budget(second, time_limit)

    per_layer = bench.baselines["hf-per-layer"](bench.build())
    per_layer.train()
    hf_peak = profiler.measure_step(per_layer, inputs, loss_fn=bench.loss_fn, repeats=1).peak_bytes
    at_hf = [planner.plan(model, inputs, budget=hf_peak, time_limit=time_limit, profile=p) for p in (first, second)]

    between = (least_first + least_second) // 2
    plan = planner.plan(model, inputs, budget=between, time_limit=time_limit, profile=first)
    measured = profiler.measure_step(planner.apply(model, plan), inputs, loss_fn=bench.loss_fn, repeats=1).peak_bytes
    recomputed = bool(plan.graph.graph.get("log_probs_recomputed"))
    return [
        f"| {name} | least budget | {least_first / MiB:.1f} MiB | {least_second / MiB:.1f} MiB |",
        f"| {name} | predicted step at HF per-layer's peak ({hf_peak / MiB:.1f} MiB) "
        f"| {at_hf[0].predicted_seconds:.3f} s | {at_hf[1].predicted_seconds:.3f} s |",
        f"| {name} | plan at {between / MiB:.1f} MiB: predicted / measured peak "
        f"| infeasible | {plan.predicted_peak_bytes / MiB:.2f} / {measured / MiB:.2f} MiB"
        f"{'' if recomputed else ' (first trace!)'} |",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "benchmarks", "log-probs.md"))
    args = parser.parse_args(argv)
    lines = [
        "Recomputed log-probabilities (`python benchmarks/log_probs.py`, "
        f"time limit {args.time_limit:g} s, torch {torch.__version__}, {torch.get_num_threads()} threads).",
        "",
        "| model | figure | log-probabilities held | recomputed from the logits |",
        "|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in args.models.split(","):
        rows = model_rows(name, args.time_limit)
        print("\n".join(rows), flush=True)
        lines += rows
    write_atomic(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
