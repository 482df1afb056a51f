"""Fuzz ``solvers.solve``: every method, small random cost graphs (now and then broken), budgets
and time limits of any type. Every outcome is a schedule that ``simulate`` finds valid within the
budget, or a documented exception: Infeasible (its ``min_budget`` above the budget), InvalidGraph or
ValueError (a bad graph, budget or time limit), TimeoutError. Never another exception.

Run by tests/test_fuzz.py in a fresh interpreter: OR-tools is imported before PuLP, because highspy
(which PuLP imports) and OR-tools each bundle a libhighs.so.1 of another HiGHS version, and the one
loaded second fails. The ilp method runs on PuLP's CBC for the same reason.

    python tests/fuzz_solvers.py
"""

from __future__ import annotations

import math
from collections import Counter

from ortools.sat.python import cp_model  # noqa: F401  (first: see above)

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers import METHODS, Infeasible, InvalidGraph, simulate, solve

OUTCOMES: Counter = Counter()  # (method, outcome) -> examples, printed at the end

JUNK = st.sampled_from(["12", None, -1, float("nan"), float("inf"), 1.5, [], True])


@st.composite
def cost_graphs(draw, max_nodes: int = 6) -> nx.DiGraph:
    """Small DAGs with int or str node ids, outputs on some sinks, optional workspace and pinned
    nodes, and now and then a broken attribute or a cycle (InvalidGraph is then the answer)."""
    n = draw(st.integers(1, max_nodes))
    names = draw(st.sampled_from(["int", "str"]))
    ids = [v if names == "int" else f"n{v}" for v in range(n)]
    graph = nx.DiGraph()
    for v in ids:
        graph.add_node(v, cost=draw(st.floats(0, 10, allow_nan=False)), mem=draw(st.integers(0, 20)))
        if draw(st.booleans()):
            graph.nodes[v]["workspace"] = draw(st.integers(0, 10))
    for j in range(1, n):
        for i in range(j):
            if draw(st.integers(0, 2)) == 0:
                graph.add_edge(ids[i], ids[j])
    for v in ids:
        if graph.out_degree(v) == 0 and draw(st.integers(0, 2)) > 0:
            graph.nodes[v]["output"] = True
            if draw(st.integers(0, 4)) == 0:
                graph.nodes[v]["pinned"] = True
    if draw(st.integers(0, 9)) == 0:  # a broken attribute
        graph.nodes[draw(st.sampled_from(ids))][draw(st.sampled_from(["cost", "mem", "workspace", "output"]))] = draw(JUNK)
    if n > 1 and draw(st.integers(0, 11)) == 0:  # a cycle
        graph.add_edge(ids[-1], ids[0])
    return graph


JUNK_BUDGETS = st.one_of(st.floats(-1, 120), st.integers(-3, -1),
                         st.sampled_from(["12", "", None, True, float("nan"), float("inf"), [5]]))
TIME_LIMITS = st.sampled_from([None, 2.0, 2.0, 2.0, 2.0, 2.0, 0, -1.0, "1", float("nan")])


def _store_all_peak(graph) -> int:
    from solvers.store_all import store_all_schedule

    try:
        return simulate(graph, store_all_schedule(graph)).peak_bytes
    except Exception:  # a broken graph: solve() must say so; any budget will do
        return 50


@st.composite
def budgets(draw, graph) -> object:
    """Around the graph's own scale: enough for store-all, anything up to it, or junk."""
    peak = _store_all_peak(graph)
    kind = draw(st.sampled_from(["enough", "up to store-all", "up to store-all", "junk"]))
    if kind == "enough":
        return peak + draw(st.integers(0, 5))
    if kind == "junk":
        return draw(JUNK_BUDGETS)
    return draw(st.integers(0, peak))


@st.composite
def cases(draw):
    graph = draw(cost_graphs())
    return graph, draw(budgets(graph))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def check_solve(case, method: str, time_limit) -> None:
    graph, budget = case
    options = {"backend": "cbc"} if method == "ilp" else {}
    try:
        schedule = solve(graph, budget, method=method, time_limit=time_limit, **options)
    except Infeasible as error:
        OUTCOMES[method, "Infeasible"] += 1
        assert _is_number(budget)
        assert error.min_budget is None or error.min_budget > int(budget), (error.min_budget, budget)
        if error.min_budget is not None:  # SPEC: the smallest budget the method can meet
            at_minimum = solve(graph, error.min_budget, method=method, time_limit=time_limit, **options)
            assert simulate(graph, at_minimum).peak_bytes <= error.min_budget
        return
    except (InvalidGraph, ValueError, TimeoutError) as error:
        OUTCOMES[method, type(error).__name__] += 1
        return
    OUTCOMES[method, "schedule"] += 1
    assert _is_number(budget), f"{method} accepted the budget {budget!r}"
    outcome = simulate(graph, schedule)
    assert outcome.valid, outcome.error
    assert outcome.peak_bytes <= budget


def fuzz_solve(method: str, examples: int = 60) -> None:
    """Hypothesis on one method (one run each, so that every method gets its share of examples)."""
    run = settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                   derandomize=True, database=None)(given(cases(), TIME_LIMITS)(
        lambda case, time_limit: check_solve(case, method, time_limit)))
    run()


if __name__ == "__main__":
    import solvers.cpsat

    assert solvers.cpsat.cp_model is not None, "OR-tools did not load: cpsat would not be fuzzed"
    for method in sorted(METHODS):
        fuzz_solve(method)
    assert {m for m, outcome in OUTCOMES if outcome == "schedule"} == set(METHODS)
    for (method, outcome), count in sorted(OUTCOMES.items()):  # each method gets real schedules too
        if outcome == "schedule":
            assert count >= 5, f"{method}: only {count} examples solved"
    for (method, outcome), count in sorted(OUTCOMES.items()):
        print(f"{method:12} {outcome:12} {count}")
    print("methods: " + ", ".join(sorted(METHODS)))
