"""What recomputing the cross-entropy's log-probabilities from the logits buys (profiler/fusions.py).

    python benchmarks/log_probs.py [--models gpt2,bert] [--time-limit 30]

Per model, on the profile of the first trace (the backward holds the log-probabilities) and on the
second (it reads the logits, a model output, and recomputes them a chunk at a time):

- the least budget ``auto`` reaches on each (the step's bytes);
- the predicted step time of ``auto``'s plan on each at Hugging Face per-layer checkpointing's
  measured peak (where the planner keeps the first trace, because it fits);
- the plan ``planner.plan`` makes halfway between the two least budgets, which only the second
  trace meets: its predicted and measured peak.

First, the ops alone: the cross-entropy backward as autograd runs it, fused, fused recomputing the
log-probabilities, and one log-softmax, on 1024 x 8192 logits (best of 7). Writes the table to
docs/benchmarks/log-probs.md.
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


def op_times(rows: int = 1024, classes: int = 8192, repeats: int = 7) -> list[str]:
    """Best-of-``repeats`` seconds of the cross-entropy backward as autograd runs it (two ops), as
    the fused op, as the fused op recomputing the log-probabilities, and of one log-softmax."""
    import time

    from profiler.fusions import cross_entropy_backward, cross_entropy_backward_from_logits

    aten = torch.ops.aten
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, classes, generator=generator)
    log_probs = torch.log_softmax(logits, 1)
    target = torch.randint(0, classes, (rows,), generator=generator)
    args = (torch.tensor(1.0), target, None, 1, -100, torch.tensor(float(rows)))

    def two_ops():
        dense = aten.nll_loss_backward(args[0], log_probs, *args[1:])
        return aten._log_softmax_backward_data(dense, log_probs, 1, log_probs.dtype)

    def best(run) -> float:
        run()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times)

    figures = {
        "nll_loss_backward + _log_softmax_backward_data": best(two_ops),
        "cross_entropy_backward (fused)": best(lambda: cross_entropy_backward(args[0], log_probs, *args[1:])),
        "cross_entropy_backward_from_logits": best(lambda: cross_entropy_backward_from_logits(args[0], logits,
                                                                                              *args[1:])),
        "one log_softmax": best(lambda: torch.log_softmax(logits, 1)),
    }
    return [
        f"The ops alone, on {rows} x {classes} float32 logits (best of {repeats}):",
        "",
        "| op | time |",
        "|---|---|",
        *(f"| {name} | {seconds * 1000:.1f} ms |" for name, seconds in figures.items()),
        "",
    ]


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
        *op_times(),
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
