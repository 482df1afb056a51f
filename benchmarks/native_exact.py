"""The exact native method against the heuristic search it starts from, predicted on one profile per model.

For each benchmark model (benchmarks/models.py) and the 12-layer GPT-2 of benchmarks/plan_speed.py
(examples/gpt2.py), one profile as planner/native.py makes it (op granularity, the cross-entropy
backward unfused), the menu planner/native_solve.py gives (the modules the forward calls, the runs of
every nn.Sequential's children, the four save policies), then at each budget (a fraction of the
predicted un-checkpointed activation peak: the schedule's part, what the solvers plan):

- heuristic: ``solvers.regions.plan_regions`` (the search before the exact method, now its start);
- exact: ``solvers.native.solve_regions_exact`` (the heuristic included), its status or gap;

each as the predicted step over no checkpointing and the solve's CPU seconds of this process
(``time.process_time``: HiGHS's threads included; on a shared machine wall time measures the other
processes). One torch thread.

    python benchmarks/native_exact.py [--models gpt2,bert,llama,residual-mlp,unet,gpt2-12]
                                      [--fractions 0.4,0.5,0.6,0.7,0.8] [--time-limit 60]
                                      [--out docs/benchmarks/native-exact.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)  # after the project root: benchmarks/solvers.py must not shadow the solvers package
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import profiler  # noqa: E402
from planner.native_solve import called_in_forward, sequential_containers  # noqa: E402
from runtime.rnn import staged_for_trace  # noqa: E402
from solvers import Infeasible  # noqa: E402
from solvers.native import build_menu, solve_regions_exact  # noqa: E402
from solvers.regions import SAVE_POLICIES, RegionModel, candidate_regions, evaluate, plan_regions  # noqa: E402

import models as bench  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)


def _gpt2_12():
    from examples import gpt2 as example_gpt2

    return example_gpt2.build_model(layers=12)


def _gpt2_12_inputs():
    from examples import gpt2 as example_gpt2

    return example_gpt2.example_inputs()


def _gpt2_12_loss(output):
    from examples import gpt2 as example_gpt2

    return example_gpt2.loss_fn(output)


MODELS = {
    **{name: (b.build, b.inputs, b.loss_fn) for name, b in bench.BENCHMARKS.items()},
    "gpt2-12": (_gpt2_12, _gpt2_12_inputs, _gpt2_12_loss),
}


def _timed(call):
    started = time.process_time()
    try:
        return call(), time.process_time() - started
    except Infeasible:
        return None, time.process_time() - started


def run(name: str, fractions, time_limit: float) -> list[tuple]:
    build, inputs, loss_fn = MODELS[name]
    model = build()
    with staged_for_trace(model):
        profile = profiler.profile(model, inputs(), loss_fn=loss_fn, granularity="op", fuse_loss=False)
    graph = profile.regroup("op").graph
    candidates = [c for c in candidate_regions(graph) if called_in_forward(model, c)]
    sequentials = sequential_containers(model)
    # The menu the exact method searches: duplicates (a policy that saves what another does) left out.
    choices = len(build_menu(graph, candidates, sequentials, tuple(SAVE_POLICIES), RegionModel(graph)).choices)
    empty = evaluate(graph, ()).outcome
    rows = []
    for fraction in fractions:
        budget = int(fraction * empty.peak_bytes)
        heuristic, heuristic_seconds = _timed(lambda b=budget: plan_regions(graph, b, candidates, sequentials))
        exact, exact_seconds = _timed(lambda b=budget: solve_regions_exact(graph, b, candidates, sequentials,
                                                                           time_limit=time_limit))

        def overhead(plan) -> str:
            return "infeasible" if plan is None else f"{plan.outcome.compute_cost / empty.compute_cost - 1:+.1%}"

        if exact is None:
            status = "infeasible"
        else:
            info = exact.schedule.info
            status = info.status if info.gap is None else f"{info.status}, gap {info.gap:.1%}"
        rows.append((name, f"{fraction:.0%}", choices, overhead(heuristic), f"{heuristic_seconds:.1f}",
                     overhead(exact), f"{exact_seconds:.1f}", status))
        print(rows[-1], f"load {os.getloadavg()[0]:.1f}", flush=True)
    return rows


HEADER = ("model", "budget", "choices", "heuristic step", "heuristic CPU s", "exact step", "exact CPU s", "exact status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,residual-mlp,unet,gpt2-12")
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for name in args.models.split(","):
        rows += run(name, fractions, args.time_limit)
    text = ("# The exact native method against the heuristic search\n\n"
            "`python benchmarks/native_exact.py` (see its docstring). Budget: a fraction of the predicted "
            "un-checkpointed activation peak. Step: predicted step over no checkpointing. CPU s: the solve's CPU "
            "seconds (HiGHS's threads included; the exact column includes its heuristic start). Choices: the menu the exact "
            "method searches (regions x none and four policies, duplicates left out).\n\n"
            + markdown_table(HEADER, rows) + "\n")
    publish(text, args.out)


if __name__ == "__main__":
    main()
