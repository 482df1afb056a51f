"""The native planner's clock: predicted against measured overhead of its plans (issue 28, item 4).

For each model and budget, two native plans on one profile: planned with the recomputed ops alone
priced (``plan_native(..., clock=False)``, the clock before) and with what ``torch.utils.checkpoint``
itself costs priced too (``clock=True``, the default: planner/checkpoint_clock.py). For each plan:
its predicted overhead (predicted step over the predicted un-checkpointed step, minus one) and its
measured overhead: CPU time of a training step (one torch thread) with the plan applied over the
eager step's, eager and every plan stepped in turn in each round (paired, interleaved), the
median of the rounds' ratios (their quartiles beside it). The ops-only plan is also priced by the
new clock (``evaluate`` on the graph the clock annotated), so every measured plan has a prediction
of each clock.

Models: the README's GPT-2 (examples/gpt2.py: 6 layers, 4 x 128 tokens), benchmarks/models.py's
GPT-2 (4 x 256 tokens), BERT, Llama, residual MLP and U-Net, and a nanoGPT-shaped model
(benchmarks/nanogpt.py).

    python benchmarks/clock.py [--rounds 7] [--budgets 60% 75%] [--models ...] [--plan-with-memory-kept]
                                [--out docs/benchmarks/clock.md]
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
from planner.budget import parse_budget  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.native import plan_native  # noqa: E402
from solvers import Infeasible  # noqa: E402
from solvers.regions import evaluate  # noqa: E402

import models  # noqa: E402  (benchmarks/models.py)
from paired_steps import keep_freed_memory, measured_overheads, quartiles  # noqa: E402
import nanogpt  # noqa: E402  (benchmarks/nanogpt.py)


def _cases() -> dict:
    from examples import gpt2 as example_gpt2

    cases = {"gpt2-readme": (example_gpt2.build_model, example_gpt2.example_inputs, example_gpt2.loss_fn)}
    for name in ("gpt2", "bert", "llama", "residual-mlp", "unet"):
        bench = models.BENCHMARKS[name]
        cases[name] = (bench.build, bench.inputs, bench.loss_fn)
    cases["nanogpt"] = (nanogpt.nanogpt, nanogpt.char_batch, nanogpt.loss)
    return cases


SHORT = {"transformer.": "", "bert.encoder.layer.": "layer.", "model.layers.": "layers."}


def short(region: str) -> str:
    """``"transformer.h.3@projections+draws"`` -> ``"h.3@P+d"``."""
    for prefix, replacement in SHORT.items():
        if region.startswith(prefix):
            region = replacement + region[len(prefix):]
    return region.replace("@projections", "@P").replace("@matmuls", "@M").replace("+draws", "+d")


def run_case(name: str, build, make_inputs, loss_fn, budgets, rounds: int) -> tuple[list[dict], dict]:
    model, inputs = build().train(), make_inputs()
    profile = planner.profile_for(model, inputs, loss_fn=loss_fn)
    rows = []
    for clock in (False, True):  # every ops-only plan first: the clock is measured once, for the second
        for budget in budgets:
            try:
                made = plan_native(model, inputs, parse_budget(budget), loss_fn=loss_fn, profile=profile, clock=clock)
            except Infeasible as error:
                made = error
            rows.append({"model": name, "budget": budget, "clock": clock, "plan": made})
            print(f"{name} {budget} {'clock' if clock else 'ops only'}: "
                  f"{made if isinstance(made, Exception) else ', '.join(short(r) for r in made.regions)}", flush=True)
    graph = profile.regroup("op").graph  # annotated by the clock's plans
    unplanned = evaluate(graph, ()).outcome.compute_cost
    for row in rows:
        if not isinstance(row["plan"], Exception):
            row["priced"] = evaluate(graph, row["plan"].regions).outcome.compute_cost / unplanned - 1
    configurations = list(dict.fromkeys(tuple(r["plan"].regions) for r in rows
                                        if not isinstance(r["plan"], Exception) and r["plan"].regions))
    ratios = measured_overheads(model, inputs, loss_fn, configurations, rounds)
    for row in rows:
        made = row["plan"]
        if not isinstance(made, Exception):
            row["ratios"] = ratios.get(tuple(made.regions), [1.0])
    return rows, dict(graph.graph.get(checkpoint_clock.KEY, {}))


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | budget | planned with | regions | predicted overhead | measured overhead (quartiles) "
             "| predicted - measured | priced by the clock | clock - measured |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        made = row["plan"]
        head = f"| {row['model']} | {row['budget']} | {'clock' if row['clock'] else 'ops only'}"
        if isinstance(made, Exception):
            lines.append(f"{head} | refused: {str(made).splitlines()[0][:80]} | | | | | |")
            continue
        measured = statistics.median(row["ratios"]) - 1
        low, high = quartiles(row["ratios"])
        predicted = made.predicted_overhead
        regions = ", ".join(short(r) for r in made.regions) or "none"
        lines.append(
            f"{head} | {regions} | {predicted:+.1%} | {measured:+.1%} ({low - 1:+.1%} to {high - 1:+.1%}) | "
            f"{(predicted - measured) * 100:+.1f} | {row['priced']:+.1%} | {(row['priced'] - measured) * 100:+.1f} |")
    return lines


def summary(rows: list[dict]) -> str:
    """How far each clock's plans' predictions are from their measured overheads, in points."""
    parts = []
    for clock, label in ((True, "With the clock"), (False, "Ops only")):
        misses = [abs(statistics.median(r["ratios"]) - 1 - r["plan"].predicted_overhead) * 100 for r in rows
                  if r["clock"] == clock and "ratios" in r]
        if misses:
            within = sum(1 for m in misses if m <= 3)
            parts.append(f"{label}: {min(misses):.1f} to {max(misses):.1f} points from the measured overhead, mean "
                         f"{statistics.mean(misses):.1f}, {within} of {len(misses)} plans within 3.")
    return " ".join(parts)


def calibration_lines(calibrations: dict) -> list[str]:
    lines = ["| model | fitted to | per region (us) | per recomputed op (us) | per op per pass under a policy (us) |",
             "| --- | --- | ---: | ---: | --- |"]
    for name, data in calibrations.items():
        if not data:
            continue
        policies = ", ".join(f"{p} {s * 1e6:.1f}" for p, s in data["policy_op_seconds"].items())
        lines.append(f"| {name} | {data['source']} | {data['region_seconds'] * 1e6:.0f} | "
                     f"{data['recomputed_op_seconds'] * 1e6:.1f} | {policies} |")
    return lines


def main() -> None:
    cases = _cases()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budgets", nargs="*", default=["60%", "75%"])
    parser.add_argument("--models", nargs="*", default=list(cases))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "clock.md"))
    parser.add_argument("--plan-with-memory-kept", action="store_true",
                        help="malloc keeps what it frees from the start, the profile and the clock's fit included "
                             "(benchmarks/paired_steps.py keep_freed_memory; the measured steps always run so)")
    args = parser.parse_args()
    if args.plan_with_memory_kept:
        keep_freed_memory()
    torch.set_num_threads(1)  # step times are CPU times; the profile's op times one thread too
    started_load = os.getloadavg()
    print(f"torch {torch.__version__}, 1 thread, load average {started_load[0]:.1f}", flush=True)
    rows, calibrations = [], {}
    for name in args.models:
        case_rows, calibrations[name] = run_case(name, *cases[name], args.budgets, args.rounds)
        rows += case_rows
        print("\n".join(table(case_rows)[2:]), flush=True)
    lines = [*table(rows), "", summary(rows)]
    print("\n".join(lines))
    ended_load = os.getloadavg()
    header = [
        "# The native planner's clock: predicted against measured overhead",
        "",
        f"`python benchmarks/clock.py --rounds {args.rounds} --budgets {' '.join(args.budgets)}` "
        f"({datetime.date.today()}, torch {torch.__version__}, one thread, load average {started_load[0]:.1f} at "
        f"the start and {ended_load[0]:.1f} at the end, 2 cores shared with other jobs; planned with malloc "
        f"{'keeping what it frees' if args.plan_with_memory_kept else 'as it is'}, measured with it keeping what it "
        "frees). Each model planned at each "
        "budget (`planner.plan`'s `\"N%\"`) on one profile, with the recomputed ops alone priced (`ops only`, the "
        "clock before issue 28 item 4) and with what torch.utils.checkpoint itself costs priced too (`clock`, the "
        "default). Predicted overhead: the plan's predicted step over the un-checkpointed one. Measured: CPU time of "
        "a step with the plan applied over eager's, eager and every plan stepped in turn in each round, the median "
        "of the rounds' ratios (quartiles in brackets). `priced by the clock`: the same regions priced by the new "
        "clock. Regions: `h.3` a block checkpointed whole, `@M` under `matmuls`, `@P` under `projections`, `+d` "
        "keeping dropout's draws (solvers/regions/policies.py SAVE_POLICIES).",
        "",
    ]
    footer = ["", "The clock's figures (planner/checkpoint_clock.py: synthetic per-call figure, per-op rates fitted "
              "to the model region named):", "", *calibration_lines(calibrations)]
    if args.out:
        write_atomic(args.out, "\n".join(header + lines + footer) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
