"""Predicted against measured peaks of native plans (docs/native.md, "Measured, then repaired").

For each case: the regions' predicted peak (solvers/regions/ on the profile's op graph, the
wrapper-free step) and the peak of one measured training step with those regions checkpointed
(runtime/native.py, allocator events). No repair: this measures the prediction itself.

    python benchmarks/native_accuracy.py [--out docs/benchmarks/native-accuracy.md]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

import planner  # noqa: E402
import profiler  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.native_measure import measure_native  # noqa: E402
from planner.native_solve import rng_bytes, solve_native  # noqa: E402
from solvers.regions import evaluate  # noqa: E402


def _cases():
    from examples import gpt2 as example_gpt2
    from models import gpt2, gpt2_inputs, hf_loss, mlp, residual_mlp

    small_gpt2 = (lambda: gpt2(layers=3, embd=128, heads=4, vocab=512, positions=64),
                  lambda: gpt2_inputs(batch=8, tokens=64, vocab=512), hf_loss)
    return [
        ("bundled GPT-2", (example_gpt2.build_model, example_gpt2.example_inputs, example_gpt2.loss_fn),
         ["60%", "45%"], []),
        ("3-layer GPT-2, width 128", small_gpt2, ["70%"],
         [[], ["transformer.h.0", "transformer.h.1"], ["transformer.h.0@matmuls", "transformer.h.1@matmuls"],
          ["transformer.h.2"], ["transformer.h.2.mlp"]]),
        ("MLP width 64, depth 6, batch 256", (lambda: mlp(width=64, depth=6, dropout=0.2),
                                               lambda: (torch.randn(256, 64, generator=torch.Generator().manual_seed(0)),),
                                               lambda o: o.pow(2).mean()), ["70%", "55%"], []),
        ("residual MLP width 128, depth 6, batch 512",
         (lambda: residual_mlp(width=128, hidden=512, depth=6),
          lambda: (torch.randn(512, 128, generator=torch.Generator().manual_seed(0)),), lambda o: o.pow(2).mean()),
         ["60%"], [["[0:3]@matmuls", "[3:5]"]]),
    ]


def run() -> list[tuple]:
    rows = []
    for name, (build, make_inputs, loss_fn), budgets, region_sets in _cases():
        model, inputs = build(), make_inputs()
        profile = profiler.profile(model, inputs, loss_fn=loss_fn, fuse_loss=False)
        graph = profile.regroup("op").graph
        fixed = int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))
        unplanned = fixed + evaluate(graph, ()).outcome.peak_bytes
        chosen = []
        for budget in budgets:
            budget_bytes = planner.parse_budget(budget).resolve(unplanned)
            solved, _ = solve_native(profile, model, budget_bytes)
            chosen.append((f"search at {budget}", list(solved.regions)))
        chosen += [(" + ".join(regions) or "no checkpointing", regions) for regions in region_sets]
        for label, regions in chosen:
            predicted = fixed + evaluate(graph, regions).outcome.peak_bytes + rng_bytes(regions, [])
            measured = measure_native(model, regions, inputs, loss_fn).peak_bytes
            row = (name, label, ", ".join(regions) or "nothing", predicted, measured, measured / predicted - 1)
            print(_line(row), flush=True)
            rows.append(row)
    return rows


def _line(row) -> str:
    name, label, regions, predicted, measured, error = row
    return f"| {name} | {label} | {regions} | {predicted:,} | {measured:,} | {error:+.2%} |"


HEADER = "| model | regions from | regions | predicted peak (B) | measured peak (B) | measured / predicted - 1 |\n" \
         "|---|---|---|---|---|---|"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks", "native-accuracy.md"))
    args = parser.parse_args(argv)
    print(HEADER)
    rows = run()
    write_atomic(args.out, "# Native plans: predicted against measured peaks\n\n`python benchmarks/native_accuracy.py`\n\n"
                 + HEADER + "\n" + "\n".join(_line(r) for r in rows) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
