"""Where planning time goes: ``planner.plan`` of the benchmark's GPT-2 (native, "N%"), phase by phase.

Each run plans the same model end to end (``planner.plan(model, inputs, budget)``) and times its
phases by wrapping the functions that do them: the trace (profiler/capture.py, make_fx), the
op-by-op timing (profiler/measure.py time_ops), the eager step's measured peak (the "N%" base), the
region search, the plan's measurement, and the rest (cost graphs, grouping, the plan's figures).
The machine's load average is printed with each run: on a shared machine every phase that runs the
model slows with it. ``--cpu`` reports each phase's CPU time of this process (``time.process_time``)
instead of its wall time: with ``--threads 1`` that is the work a phase does, which other processes'
load changes much less than its wall time (run both trees of a comparison the same way).

    python benchmarks/plan_speed.py [--layers 12] [--budget 50%] [--runs 3] [--threads N] [--cpu]
                                    [--out docs/benchmarks/plan-speed.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
import torch  # noqa: E402
from planner.planfile import PlanWarning  # noqa: E402
import planner.native_measure as native_measure  # noqa: E402
import planner.native_repair as native_repair  # noqa: E402
import planner.native_request as native_request  # noqa: E402
import profiler.api as profiler_api  # noqa: E402
from examples import gpt2  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

PHASES = ("trace", "op timing", "eager measure", "search", "plan measure")


@contextlib.contextmanager
def phase_timers(seconds: dict[str, float], clock=time.perf_counter):
    """Wrap the functions of each phase so that their time adds to ``seconds[phase]``: measure_native
    called by the request (planner/native_request.py) measures the eager step, by the repair
    (planner/native_repair.py) and the timing check (planner/native_measure.py) the plan's."""

    def timed(module, name: str, phase: str):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[phase] += clock() - started

        setattr(module, name, wrapper)
        return original

    wrapped = [
        (module, name, timed(module, name, phase)) for module, name, phase in (
            (profiler_api, "capture", "trace"),
            (profiler_api, "time_ops", "op timing"),
            (native_repair, "solve_native", "search"),
            (native_request, "measure_native", "eager measure"),
            (native_repair, "measure_native", "plan measure"),
            (native_measure, "measure_native", "plan measure"),
        )
    ]
    try:
        yield
    finally:
        for module, name, original in wrapped:
            setattr(module, name, original)


def run(layers: int, budget: str, runs: int, clock=time.perf_counter) -> list[tuple]:
    model, inputs = gpt2.build_model(layers=layers), gpt2.example_inputs()
    rows = []
    for index in range(runs):
        seconds: dict[str, float] = defaultdict(float)
        load = os.getloadavg()[0]
        with phase_timers(seconds, clock), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = clock()
            plan = planner.plan(model, inputs, budget, loss_fn=gpt2.loss_fn)
            total = clock() - started
        rest = total - sum(seconds[p] for p in PHASES)
        warned = any(issubclass(w.category, PlanWarning) for w in caught)
        rows.append((index + 1, f"{load:.1f}", f"{total:.1f}", *(f"{seconds[p]:.2f}" for p in PHASES), f"{rest:.2f}",
                     plan.profile.times.runs, len(plan.regions), f"{plan.predicted_seconds * 1000:.0f}", f"{plan.measured_seconds * 1000:.0f}",
                     "yes" if warned else "no"))
        print(*rows[-1], flush=True)
    return rows


HEADER = ("run", "load", "total s", *(f"{p} s" for p in PHASES), "rest s", "timed op runs", "regions", "predicted step ms",
          "measured step ms", "time warning")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--cpu", action="store_true", help="CPU time of the process instead of wall time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start_load = os.getloadavg()[0]
    rows = run(args.layers, args.budget, args.runs, time.process_time if args.cpu else time.perf_counter)
    options = (f" --threads {args.threads}" if args.threads else "") + (" --cpu" if args.cpu else "")
    text = (f"`python benchmarks/plan_speed.py --layers {args.layers} --budget {args.budget} --runs {args.runs}{options}`: "
            f"`planner.plan` of a {args.layers}-layer GPT-2 (width 256, batch 4x128) at {args.budget}, in one process, "
            f"{'CPU' if args.cpu else 'wall'} seconds, {torch.get_num_threads()} torch threads; "
            f"load average {start_load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} "
            "cores ('load' is the 1-minute load average as each run started).\n\n"
            + markdown_table(HEADER, rows) + "\n")
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
