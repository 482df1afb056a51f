"""How far dp's plans are from the optimum on Checkmate's linear training graphs, and why.

    python benchmarks/dp_gap.py [--layers 10] [--time-limit 30] [--out docs/benchmarks/dp-gap.md]

On these graphs the order of first computations is forced, so ilp's proven optimum is the true one.
dp plans in rotor's chain model, whose backward B_i reads stage i's input x_i as a real layer's
backward does; in Checkmate's graph the backward of layer i reads only the layer's output. The
"+ input edge" rows add that read (node i-1 -> node 2L-i), so that the graph needs what the chain
model holds: what remains of the gap there is not that mismatch. Each row is dp's cost over the
optimum minus one, at budgets from 35% to 85% of the un-checkpointed peak (blank: a method found
no schedule); the run stops if ilp does not prove an optimum.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from graphs import training_graph  # noqa: E402  (the test suite's generators)
from planner.files import write_atomic  # noqa: E402
from solvers import Infeasible, simulate, solve  # noqa: E402
from solvers.store_all import store_all_schedule  # noqa: E402

FRACTIONS = (0.35, 0.45, 0.55, 0.65, 0.75, 0.85)


def with_input_edges(graph, layers: int):
    """The same graph with the backward of layer i also reading layer i's input (node i-1)."""
    graph = graph.copy()
    for i in range(1, layers):
        graph.add_edge(i - 1, 2 * layers - i)
    return graph


def cost_or_none(graph, budget: int, method: str, time_limit: float) -> float | None:
    try:
        schedule = solve(graph, budget, method=method, time_limit=time_limit)
    except Infeasible:
        return None
    if method == "ilp" and schedule.info.status != "optimal":
        raise SystemExit(f"ilp did not prove its optimum at {budget} bytes in {time_limit} s: raise --time-limit")
    return simulate(graph, schedule).compute_cost


def gaps(graph, time_limit: float) -> list[str]:
    top = simulate(graph, store_all_schedule(graph)).peak_bytes
    cells = []
    for fraction in FRACTIONS:
        budget = int(top * fraction)
        dp = cost_or_none(graph, budget, "dp", time_limit)
        optimum = cost_or_none(graph, budget, "ilp", time_limit)
        cells.append(f"{dp / optimum - 1:+.1%}" if dp and optimum else "")
    return cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "dp-gap.md"))
    parser.add_argument("--schedules", type=float, metavar="FRACTION",
                        help="instead: print dp's and ilp's computations on the unit graph with input edges "
                             "at this fraction of its un-checkpointed peak")
    args = parser.parse_args(argv)
    layers = args.layers
    if args.schedules is not None:
        graph = with_input_edges(training_graph(layers, unit=True), layers)
        budget = int(simulate(graph, store_all_schedule(graph)).peak_bytes * args.schedules)
        for method in ("dp", "ilp"):
            schedule = solve(graph, budget, method=method, time_limit=args.time_limit)
            computes = " ".join(str(node) for kind, node in schedule.steps if kind == "compute")
            print(f"{method} (budget {budget}, cost {simulate(graph, schedule).compute_cost:g}): {computes}")
        return 0
    graphs = {
        "unit costs and sizes": training_graph(layers, unit=True),
        "random costs and sizes": training_graph(layers, seed=layers),
    }
    graphs.update({f"{name}, + input edge": with_input_edges(graph, layers) for name, graph in list(graphs.items())})
    lines = [
        "| graph | " + " | ".join(f"{fraction:.0%}" for fraction in FRACTIONS) + " |",
        "|---|" + "---|" * len(FRACTIONS),
    ]
    print("\n".join(lines), flush=True)
    for name, graph in graphs.items():
        line = f"| {name} | " + " | ".join(gaps(graph, args.time_limit)) + " |"
        lines.append(line)
        print(line, flush=True)
    text = (f"dp's cost over the optimum (ilp, proven) on Checkmate's linear training graph of {layers} layers, "
            f"by budget (of the un-checkpointed peak); `python benchmarks/dp_gap.py --layers {layers}`.\n\n"
            + "\n".join(lines) + "\n")
    write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
