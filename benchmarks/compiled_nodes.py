"""Does compiling each node program of a plan close the gap to torch.compile? A probe, not a feature.

    python benchmarks/compiled_nodes.py [--model gpt2] [--budget-mib 331.8] [--rounds 5]

The planned module runs each cost-graph node as a small eager ``fx.GraphModule`` of aten ops
(runtime/programs.py). This plans ``--model`` with dp at ``--budget-mib``, then wraps every node
program of one copy of the planned module in ``torch.compile`` (inductor), including the random
ones (their dropout masks then come from inductor's generator: fine for timing, not for the
runtime's guarantee of gradients equal to eager's, which is why this is not a feature), and times
no checkpointing, the eager plan, the plan with compiled nodes, and torch.compile of the model,
interleaved round by round. Writes docs/benchmarks/compiled-nodes.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
import profiler  # noqa: E402
from compare import timed_step  # noqa: E402  (one training step, timed as compare.py times it)
from models import BENCHMARKS  # noqa: E402
from planner.files import write_atomic  # noqa: E402

MiB = 2**20


def _compile_node_programs(planned, inputs, loss_fn) -> int:
    """Wrap the bound executor's node programs in torch.compile (reaches into the runtime's
    private state: a probe). Returns how many were wrapped."""
    timed_step(planned, inputs, loss_fn)  # binds the plan to the model's trace
    programs = planned.__dict__["_planned_bound"].executor.programs.nodes.values()
    wrapped = 0
    for program in programs:
        if program.run is not None:
            program.run = torch.compile(program.run, dynamic=False)
            wrapped += 1
    return wrapped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2", choices=sorted(BENCHMARKS))
    parser.add_argument("--budget-mib", type=float, default=331.8, help="GPT-2's torch.compile peak in compare.py")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "benchmarks", "compiled-nodes.md"))
    args = parser.parse_args(argv)

    bench = BENCHMARKS[args.model]
    torch.manual_seed(0)
    model = bench.build()
    model.train()
    inputs = bench.inputs()
    plan = planner.plan(model, inputs, budget=int(args.budget_mib * MiB), solver="dp", loss_fn=bench.loss_fn)
    eager_plan = planner.apply(model, plan)
    compiled_plan = planner.apply(model, plan)
    started = time.perf_counter()
    wrapped = _compile_node_programs(compiled_plan, inputs, bench.loss_fn)
    timed_step(compiled_plan, inputs, bench.loss_fn)
    compile_seconds = time.perf_counter() - started
    compiled_model = torch.compile(copy.deepcopy(model))
    timed_step(compiled_model, inputs, bench.loss_fn)

    modules = {"no checkpointing": model, "plan, eager nodes": eager_plan,
               f"plan, {wrapped} nodes compiled": compiled_plan, "torch.compile of the model": compiled_model}
    times: dict[str, list[float]] = {name: [] for name in modules}
    for round_index in range(args.rounds + 1):  # the first round warms up
        for name, module in modules.items():
            seconds = timed_step(module, inputs, bench.loss_fn)
            if round_index:
                times[name].append(seconds)
    lines = ["| method | measured peak (MiB) | step (s) | vs no checkpointing |", "|---|---|---|---|"]
    base = statistics.median(times["no checkpointing"])
    for name, module in modules.items():
        peak = profiler.measure_step(module, inputs, loss_fn=bench.loss_fn, repeats=1).peak_bytes
        median = statistics.median(times[name])
        lines.append(f"| {name} | {peak / MiB:.1f} | {median:.3f} | {median / base:.2f}x |")
    text = (f"### Compiled node programs: {args.model}, dp plan at {args.budget_mib:g} MiB\n\n"
            f"`python benchmarks/compiled_nodes.py --model {args.model} --budget-mib {args.budget_mib:g} "
            f"--rounds {args.rounds}`; node programs compiled in {compile_seconds:.0f} s; step times are medians "
            f"of {args.rounds} interleaved rounds, torch {torch.__version__}.\n\n" + "\n".join(lines) + "\n")
    print(text)
    write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
