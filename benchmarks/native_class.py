"""What restricting plans to the native executor's class costs, predicted on one profile per model.

The native executor (runtime/native.py) can only checkpoint whole modules (or runs of an
nn.Sequential's children) with torch.utils.checkpoint; the traced executor runs any schedule of the
profiled graph. For each benchmark model and a 12-layer GPT-2, one profile (the cross-entropy
backward unfused, as eager autograd runs it, so both plan the same graph), then at each budget:

- native: planner/native_solve.py's search over checkpoint regions (predicted; not measured here),
- unrestricted: the best of the traced solvers ``dp`` (over every grouping) and ``auto``,

both as predicted step time over no checkpointing (same measured op times, so the ratio is not
machine noise), and the least budget each class reaches.

    python benchmarks/native_class.py [--models gpt2,bert,residual-mlp,unet,gpt2-12] [--out docs/benchmarks/native-class.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
import profiler  # noqa: E402
from planner.budget import parse_budget  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.native_solve import solve_native  # noqa: E402
from solvers import Infeasible  # noqa: E402

import models as bench  # noqa: E402

FRACTIONS = (0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def _gpt2_12():
    from examples import gpt2 as example_gpt2

    return example_gpt2.build_model(layers=12, tokens=256)


MODELS = {
    **{name: (b.build, b.inputs, b.loss_fn) for name, b in bench.BENCHMARKS.items() if name != "unet-channels-last"},
    "gpt2-12": (_gpt2_12, bench.token_batch, bench.BENCHMARKS["gpt2"].loss_fn),
}


def _traced(model, inputs, loss_fn, budget_bytes, profile, time_limit) -> tuple[float, str] | None:
    best = None
    for solver in ("dp", "auto"):
        try:
            plan = planner.plan(model, inputs, budget=budget_bytes, solver=solver, loss_fn=loss_fn, profile=profile,
                                executor="traced", time_limit=time_limit)
        except (planner.BudgetInfeasible, planner.SolverError):
            continue
        if best is None or plan.predicted_seconds < best[0]:
            best = (plan.predicted_seconds, plan.method)
    return best


def run(names: list[str], time_limit: float) -> list[dict]:
    rows = []
    for name in names:
        build, make_inputs, loss_fn = MODELS[name]
        model, inputs = build(), make_inputs()
        started = time.perf_counter()
        profile = profiler.profile(model, inputs, loss_fn=loss_fn, fuse_loss=False)
        store_all = planner.plan(model, inputs, budget="100%", solver="store-all", loss_fn=loss_fn, profile=profile,
                                 executor="traced")
        print(f"{name}: profiled in {time.perf_counter() - started:.0f} s, no-checkpointing peak "
              f"{store_all.unplanned_peak_bytes / 2**20:.1f} MiB, {store_all.unplanned_seconds * 1000:.0f} ms",
              flush=True)
        for fraction in FRACTIONS:
            budget_bytes = parse_budget(f"{fraction * 100:g}%").resolve(store_all.unplanned_peak_bytes)
            row = {"model": name, "budget": f"{fraction:.0%}", "budget_bytes": budget_bytes,
                   "unplanned_seconds": store_all.unplanned_seconds}
            try:
                native, _ = solve_native(profile, model, budget_bytes, time_limit=time_limit)
                row["native_seconds"] = native.outcome.compute_cost
                row["native_regions"] = len(native.regions)
            except Infeasible:
                row["native_seconds"] = None
            traced = _traced(model, inputs, loss_fn, budget_bytes, profile, time_limit)
            row["traced_seconds"], row["traced_method"] = traced if traced else (None, "")
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _overhead(row, key) -> str:
    value = row.get(key)
    return "infeasible" if value is None else f"{value / row['unplanned_seconds'] - 1:+.1%}"


def _line(row) -> str:
    ratio = ""
    if row.get("native_seconds") is not None and row.get("traced_seconds") is not None:
        ratio = f"{row['native_seconds'] / row['traced_seconds']:.3f}"
    return (f"| {row['model']} | {row['budget']} | {row['budget_bytes'] / 2**20:.1f} MiB | {_overhead(row, 'native_seconds')} "
            f"| {_overhead(row, 'traced_seconds')} ({row.get('traced_method') or '-'}) | {ratio} |")


HEADER = ("| model | budget (of no checkpointing) | budget | native overhead | unrestricted overhead (method) "
          "| native / unrestricted step |\n|---|---|---|---|---|---|")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,residual-mlp,unet,gpt2-12")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks", "native-class.md"))
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    print(HEADER)
    rows = run(names, args.time_limit)
    text = (
        "# The native executor's plan class against unrestricted schedules\n\n"
        f"`python benchmarks/native_class.py --models {args.models}` (predicted from one profile per model; "
        "overheads are predicted step time over no checkpointing's, from the same measured op times).\n\n"
        + HEADER + "\n" + "\n".join(_line(r) for r in rows) + "\n"
    )
    write_atomic(args.out, text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
