"""How far one plan's predicted overhead moves from one calibration of the checkpoint clock to the next.

The clock's per-op rates are fitted to one of the model's regions (profiler/checkpoint_cost.py,
``fit_to_region``) from a few rounds of its steps: a small difference of large times. This script
calibrates the same model ``--calibrations`` times in a row, each on 8 fresh rounds of the region's
variants, and fits every calibration two ways from the same rounds:

- ``least of 4``: the fit before issue 28's clock work was finished (each variant's least over the
  first 4 rounds, every policy fitted on its own);
- ``median``: ``fit_to_region`` now (each round fitted on its own, the median over the rounds, the
  policies fitted together as one factor on their synthetic rates);

then prices each ``--plan`` (regions joined by commas) on the model's profile with each fit. The
spread of a plan's predicted overhead over the calibrations is what the calibration alone adds to
the clock's error. One torch thread, CPU time.

    python benchmarks/clock_spread.py --model nanogpt --calibrations 6 \\
        --plan transformer.h.0@projections,transformer.h.1@projections --plan transformer.h.0,transformer.h.1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the repository first: benchmarks/solvers.py is not the solvers package

import torch  # noqa: E402

import planner  # noqa: E402
from planner import checkpoint_clock  # noqa: E402
from profiler import checkpoint_cost  # noqa: E402
from profiler.checkpoint_cost import CheckpointCosts, RegionShape  # noqa: E402
from solvers.regions import SAVE_POLICIES, evaluate  # noqa: E402

import clock as clock_benchmark  # noqa: E402  (benchmarks/clock.py: its models)


def least_of_four(synthetic: CheckpointCosts, steps: dict[str, list[float]], shapes: dict[str, RegionShape],
                  source: str) -> CheckpointCosts:
    """The fit before: each variant's least over its first 4 rounds, each policy fitted on its own."""
    least = {variant: min(seconds[:4]) for variant, seconds in steps.items()}
    plain, forward = shapes["checkpoint"], least["forward"]
    residual = least["checkpoint"] - least["plain"] - forward * plain.recomputed_share - synthetic.region_seconds
    op_rate = max(synthetic.recomputed_op_seconds, residual / max(plain.recomputed_ops, 1))
    rates = dict(synthetic.policy_op_seconds)
    for name, floor in synthetic.policy_op_seconds.items():
        shape = shapes[f"policy:{name}"]
        residual = (least[f"policy:{name}"] - least["plain"] - forward * shape.recomputed_share
                    - synthetic.region_seconds - op_rate * shape.recomputed_ops
                    - synthetic.policy_region_seconds.get(name, 0.0))
        rates[name] = max(floor, residual / max(shape.forward_ops + shape.pass_ops, 1))
    scale = plain.forward_seconds / forward
    return CheckpointCosts(synthetic.device, synthetic.region_seconds * scale, op_rate * scale,
                           {name: s * scale for name, s in synthetic.policy_region_seconds.items()},
                           {name: s * scale for name, s in rates.items()}, source, scale)


def main() -> None:
    cases = clock_benchmark._cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nanogpt", choices=list(cases))
    parser.add_argument("--calibrations", type=int, default=6)
    parser.add_argument("--plan", action="append", required=True, help="regions joined by commas (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    build, make_inputs, loss_fn = cases[args.model]
    model, inputs = build().train(), make_inputs()
    graph = planner.profile_for(model, inputs, loss_fn=loss_fn).regroup("op").graph
    policies = tuple(SAVE_POLICIES)
    region = checkpoint_clock.calibration_region(model, graph)
    synthetic = checkpoint_clock.synthetic_costs("cpu", policies)
    region_args, region_kwargs = checkpoint_cost.capture_region_inputs(model, region, inputs)
    shapes = {"checkpoint": checkpoint_clock._shape(graph, region)}
    shapes.update({f"policy:{name}": checkpoint_clock._shape(graph, f"{region}@{name}") for name in policies})
    plans = [tuple(plan.split(",")) for plan in args.plan]
    fits = {"least of 4": least_of_four, "median": checkpoint_cost.fit_to_region}
    predicted: dict[str, list[list[float]]] = {label: [] for label in fits}
    print(f"{args.model}: calibrated on {region}, load average {os.getloadavg()[0]:.1f}", flush=True)
    for calibration in range(args.calibrations):
        steps = checkpoint_cost.measure_region_steps(model.get_submodule(region), region_args, region_kwargs,
                                                     checkpoint_clock._policy_contexts(policies), rounds=8,
                                                     time_limit=float("inf"))
        for label, fit in fits.items():
            checkpoint_clock.annotate(graph, fit(synthetic, steps, shapes, region))
            unplanned = evaluate(graph, ()).outcome.compute_cost
            predicted[label].append([evaluate(graph, plan).outcome.compute_cost / unplanned - 1 for plan in plans])
        print(calibration, {label: [f"{x:+.1%}" for x in rows[-1]] for label, rows in predicted.items()}, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| fit | plan | predicted overhead over the calibrations | spread (points) | sd (points) |")
    print("|---|---|---|---:|---:|")
    for label, rows in predicted.items():
        for j, plan in enumerate(plans):
            values = [row[j] * 100 for row in rows]
            print(f"| {label} | {', '.join(clock_benchmark.short(r) for r in plan)} | {min(values):+.1f}% to "
                  f"{max(values):+.1f}% | {max(values) - min(values):.1f} | {statistics.stdev(values):.2f} |")


if __name__ == "__main__":
    main()
