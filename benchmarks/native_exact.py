"""The exact native method against the heuristic it starts from and the unrestricted optimum.

For each model, one profile as planner/native.py makes it (``native_profile``: op granularity, the
cross-entropy backward unfused, a Hugging Face decoder's cache off), its op graph priced by the
checkpoint clock as the planner prices it (planner/checkpoint_clock.py: fitted to one of the model's
own regions), the menu planner/native.py gives (the modules the forward calls, the runs of every
nn.Sequential's children, the four save policies), then at each budget (a fraction of the
predicted un-checkpointed activation peak: the schedule's part, what the solvers plan):

- heuristic: ``solvers.regions.plan_regions`` (the search before the exact method, now its start);
- exact: ``solvers.native.solve_regions_exact`` (the heuristic included), its status or gap;
- unrestricted: ``solvers.solve(method="orderfree")`` on the same op graph: the traced executor's
  class (any schedule of the graph, ops only: no torch.utils.checkpoint machinery), its laid-out
  schedule's step and the order-free relaxation's bound over every schedule (issue 20); not run
  above ``--orderfree-max-nodes`` nodes;
- measured: the exact plan applied (runtime/native.py) and stepped against eager, paired and
  interleaved (benchmarks/paired_steps.py: CPU time, one thread), ``--rounds`` rounds, the median
  ratio and its quartiles; ``--rounds 0`` measures nothing.

Steps are predicted steps over no checkpointing; CPU s the solve's CPU seconds of this process
(``time.process_time``: HiGHS's threads included; on a shared machine wall time measures the other
processes). One torch thread.

Models: the six of benchmarks/models.py, the 12-layer GPT-2 of examples/gpt2.py (``gpt2-12``), and
the zoo (benchmarks/zoo.py's cases, ``zoo:<name>``; ``--zoo all``, ``--zoo none`` or names).

    python benchmarks/native_exact.py [--models gpt2,bert,...] [--zoo all|none|gpt2,llama,...]
                                      [--fractions 0.4,0.5,0.6,0.7,0.8] [--time-limit 30]
                                      [--orderfree-time-limit 20] [--rounds 5]
                                      [--out docs/benchmarks/native-exact-run.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)  # after the project root: benchmarks/solvers.py must not shadow the solvers package
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import profiler  # noqa: E402
from planner import checkpoint_clock  # noqa: E402
from planner.native_request import native_profile  # noqa: E402
from planner.native_solve import called_in_forward, sequential_containers  # noqa: E402
from solvers import Infeasible, solve  # noqa: E402
from solvers.errors import SolverTimeout  # noqa: E402
from solvers.native import build_menu, solve_regions_exact  # noqa: E402
from solvers.regions import SAVE_POLICIES, RegionModel, candidate_regions, evaluate, plan_regions  # noqa: E402

import models as bench  # noqa: E402
from paired_steps import measured_overheads, overhead_text  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)
BENCHMARK_MODELS = (*bench.BENCHMARKS, "gpt2-12")


def _gpt2_12():
    from examples import gpt2 as example_gpt2

    return example_gpt2.build_model(layers=12), example_gpt2.example_inputs(), example_gpt2.loss_fn


def builder(name: str):
    """``name`` -> a function building ``(model, example inputs, loss_fn)``."""
    if name == "gpt2-12":
        return _gpt2_12
    if name.startswith("zoo:"):
        import zoo

        return zoo.BY_NAME[name[4:]].build
    b = bench.BENCHMARKS[name]
    return lambda: (b.build(), b.inputs(), b.loss_fn)


def _timed(call):
    """(result, or the reason there is none: ``"infeasible"`` or ``"time limit"``; CPU seconds)."""
    started = time.process_time()
    try:
        return call(), time.process_time() - started
    except (Infeasible, SolverTimeout) as error:
        # The solvers' limits are wall-clock seconds: on a loaded machine a search can stop with no plan
        # found and none proven impossible ("... in the time limit ..."), which is not infeasibility.
        timed_out = isinstance(error, SolverTimeout) or "time limit" in str(error)
        return ("time limit" if timed_out else "infeasible"), time.process_time() - started


def _step(seconds, unplanned: float) -> str:
    """A predicted step over the unplanned one, or the reason there is none."""
    return seconds if isinstance(seconds, str) else f"{seconds / unplanned - 1:+.1%}"


def _cost(plan):
    """A plan's predicted step seconds, or the reason there is none."""
    return plan if isinstance(plan, str) else plan.outcome.compute_cost


def _status(info) -> str:
    return info.status if info.gap is None else f"{info.status}, gap {info.gap:.1%}"


def _unrestricted(graph, budget: int, unplanned: float, time_limit: float, max_nodes: int) -> tuple[str, str, str]:
    """(orderfree's step, its bound over every schedule, CPU s) as table cells."""
    if graph.number_of_nodes() > max_nodes:
        return f"not run ({graph.number_of_nodes()} nodes)", "", ""
    schedule, seconds = _timed(lambda: solve(graph, budget, method="orderfree", time_limit=time_limit))
    if isinstance(schedule, str):
        return schedule, "", f"{seconds:.1f}"
    bound = schedule.info.lower_bound
    bound_text = "" if bound is None else f"{bound / unplanned - 1:+.1%}"
    return f"{_step(schedule.info.compute_cost, unplanned)} ({_status(schedule.info)})", bound_text, f"{seconds:.1f}"


