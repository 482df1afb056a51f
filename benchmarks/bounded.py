"""Memory-bounded profiles against full ones on the benchmark models (docs/profiler.md, "Planning
what does not fit").

For each model, in one process (one thread with --threads 1), one after another: the native
planner's profile (single ops, the cross-entropy backward unfused) made whole, then within half and
a tenth of the un-checkpointed step's predicted peak (a step 2x and 10x over the bound:
profiler/rematerialize.py evicts and recomputes). For each bounded profile: its time, what it held
at most (counted), the figure it was bound to hold at most (``held_bound_bytes``: the bound raised to
the placeholders and the largest op) and what the allocator's events say its warm-up run held
(``measured_held_bytes``), the op calls it made again, the sum of its op times against the full
profile's, and the region search (planner/native_solve.py solve_native, no measurement) at 50% and 30% of
the peak: are the regions the full profile's, and is the predicted step within 3% of the full
profile's prediction for the same regions? Each kind is profiled ``--rounds`` times in turn, its op
times the least over its rounds (its other figures from its first round).

    python benchmarks/bounded.py [--models gpt2 bert llama residual-mlp unet] [--budgets 0.5 0.3]
                                 [--threads 1] [--rounds 2] [--out docs/benchmarks/bounded.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.append(HERE)  # after the root: benchmarks/solvers.py is not the solvers package

import torch  # noqa: E402

from models import BENCHMARKS  # noqa: E402
from planner.native_solve import solve_native  # noqa: E402
from planner.api import profile_for  # noqa: E402
from profiler.api import least_times  # noqa: E402
from solvers import Infeasible  # noqa: E402
from solvers.regions import evaluate  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

OVER = (2, 10)  # the step this many times over the bound
BUDGETS = (0.5, 0.3)  # fractions of the un-checkpointed peak planned for (--budgets)
# Rounds of each kind of profile, in turn (--rounds): two full profiles of the same step in one
# process, at load 12, summed their op times 2-6% apart (0.726 and 0.709 s; 0.745 and 0.704 s), the
# first the higher on the GPT-2: one profile of each kind compares noise as much as the profiles.
ROUNDS = 2


def _predicted_peak(profile) -> int:
    graph = profile.regroup("op").graph
    return int(graph.graph["fixed_bytes"]) + evaluate(graph, ()).outcome.peak_bytes


def _solve(profile, model, budget: int):
    try:
        solved, _ = solve_native(profile, model, budget)
    except Infeasible:
        return None
    return solved


def _seconds_of(profile, regions) -> float:
    """The predicted step of ``regions`` priced on ``profile``'s op times."""
    return evaluate(profile.regroup("op").graph, tuple(regions)).outcome.compute_cost


def run(name: str, budgets=BUDGETS, rounds: int = ROUNDS) -> list[tuple]:
    """The model's rows: ``rounds`` rounds of a full profile and one at each bound, in turn, in one
    process; each kind's op times the least over its rounds, its other figures its first round's."""
    bench = BENCHMARKS[name]
    model, inputs = bench.build(), bench.inputs()
    model.train()

    def profiled(bound=None):
        started = time.perf_counter()
        made = profile_for(model, inputs, loss_fn=bench.loss_fn, granularity="op", memory_bound=bound)
        return made, time.perf_counter() - started

    fulls, full_seconds = [], []
    bounded = {over: [] for over in OVER}
    bounded_seconds = {over: [] for over in OVER}
    peak = None
    for _ in range(rounds):
        made, seconds = profiled()
        fulls.append(made)
        full_seconds.append(seconds)
        peak = peak or _predicted_peak(made)
        for over in OVER:
            made, seconds = profiled(peak // over)
            bounded[over].append(made)
            bounded_seconds[over].append(seconds)
    full = least_times(fulls)
    rows = [(name, "full", f"{peak / 2**20:.1f}", f"{full_seconds[0]:.1f}", "-", "-", "-", "-", "-", "", "")]
    plans = {fraction: _solve(full, model, int(fraction * peak)) for fraction in budgets}
    for over in OVER:
        bound = peak // over
        least = least_times(bounded[over])
        same, within = [], []
        for fraction in budgets:
            mine, theirs = _solve(least, model, int(fraction * peak)), plans[fraction]
            if mine is None or theirs is None:
                same.append(f"{fraction:.0%}: {'both infeasible' if mine is theirs else 'one infeasible'}")
                continue
            same.append(f"{fraction:.0%}: {'yes' if mine.regions == theirs.regions else 'no'}")
            # The bounded profile's prediction of the full profile's plan, against the full one's.
            ratio = _seconds_of(least, theirs.regions) / _seconds_of(full, theirs.regions)
            within.append(f"{fraction:.0%}: {ratio - 1:+.1%}")
        times = bounded[over][0].times
        op_sum = sum(least.times.seconds.values()) / sum(full.times.seconds.values())
        rows.append((name, f"bound = peak/{over}", f"{bound / 2**20:.1f}", f"{bounded_seconds[over][0]:.1f}",
                     f"{times.held_peak_bytes / 2**20:.1f}", f"{times.held_bound_bytes / 2**20:.1f}",
                     f"{times.measured_held_bytes / 2**20:.1f}", str(times.recomputed_calls), f"{op_sum - 1:+.1%}",
                     ", ".join(same), ", ".join(within)))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "llama", "residual-mlp", "unet"],
                        choices=sorted(BENCHMARKS))
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS),
                        help="fractions of the un-checkpointed peak to plan for")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of each kind of profile, in turn")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start_load = os.getloadavg()[0]
    rows = []
    for name in args.models:
        rows += run(name, tuple(args.budgets), args.rounds)
    load = os.getloadavg()[0]
    header = ("model", "profile", "peak or bound (MiB)", "profile (s)", "held at most (MiB)", "bound to (MiB)",
              "measured warm-up (MiB)", "ops recomputed", "op times vs full", "same regions (budget)",
              "predicted step vs full (same regions)")
    text = (f"Command: `python benchmarks/bounded.py {' '.join(sys.argv[1:])}` (torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s), load average {start_load:.1f} at the start, {load:.1f} at the end)\n\n"
            + markdown_table(header, rows))
    publish(text, args.out)


if __name__ == "__main__":
    main()
