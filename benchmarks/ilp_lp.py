"""Checkmate's LP relaxation and its two-phase rounding (Jain et al., MLSys 2020, section 5) on the
solver benchmark's training graphs: model size, build and LP seconds (wall and CPU), the best
rounded schedule against the LP value and against the order-free bound.

    python benchmarks/ilp_lp.py --graphs chain-101,chain-301 [--orderfree 30] [--log] [--out FILE]

Graphs are ``chain-N`` and ``skips-N`` (N = 2 L + 1 nodes), built as benchmarks/solvers.py builds
them; the budget is the benchmark's: halfway between the least peak chen-greedy, dp and revolve reach
and the store-all peak. Costs are printed as compute time over computing every node once. ``--out``
writes the table (Markdown, with the command, the time and the load average) to FILE, through a
temporary file. docs/solvers-lp.md quotes the runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import resource
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The project's packages and the tests' graph builders; not this folder first: benchmarks/solvers.py
# would shadow the solvers package.
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from graphs import training_graph  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from solvers import simulate  # noqa: E402
from solvers.clock import Clock  # noqa: E402
from solvers.graph import node_costs  # noqa: E402
from solvers.ilp import Scales, build_model, first_computation_order, lp_rounding, warm_start_candidates  # noqa: E402
from solvers.orderfree import order_free_bound  # noqa: E402
from solvers.store_all import store_all_schedule  # noqa: E402

COLUMNS = ["graph", "nodes", "budget (of store-all)", "columns", "build", "LP (simplex)", "best rounding",
           "LP value", "gap to the LP", "order-free bound", "wall (CPU)", "max RSS"]


def _benchmark_module():
    """benchmarks/solvers.py, loaded by path (its name shadows the solvers package)."""
    spec = importlib.util.spec_from_file_location("solver_benchmark", os.path.join(HERE, "solvers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph(name: str):
    kind, nodes = name.split("-")
    layers = (int(nodes) - 1) // 2
    return training_graph(layers, seed=layers, skips=max(2, layers // 5) if kind == "skips" else 0)


def _with_log(enabled: bool) -> None:
    """HiGHS's log on stdout: its dual simplex objective is a bound at every iteration."""
    if not enabled:
        return
    from solvers.ilp import backends

    plain = backends.load_highs

    def load_with_log(model, relax):
        highs = plain(model, relax)
        highs.setOptionValue("output_flag", True)
        return highs

    backends.load_highs = load_with_log


def measure(name: str, time_limit: float, orderfree_seconds: float, least_budget) -> dict:
    """One graph: build Checkmate's model in the cheapest warm start's order, solve its LP, round."""
    graph = _graph(name)
    top = simulate(graph, store_all_schedule(graph)).peak_bytes
    once = sum(d["cost"] for _, d in graph.nodes(data=True))
    budget = (least_budget(graph, ["chen-greedy", "dp", "revolve"]) + top) // 2
    starts = warm_start_candidates(graph, budget, Clock(None))
    order = next((o for o in (first_computation_order(graph, c.schedule) for c in starts) if o), None)
    costs = node_costs(graph, order)
    print(f"{name}: budget {budget} of {top} bytes ({budget / top:.0%}); cheapest warm start "
          f"{starts[0].source} {starts[0].cost / once - 1:+.2%}", flush=True)
    row = {"graph": name, "nodes": graph.number_of_nodes(), "budget (of store-all)": f"{budget / top:.0%}"}
    wall, cpu = time.perf_counter(), time.process_time()
    model = build_model(costs, budget, Scales.of(costs))
    row["columns"] = f"{model.num_cols:,}"
    row["build"] = f"{time.perf_counter() - wall:.1f} s"
    print(f"  {model.num_cols:,} columns, {model.num_rows:,} rows, {model.num_nonzeros:,} nonzeros: built in "
          f"{row['build']} (CPU {time.process_time() - cpu:.1f} s)", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    rounded = lp_rounding(model, graph, budget, "highs", Clock(time_limit), None, 48, random.Random(0))
    for fraction, lp_seconds, value, rounding_seconds in rounded.steps:
        shown = "none" if value is None else f"{value / once - 1:+.2%}"
        print(f"  LP at {fraction:g} x budget: {lp_seconds:.1f} s, value {shown}; roundings {rounding_seconds:.1f} s",
              flush=True)
    best, bound = rounded.best, rounded.lower_bound
    row["LP (simplex)"] = f"{rounded.steps[0][1]:.1f} s" if rounded.steps else "not solved"
    row["best rounding"] = "none" if best is None else f"{best.cost / once - 1:+.2%}"
    row["LP value"] = "none" if bound is None else f"{bound / once - 1:+.2%}"
    row["gap to the LP"] = "none" if best is None or bound is None else f"{(best.cost - bound) / best.cost:.2%}"
    row["wall (CPU)"] = f"{time.perf_counter() - wall:.1f} s ({time.process_time() - cpu:.1f} s)"
    row["max RSS"] = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
    print(f"  best rounding {row['best rounding']}; LP bound {row['LP value']}; gap {row['gap to the LP']}; "
          f"{rounded.tried} roundings; {row['wall (CPU)']}; max RSS {row['max RSS']}", flush=True)
    row["order-free bound"] = ""
    if orderfree_seconds:
        wall = time.perf_counter()
        free = order_free_bound(graph, budget, orderfree_seconds, costs=costs)
        row["order-free bound"] = f"{free / once - 1:+.2%}"
        print(f"  order-free bound {row['order-free bound']} ({time.perf_counter() - wall:.1f} s)", flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="chain-101,skips-101", help="chain-N / skips-N, comma-separated")
    parser.add_argument("--time-limit", type=float, default=3000.0, help="seconds for the LPs and roundings")
    parser.add_argument("--orderfree", type=float, default=0.0, help="seconds for the order-free bound (0: not run)")
    parser.add_argument("--log", action="store_true", help="HiGHS's log on stdout")
    parser.add_argument("--out", default="", help="write the table to this Markdown file")
    args = parser.parse_args(argv)
    _with_log(args.log)
    least_budget = _benchmark_module().least_budget
    started, load = datetime.now(timezone.utc), os.getloadavg()[0]
    rows = [measure(name, args.time_limit, args.orderfree, least_budget) for name in args.graphs.split(",")]
    text = table(rows)
    print(text)
    if args.out:
        command = "python benchmarks/ilp_lp.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_atomic(args.out, f"`{command}`, started {started:%Y-%m-%d %H:%M} UTC, load average "
                               f"{load:.1f} at the start ({os.cpu_count()} cores)\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
