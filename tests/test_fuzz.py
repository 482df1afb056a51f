"""Fuzzing the entry points that take what a user (or a file) gives them.

Every outcome must be a valid result or a documented exception, never another one:

- ``planner.parse_budget``: a Budget, or BudgetError (a ValueError).
- ``solvers.solve`` (every method, small graphs so that ilp and cpsat stay fast, budgets of any
  type): for an input this file checks is junk (a bad graph, budget or time limit), InvalidGraph
  or ValueError; for a valid one, a schedule that ``simulate`` finds valid within the budget,
  Infeasible (whose ``min_budget`` is above the budget) or TimeoutError.
- ``solvers.simulate`` (any step list): a Simulation, valid or saying why not; never an exception.
- ``planner.load`` (a plan file with one value replaced by junk): a Plan, or PlanFileError.

``solve`` runs one hypothesis search per method, so that each gets its share of examples.
"""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from solvers import METHODS, Infeasible, InvalidGraph, Schedule, simulate, solve

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=True)

# -- budgets --------------------------------------------------------------------------------------------
UNITS = ["", "B", "b", "kB", "KiB", "MB", "MiB", "GB", "GiB", "gib", "TB", "TiB", "%", "XB", "G B", "KB"]
NUMBERS = st.one_of(st.integers(-5, 10**6).map(str), st.floats(-5, 1e6, allow_nan=False).map(lambda f: f"{f:g}"),
                    st.sampled_from(["", ".5", "1.", "1e3", "nan", "inf", "-0", "0x10", "1_000"]))
BUDGET_TEXT = st.builds(lambda pad, number, unit: f"{pad}{number}{unit}{pad}", st.sampled_from(["", " "]), NUMBERS,
                        st.sampled_from(UNITS))
ANY_BUDGET = st.one_of(BUDGET_TEXT, st.text(max_size=12), st.integers(), st.floats(), st.none(), st.booleans(),
                       st.binary(max_size=4), st.lists(st.integers(), max_size=2))


@settings(max_examples=200, **SETTINGS)
@given(ANY_BUDGET)
def test_parse_budget_gives_a_budget_or_a_budget_error(value):
    try:
        budget = planner.parse_budget(value)
    except planner.BudgetError as error:
        assert isinstance(error, ValueError) and str(error)
        return
    if budget.percent is not None:
        assert budget.bytes is None and 0 < budget.percent <= 100
        assert isinstance(value, str) and value.strip().endswith("%")
    else:
        assert isinstance(budget.bytes, int) and not isinstance(budget.bytes, bool) and budget.bytes > 0
    assert str(budget)


@settings(max_examples=200, **SETTINGS)
@given(st.decimals(min_value="0.001", max_value="100000", places=3), st.sampled_from(["kB", "KiB", "MB", "MiB", "GB", "GiB"]))
def test_parse_budget_values(number, unit):
    scale = {"kB": 10**3, "KiB": 2**10, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}[unit]
    expected = int(round(float(number) * scale))
    if expected <= 0:
        with pytest.raises(planner.BudgetError):
            planner.parse_budget(f"{number}{unit}")
    else:
        assert planner.parse_budget(f"{number}{unit}").bytes == expected


# -- solve ----------------------------------------------------------------------------------------------------
JUNK = st.sampled_from(["12", None, -1, float("nan"), float("inf"), 1.5, [], True])
# Seconds as a profiler measures them: 0, or at least a nanosecond. (Costs near the smallest float,
# 5e-324, overflow cpsat's recompute bound, spare / cost.)
COSTS = st.one_of(st.just(0.0), st.floats(1e-9, 10))


@st.composite
def cost_graphs(draw, max_nodes: int = 6) -> nx.DiGraph:
    """Small DAGs with int or str node ids, outputs on some sinks, optional workspace and pinned
    nodes, and now and then a broken attribute or a cycle (InvalidGraph is then the answer)."""
    n = draw(st.integers(1, max_nodes))
    names = draw(st.sampled_from(["int", "str"]))
    ids = [v if names == "int" else f"n{v}" for v in range(n)]
    graph = nx.DiGraph()
    for v in ids:
        graph.add_node(v, cost=draw(COSTS), mem=draw(st.integers(0, 20)))
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
        peak = simulate(graph, store_all_schedule(graph)).peak_bytes
    except Exception:  # a broken graph: solve() must say so; any budget will do
        return 50
    return peak if isinstance(peak, int) else 50  # junk sizes (inf, floats): likewise


@st.composite
def budgets(draw, graph) -> object:
    """Around the graph's own scale: enough for store-all, anything up to it, or junk."""
    peak = _store_all_peak(graph)
    kind = draw(st.sampled_from(["enough", "enough", "up to store-all", "up to store-all", "junk"]))
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


def junk_in(graph, budget, time_limit) -> str | None:
    """What in an input breaks the contract of ``solve()`` (docs/costgraph.md, docs/contract.md),
    checked here without the solvers' own validation: the reason, or ``None`` when it is valid."""
    for node, data in graph.nodes(data=True):
        for name, whole in (("cost", False), ("mem", True), ("workspace", True)):
            value = data.get(name, 0)
            if not _is_number(value) or (whole and value != int(value)):
                return f"node {node!r}: {name} {value!r}"
        for flag in ("output", "pinned"):
            if not isinstance(data.get(flag, False), bool):
                return f"node {node!r}: {flag} {data[flag]!r}"
    if not nx.is_directed_acyclic_graph(graph):
        return "a cycle"
    if not _is_number(budget):
        return f"budget {budget!r}"
    if time_limit is not None and not (_is_number(time_limit) and time_limit > 0):
        return f"time limit {time_limit!r}"
    return None


