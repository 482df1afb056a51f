"""What the order-free bound beside each native plan costs in planning time, and what it says.

``planner.plan``'s native plans carry the order-free bound on the same op graph and budget
(planner/unrestricted.py), solved in 5% of the planning time (0.3-3 s). This plans a 3-layer
GPT-2 (the test's: 64 wide, 2 x 64 tokens, dropout on) at each budget, rounds times, with and
without the bound, interleaved (a fresh model each time, profiled each time as a user's call is),
and prints the median planning seconds of each, the bound's own seconds (once more on the last
plan), the bound's overhead against the native plan's, and the bound given ``--long`` seconds on
the same graph.

    python benchmarks/unrestricted_bound.py [--budgets 60%,80%] [--rounds 3] [--long 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

import planner  # noqa: E402
import planner.api  # noqa: E402
from planner.unrestricted import held_by_any_executor, order_free_bound_within, with_unrestricted_bound  # noqa: E402

from models import gpt2, gpt2_inputs, hf_loss  # noqa: E402  (tests/models.py)


def _planned(budget: str, with_bound: bool):
    """(seconds, plan) of one planner.plan call, the bound on or off."""
    original = planner.api.with_unrestricted_bound
    if not with_bound:
        planner.api.with_unrestricted_bound = lambda plan, seconds: plan
    try:
        model = gpt2(layers=3, embd=64, heads=2, vocab=256, positions=64)
        inputs = gpt2_inputs(batch=2, tokens=64, vocab=256)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = planner.plan(model, inputs, budget, loss_fn=hf_loss)
        return time.perf_counter() - started, made
    finally:
        planner.api.with_unrestricted_bound = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="60%,80%")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long", type=float, default=10.0, help="seconds for the bound solved at length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()[0]:.1f}, torch {torch.__version__}, one thread")
    print("| budget | planning, bound on (median s) | off | the bound alone (s) | native plan | bound in the plan "
          "| bound given --long s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for budget in args.budgets.split(","):
        seconds = {True: [], False: []}
        plans = []
        for _ in range(args.rounds):
            for with_bound in (True, False):
                spent, made = _planned(budget, with_bound)
                seconds[with_bound].append(spent)
                if with_bound:
                    plans.append(made)
        made = plans[-1]
        graph = made.profile.regroup("op").graph
        long = order_free_bound_within(graph, made.budget_bytes - held_by_any_executor(made, graph), args.long)
        started = time.perf_counter()  # the bound alone, as planner.plan gives it time
        with_unrestricted_bound(made, statistics.median(seconds[True]))
        alone = time.perf_counter() - started

        shown = ", ".join(_over(p.unrestricted_seconds, p.unplanned_seconds) for p in plans)
        print(f"| {budget} | {statistics.median(seconds[True]):.2f} | {statistics.median(seconds[False]):.2f} | "
              f"{alone:.2f} | {made.predicted_overhead:+.1%} ({made.status}) | {shown} | "
              f"{_over(long.seconds, made.unplanned_seconds)} |")


def _over(seconds: float | None, unplanned: float) -> str:
    return "none" if seconds is None else f"{seconds / unplanned - 1:+.1%}"


if __name__ == "__main__":
    main()
