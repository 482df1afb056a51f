"""Solve time and proven gap of every method, on graphs from ~20 to ~1000 nodes.

    python benchmarks/solvers.py [--time-limit 60] [--large-time-limit 300] [--out docs/benchmarks/solvers-run.md]

Graphs: Checkmate's linear training graphs ("chain", forward L layers, loss, backward L layers, the
backward of layer i reading its activation) and the same with forward skip connections and their
backward mirrors ("skips"), with random costs and sizes (tests/graphs.py), plus the module-level
cost graphs of a 12-layer GPT-2, a U-Net and a residual MLP profiled on this machine
(benchmarks/graphs/, made by benchmarks/make_graphs.py), among them Checkmate's MLSys CNNs (VGG16,
VGG19, FCN-8s, SegNet, a VGG U-Net; benchmarks/mlsys_models.py). Each is solved at a budget halfway
between the least budget any method reached and the un-checkpointed peak; `--budget-points 0.5,0.2`
solves each at every such point instead (0.2: a fifth of the way from the least budget to the peak),
and `--least-of chen-greedy,dp,revolve,ilp` takes the least budget also from ilp's proven minimum of
Checkmate's model (the fast methods alone reach only the store-all peak on VGG16 and VGG19); the
"certified by" column names the bound each gap is to. The searching solvers (ilp, cpsat) get
--time-limit seconds, --large-time-limit above 500 nodes; ilp runs its LP rounding above
--ilp-exact-max-nodes (150; its exact model grows as n^2). `--methods ...,ilp@cpsat-order` adds
cpsat followed by ilp warm-started from cpsat's schedule (each with the whole limit): the MILP then
fixes cpsat's order of first computations, and its gap says how far cpsat's schedule is from the
best schedule with that order. Prints the table and writes it (Markdown, with the command that made
it) to --out, a file of its own (default docs/benchmarks/solvers-run.md, overwritten by each run):
docs/solvers-benchmark.md is written by hand from such runs and is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from graphs import training_graph  # noqa: E402  (the test suite's generators)
from planner.files import write_atomic  # noqa: E402
from planner.planfile import graph_from_dict  # noqa: E402
from solvers import Infeasible, simulate, solve  # noqa: E402
from solvers.store_all import store_all_schedule  # noqa: E402

METHODS = ["chen-sqrtn", "chen-greedy", "revolve", "dp", "ilp", "cpsat", "orderfree", "hierarchical"]
# Not in the default run: cpsat, then ilp warm-started from cpsat's schedule, which fixes the MILP's
# order of first computations to cpsat's. Its gap is measured in that order only (it bounds no other
# order), so it says how far cpsat's schedule is from the best with the same order.
ILP_AFTER_CPSAT = "ilp@cpsat-order"
ILP_EXACT_MAX_NODES = 150
# The methods whose least reachable budget (Infeasible.min_budget at budget 0) is the least budget.
FAST_LEAST = ("chen-greedy", "dp", "revolve")
# Seconds a slower method (ilp: the MILP minimising the peak) gets to prove its least budget; the
# 80-node FCN-8s graph took 43 s.
LEAST_SECONDS = 120.0


def synthetic_graphs():
    for layers in (10, 25, 50, 100, 250, 500):
        yield f"chain-{2 * layers + 1}", training_graph(layers, seed=layers)
    for layers in (10, 25, 50, 100, 250, 500):
        yield f"skips-{2 * layers + 1}", training_graph(layers, seed=layers, skips=max(2, layers // 5))


def profiled_graphs():
    folder = os.path.join(HERE, "graphs")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as file:
                yield name[:-5], graph_from_dict(json.load(file))


def least_budget(graph, methods, seconds: float = LEAST_SECONDS) -> int:
    """The least budget (bytes) any of ``methods`` reaches (their Infeasible.min_budget at budget 0).

    Methods other than the fast ones get ``seconds``; one that does not prove its minimum in that
    time (SolverTimeout) is left out."""
    least = simulate(graph, store_all_schedule(graph)).peak_bytes
    for method in methods:
        options = {} if method in FAST_LEAST else {"time_limit": seconds}
        try:
            solve(graph, 0, method=method, **options)
        except Infeasible as error:
            if error.min_budget is not None:
                least = min(least, int(error.min_budget))
        except TimeoutError:
            continue
    return least


def budget_at(least: int, top: int, point: float) -> int:
    """The budget (bytes) ``point`` of the way from ``least`` to ``top`` (0.5: halfway)."""
    return least + int(point * (top - least))


def run(graph, budget: int, method: str, limit: float, ilp_exact_max_nodes: int = ILP_EXACT_MAX_NODES) -> dict:
    options = {}
    if method in ("ilp", ILP_AFTER_CPSAT) and graph.number_of_nodes() > ilp_exact_max_nodes:
        options["mode"] = "lp-rounding"
    started = time.perf_counter()
    try:
        if method == ILP_AFTER_CPSAT:  # each solver gets the whole limit
            options["warm_starts"] = [solve(graph, budget, method="cpsat", time_limit=limit)]
        schedule = solve(graph, budget, method="ilp" if method == ILP_AFTER_CPSAT else method,
                         time_limit=limit, **options)
    except Infeasible as error:
        return {"status": "infeasible", "seconds": time.perf_counter() - started, "min_budget": error.min_budget}
    except (TimeoutError, ValueError) as error:
        return {"status": f"failed: {str(error)[:60]}", "seconds": time.perf_counter() - started}
    outcome = simulate(graph, schedule)
    info = schedule.info
    return {
        "bound": certifier(method, schedule, "mode" in options),
        "status": info.status + (" (lp-rounding)" if "mode" in options else ""),
        "seconds": time.perf_counter() - started,
        "overhead": outcome.overhead,
        "gap": info.gap,
        "lower_bound_overhead": (info.lower_bound / outcome.total_cost - 1) if info.lower_bound else None,
        "peak": outcome.peak_bytes,
    }


def certifier(method: str, schedule, lp_rounding: bool = False) -> str:
    """Which lower bound the schedule's gap is to: the method's own, or for auto the one its message
    names (solvers/auto.py)."""
    info = schedule.info
    if info.lower_bound is None and info.status != "optimal":
        return ""
    if method == "auto":  # "...; proven optimal by W; ..." or "...; within 0.52% of W (12.3 s); ..."
        found = re.search(r"(?:proven optimal by|within [\d.]+% of) ([^;(]+)", info.message)
        return found.group(1).strip() if found else "?"
    if method in ("ilp", ILP_AFTER_CPSAT):  # the exact MILP's gap is to solvers.bounds' bound over every order
        return "LP (its order)" if lp_rounding else "cost_lower_bound (every order)"
    return {"orderfree": "order-free relaxation", "hierarchical": "order-free relaxation"}.get(method, method)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--large-time-limit", type=float, default=300.0)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--only", default="", help="comma-separated graph names (default: all)")
    parser.add_argument("--budget-points", default="0.5",
                        help="comma-separated points between the least budget (0) and the store-all peak (1): "
                             "one budget per point and graph (default 0.5, halfway)")
    parser.add_argument("--least-of", default=",".join(FAST_LEAST),
                        help="methods whose least reachable budget is the least budget (default the fast ones; "
                             f"add ilp for Checkmate's proven minimum, {LEAST_SECONDS:g} s at most)")
    parser.add_argument("--ilp-exact-max-nodes", type=int, default=ILP_EXACT_MAX_NODES,
                        help="ilp (and ilp@cpsat-order) solve the exact MILP up to this many nodes, LP rounding above")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "solvers-run.md"),
                        help="the Markdown file this run writes, whole (not docs/solvers-benchmark.md, written by hand)")
    parser.add_argument("--verbose", action="store_true",
                        help="log the solvers' steps (model sizes, LP and MILP times) to stderr")
    args = parser.parse_args(argv)
    if os.path.abspath(args.out) == os.path.join(ROOT, "docs", "solvers-benchmark.md"):
        parser.error("docs/solvers-benchmark.md is written by hand from runs of this script; "
                     "give --out another file (default docs/benchmarks/solvers-run.md)")
    if args.verbose:
        logging.basicConfig(format="%(asctime)s %(message)s", level=logging.WARNING)
        logging.getLogger("solvers").setLevel(logging.DEBUG)
    methods = args.methods.split(",")
    points = [float(point) for point in args.budget_points.split(",")]
    if any(not 0 <= point <= 1 for point in points):
        parser.error("--budget-points are between 0 (the least budget) and 1 (the store-all peak)")
    lines = [
        "| graph | nodes | budget (of un-checkpointed) | method | overhead | solve time | status | proven gap "
        "| certified by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name, graph in [*synthetic_graphs(), *profiled_graphs()]:
        if args.only and name not in args.only.split(","):
            continue
        n = graph.number_of_nodes()
        top = simulate(graph, store_all_schedule(graph)).peak_bytes
        least = least_budget(graph, args.least_of.split(","))
        limit = args.large_time_limit if n > 500 else args.time_limit
        for point in points:
            budget = budget_at(least, top, point)
            shown = f"{budget / top:.0%}" if points == [0.5] else f"{budget / top:.0%} (point {point:g})"
            for method in methods:
                result = run(graph, budget, method, limit, args.ilp_exact_max_nodes)
                overhead = f"{result['overhead']:+.1%}" if "overhead" in result else ""
                gap = f"{result['gap']:.1%}" if result.get("gap") is not None else ""
                status = result["status"]
                if status == "infeasible" and result.get("min_budget"):
                    status += f" (min {result['min_budget'] / top:.0%})"
                line = (f"| {name} | {n} | {shown} | {method} | {overhead} | {result['seconds']:.1f} s "
                        f"| {status} | {gap} | {result.get('bound', '')} |")
                lines.append(line)
                print(line, flush=True)
    command = "python benchmarks/solvers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (
        f"Solver benchmark (`{command.strip()}`, time limit {args.time_limit:g} s, "
        f"{args.large_time_limit:g} s above 500 nodes; {os.cpu_count()} CPUs, load average {load:.1f} at the end; "
        f"finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Overhead is the schedule's compute "
        "time over the un-checkpointed step's; the proven gap is the solver's own, between its schedule "
        "and its lower bound. Written by the script; docs/solvers-benchmark.md is the hand-written page.\n\n"
        + "\n".join(lines) + "\n"
    )
    write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
