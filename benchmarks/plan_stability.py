"""Planning time and stability of native plans: the same model profiled and planned several times.

For each model: the time of each planning phase (profiling: tracing and timing every op; the
un-planned step measured for the "N%" base; the region search), then ``--profiles`` independent
profiles, each solved at each budget: how many distinct region sets came out (1 is stable) and
how many regions each had. Op timings move with the machine's load; the regions they choose should
not (profiler/measure.py takes each op's least time over its runs for that reason).

    python benchmarks/plan_stability.py [--layers 6,12] [--profiles 3] [--out docs/benchmarks/plan-stability.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from examples import gpt2  # noqa: E402
from planner.api import profile_for  # noqa: E402
from planner.native_solve import solve_native  # noqa: E402
from profiler.memory import measure_step  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

BUDGETS = (0.45, 0.6, 0.75)


def _timed(function):
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def run_model(layers: int, profiles: int) -> list[tuple]:
    model, inputs = gpt2.build_model(layers=layers), gpt2.example_inputs()
    eager, measure_seconds = _timed(lambda: measure_step(model, inputs, gpt2.loss_fn, repeats=1))
    plans: dict[float, list[tuple[str, ...]]] = {fraction: [] for fraction in BUDGETS}
    profile_seconds, solve_seconds = [], []
    for _ in range(profiles):
        profile, seconds = _timed(lambda: profile_for(model, inputs, gpt2.loss_fn))
        profile_seconds.append(seconds)
        for fraction in BUDGETS:
            (solved, _), seconds = _timed(lambda f=fraction, p=profile: solve_native(p, model, int(eager.peak_bytes * f)))
            solve_seconds.append(seconds)
            plans[fraction].append(solved.regions)
    name = f"GPT-2, {layers} layers (width 256, batch 4x128)"
    return [(name, f"{fraction:.0%}", len(set(found)), " / ".join(str(len(r)) for r in found),
             f"{min(profile_seconds):.1f}-{max(profile_seconds):.1f}", f"{measure_seconds:.1f}",
             f"{max(solve_seconds):.2f}", f"{eager.seconds:.2f}")
            for fraction, found in plans.items()]


HEADER = ("model", "budget", "distinct plans", "regions per profile", "profile s", "eager measure s",
          "solve s (max)", "eager step s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="6,12")
    parser.add_argument("--profiles", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = [row for layers in args.layers.split(",") for row in run_model(int(layers), args.profiles)]
    text = (f"`python benchmarks/plan_stability.py --layers {args.layers} --profiles {args.profiles}`; load average "
            f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores.\n\n"
            + markdown_table(HEADER, rows) + "\n")
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