def run(name: str, fractions, time_limit: float, orderfree_time_limit: float, max_nodes: int,
        rounds: int) -> list[tuple]:
    model, inputs, loss_fn = builder(name)()
    model.train()
    try:
        profile = native_profile(model, inputs, loss_fn=loss_fn)
    except profiler.TraceError as error:
        return [(name, "-", "-", f"untraceable: {str(error).splitlines()[0][:60]}", *[""] * 9)]
    graph = profile.regroup("op").graph
    checkpoint_clock.price(graph, model, inputs, tuple(SAVE_POLICIES))
    candidates = [c for c in candidate_regions(graph) if called_in_forward(model, c)]
    sequentials = sequential_containers(model)
    # The menu the exact method searches: duplicates (a policy that saves what another does) left out.
    choices = len(build_menu(graph, candidates, sequentials, tuple(SAVE_POLICIES), RegionModel(graph)).choices)
    empty = evaluate(graph, ()).outcome
    unplanned = empty.compute_cost
    found = []
    for fraction in fractions:
        budget = int(fraction * empty.peak_bytes)
        heuristic, heuristic_seconds = _timed(lambda b=budget: plan_regions(graph, b, candidates, sequentials))
        exact, exact_seconds = _timed(lambda b=budget: solve_regions_exact(graph, b, candidates, sequentials,
                                                                           time_limit=time_limit))
        unrestricted = _unrestricted(graph, budget, unplanned, orderfree_time_limit, max_nodes)
        found.append((fraction, heuristic, heuristic_seconds, exact, exact_seconds, unrestricted))
        print(name, f"{fraction:.0%}", "exact", _step(_cost(exact), unplanned),
              exact if isinstance(exact, str) else _status(exact.schedule.info), f"{exact_seconds:.1f} CPU s;",
              "orderfree", unrestricted, f"load {os.getloadavg()[0]:.1f}", flush=True)
    measured = _measure(model, inputs, loss_fn, [row[3] for row in found if not isinstance(row[3], str)], rounds)
    rows = []
    for fraction, heuristic, heuristic_seconds, exact, exact_seconds, unrestricted in found:
        status = exact if isinstance(exact, str) else _status(exact.schedule.info)
        regions = None if isinstance(exact, str) else tuple(exact.regions)
        rows.append((name, f"{fraction:.0%}", choices, _step(_cost(heuristic), unplanned), f"{heuristic_seconds:.1f}",
                     _step(_cost(exact), unplanned), f"{exact_seconds:.1f}", status,
                     *unrestricted, measured.get(regions, "")))
    return rows


def _measure(model, inputs, loss_fn, plans, rounds: int) -> dict:
    """Plan regions -> measured overhead text, the plans stepped in turn with eager."""
    configurations = list(dict.fromkeys(tuple(p.regions) for p in plans if p.regions))
    if rounds <= 0 or not configurations:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ratios = measured_overheads(model, inputs, loss_fn, configurations, rounds)
    except Exception as error:  # noqa: BLE001 - a benchmark row says what failed, the run goes on
        return {c: f"not measured: {type(error).__name__}" for c in configurations}
    return {c: overhead_text(r) for c, r in ratios.items()}


HEADER = ("model", "budget", "choices", "heuristic step", "heuristic CPU s", "exact step", "exact CPU s",
          "exact status", "unrestricted step (orderfree)", "unrestricted bound", "orderfree CPU s",
          "exact measured (quartiles)")


def model_names(models: str, zoo_names: str) -> list[str]:
    names = [m for m in models.split(",") if m]
    if zoo_names == "all":
        import zoo

        names += [f"zoo:{case.name}" for case in zoo.CASES]
    elif zoo_names != "none":
        names += [f"zoo:{z}" for z in zoo_names.split(",") if z]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BENCHMARK_MODELS))
    parser.add_argument("--zoo", default="none", help="zoo cases: all, none, or names (benchmarks/zoo.py)")
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per exact solve (the planner's)")
    parser.add_argument("--orderfree-time-limit", type=float, default=20.0)
    parser.add_argument("--orderfree-max-nodes", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per model (0: measure nothing)")
    parser.add_argument("--out")
    args = parser.parse_args()
    names = model_names(args.models, args.zoo)
    if args.zoo not in ("all", "none"):
        import zoo

        unknown = [n for n in names if n.startswith("zoo:") and n[4:] not in zoo.BY_NAME]
        if unknown:
            parser.error(f"unknown zoo case {unknown[0][4:]!r}; known: {', '.join(zoo.BY_NAME)}")
    unknown = [n for n in names if not n.startswith("zoo:") and n not in BENCHMARK_MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(BENCHMARK_MODELS)}")
    torch.set_num_threads(1)
    fractions = [float(f) for f in args.fractions.split(",")]
    started, load = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()[0]
    rows = []
    for name in names:
        rows += run(name, fractions, args.time_limit, args.orderfree_time_limit, args.orderfree_max_nodes,
                    args.rounds)
    ended = datetime.datetime.now(datetime.timezone.utc)
    text = ("# The exact native method against the heuristic and the unrestricted optimum\n\n"
            f"`python benchmarks/native_exact.py {' '.join(sys.argv[1:])}` (see its docstring), "
            f"{started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC, torch {torch.__version__}, one thread, load average "
            f"{load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end. Budget: a fraction of the predicted "
            "un-checkpointed activation peak. Step: predicted step over no checkpointing (the exact plan's with the "
            "checkpoint clock; orderfree's ops only). Measured: CPU time of the exact plan's step over eager's, "
            "paired and interleaved, median (quartiles).\n\n"
            + markdown_table(HEADER, rows) + "\n")
    publish(text, args.out)


if __name__ == "__main__":
    main()