def solve_once(method: str, graph, budget, time_limit) -> bool:
    """One fuzzed call: junk refused with InvalidGraph/ValueError, a valid input answered with a
    schedule within the budget, Infeasible (with a minimum the method then meets) or a timeout.
    Returns whether a schedule came back."""
    junk = junk_in(graph, budget, time_limit)
    try:
        schedule = solve(graph, budget, method=method, time_limit=time_limit)
    except (InvalidGraph, ValueError) as error:
        assert junk is not None, f"{method} refused a valid input: {error!r}"
        return False
    except Infeasible as error:
        assert junk is None, f"{method} answered Infeasible to junk ({junk})"
        assert error.min_budget is None or error.min_budget > int(budget), (error.min_budget, budget)
        if error.min_budget is not None:  # the contract: the smallest budget the method can meet
            at_minimum = solve(graph, error.min_budget, method=method, time_limit=time_limit)
            assert simulate(graph, at_minimum).peak_bytes <= error.min_budget
        return False
    except TimeoutError:
        assert junk is None, f"{method} timed out on junk ({junk})"
        return False
    assert junk is None, f"{method} accepted junk ({junk})"
    outcome = simulate(graph, schedule)
    assert outcome.valid, outcome.error
    assert outcome.peak_bytes <= budget
    return True


@pytest.mark.parametrize("method", sorted(METHODS))
def test_solve_gives_a_valid_schedule_within_budget_or_a_documented_error(method):
    solved = []

    @settings(max_examples=60, **SETTINGS)
    @given(case=cases(), time_limit=TIME_LIMITS)
    def fuzz(case, time_limit):
        graph, budget = case
        solved.append(solve_once(method, graph, budget, time_limit))

    fuzz()
    # Junk is much of what the strategies draw; the method must also have met real budgets.
    assert sum(solved) >= 3, f"{method} returned {sum(solved)} schedules in {len(solved)} examples"


# -- simulate -------------------------------------------------------------------------------------------------
def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for v, (cost, mem) in enumerate([(1.0, 3), (2.0, 1), (1.0, 4), (0.5, 2)]):
        graph.add_node(f"v{v}", cost=cost, mem=mem)
    graph.add_edges_from([("v0", "v1"), ("v0", "v2"), ("v1", "v3"), ("v2", "v3")])
    graph.nodes["v3"]["output"] = True
    graph.nodes["v2"]["pinned"] = True
    graph.nodes["v2"]["output"] = True
    return graph


NODES = st.one_of(st.sampled_from(["v0", "v1", "v2", "v3"]), st.sampled_from(["ghost", None, 3, ("v0",), ["v0"], {}]))
STEPS = st.one_of(
    st.tuples(st.sampled_from(["compute", "compute", "free"]), NODES),
    st.tuples(st.sampled_from(["recompute", "", None, 0]), NODES),
    st.lists(st.sampled_from(["compute", "v0", "free"]), max_size=3),
    st.integers(), st.none(), st.text(max_size=3), st.just({"compute": "v0"}),
)


@settings(max_examples=200, **SETTINGS)
@given(st.lists(STEPS, max_size=14))
def test_simulate_answers_any_step_list(steps):
    graph = _graph()
    outcome = simulate(graph, steps)
    assert isinstance(outcome.valid, bool) and outcome.peak_bytes >= 0 and outcome.compute_cost >= 0
    if not outcome.valid:
        assert outcome.error
        return
    # valid: every node computed, the outputs held at the end, the peak at least the largest node
    computed = {node for kind, node in steps if kind == "compute"}
    assert computed == set(graph.nodes)
    assert outcome.peak_bytes >= max(graph.nodes[v]["mem"] for v in graph.nodes)


@settings(max_examples=200, **SETTINGS)
@given(st.lists(STEPS, max_size=6))
def test_a_schedule_is_built_from_steps_or_refused(steps):
    try:
        schedule = Schedule(steps)
    except ValueError:
        return
    assert all(kind in ("compute", "free") for kind, _ in schedule)


# -- plan files -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plan = planner.plan(model, (torch.randn(4, 8),), budget="100%", solver="store-all")
    return plan.to_dict()


def _paths(value, prefix=()):
    """Every position in a JSON document: the paths of its dict values and list items."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:6]):
            yield from _paths(item, (*prefix, index))


def _replaced(data, path, junk):
    if not path:
        return junk
    copy = json.loads(json.dumps(data))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = junk
    return copy


PLAN_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False), st.text(max_size=4),
                      st.sampled_from([[], {}, [["compute", "loss"]], "float32", "loss", 1e300, -0.0]))


@settings(max_examples=100, **SETTINGS)
@given(st.data())
def test_a_plan_file_with_junk_anywhere_loads_or_is_refused(plan_data, tmp_path_factory, data):
    paths = list(_paths(plan_data))
    path = data.draw(st.sampled_from(paths))
    junk = data.draw(PLAN_JUNK)
    file = tmp_path_factory.mktemp("fuzz") / "plan.json"
    file.write_text(json.dumps(_replaced(plan_data, path, junk)))
    try:
        loaded = planner.load(file)
    except planner.PlanFileError as error:
        assert str(file) in str(error)
        return
    assert simulate(loaded.graph, loaded.schedule).valid
