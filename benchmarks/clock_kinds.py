"""The clock by kind of region: predicted against measured overhead of plans that checkpoint one kind
of module in every block (every norm alone, every MLP, every attention, every block, with and
without a save policy), on one benchmark model.

Where benchmarks/clock.py measures the plans the planner chose, this separates what each kind of
region costs in a step from what the clock prices it at (planner/checkpoint_clock.py), so that a
miss can be traced to the regions that carry it: the per-call cost of the checkpoint from cold
caches was found this way (docs/native.md, "The clock"). Predicted: the plan's predicted step over
the un-checkpointed one, on the graph the planner prices; measured: CPU time of a step with the plan
over eager's, paired and interleaved (benchmarks/paired_steps.py), the median over the rounds
(quartiles in brackets), malloc keeping what it frees in planning and measuring. One torch thread.

    python benchmarks/clock_kinds.py [--model llama|gpt2] [--rounds 11] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]  # the repository first: benchmarks/solvers.py is not the solvers package

import torch  # noqa: E402

import planner  # noqa: E402
from planner import checkpoint_clock  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from solvers.regions import SAVE_POLICIES, evaluate  # noqa: E402

import models  # noqa: E402  (benchmarks/models.py)
from paired_steps import keep_freed_memory, measured_overheads, overhead_text  # noqa: E402

LAYERS = 6  # the benchmark models' blocks


def _each(prefix: str, suffix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}{suffix}" for i in range(LAYERS))


def kinds(model_name: str) -> dict[str, tuple[str, ...]]:
    """Kind of region -> the plan checkpointing it in every block."""
    if model_name == "llama":
        blocks = "model.layers"
        norms = (_each(blocks, ".input_layernorm") + _each(blocks, ".post_attention_layernorm") + ("model.norm",))
        return {"every norm": norms, "every MLP": _each(blocks, ".mlp"),
                "every MLP @projections": _each(blocks, ".mlp@projections"),
                "every attention": _each(blocks, ".self_attn"),
                "every attention @projections+draws": _each(blocks, ".self_attn@projections+draws"),
                "every block": _each(blocks, ""), "every block @projections+draws": _each(blocks, "@projections+draws")}
    blocks = "transformer.h"
    return {"every norm": _each(blocks, ".ln_1") + _each(blocks, ".ln_2"), "every MLP activation": _each(blocks, ".mlp.act"),
            "every MLP": _each(blocks, ".mlp"), "every MLP @matmuls": _each(blocks, ".mlp@matmuls"),
            "every attention": _each(blocks, ".attn"),
            "every attention @projections+draws": _each(blocks, ".attn@projections+draws"),
            "every block": _each(blocks, ""), "every block @projections+draws": _each(blocks, "@projections+draws")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama", choices=["llama", "gpt2"])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    bench = models.BENCHMARKS[args.model]
    torch.manual_seed(0)
    model, inputs = bench.build().train(), bench.inputs()
    graph = planner.profile_for(model, inputs, loss_fn=bench.loss_fn).regroup("op").graph
    checkpoint_clock.price(graph, model, inputs, tuple(SAVE_POLICIES))
    plans = kinds(args.model)
    unplanned = evaluate(graph, ()).outcome.compute_cost
    ratios = measured_overheads(model, inputs, bench.loss_fn, list(plans.values()), args.rounds)
    rates = graph.graph[checkpoint_clock.KEY]
    lines = [f"`python benchmarks/clock_kinds.py --model {args.model} --rounds {args.rounds}` ({datetime.date.today()}, "
             f"torch {torch.__version__}, one thread, load average {load:.1f} at the start, "
             f"{os.getloadavg()[0]:.1f} at the end). The clock fitted to `{rates['source']}`: "
             f"{rates['region_seconds'] * 1e6:.0f} us per call ({rates['warm_region_seconds'] * 1e6:.0f} us back to "
             f"back), {rates['recomputed_op_seconds'] * 1e6:.1f} us per op recomputed.", "",
             "| plan | regions | predicted overhead | measured overhead (quartiles) | predicted - measured | "
             "missing per region (ms) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, regions in plans.items():
        predicted = evaluate(graph, regions).outcome.compute_cost / unplanned - 1
        measured = statistics.median(ratios[regions]) - 1
        missing_ms = (measured - predicted) * unplanned * 1e3 / len(regions)
        lines.append(f"| {name} | {len(regions)} | {predicted:+.1%} | {overhead_text(ratios[regions])} | "
                     f"{(predicted - measured) * 100:+.1f} | {missing_ms:+.2f} |")
    print("\n".join(lines))
    if args.out:
        write_atomic(args.out, "\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
