"""The ``ilp`` method: Checkmate's MILP (solvers/ilp/).

Ground truth: Checkmate's published optima for the linear training graph (docs/algorithms.md), the
exhaustive search (solvers/exhaustive.py) on small graphs, and the simulator for every schedule.
"""

from __future__ import annotations

import importlib.util
import random

import networkx as nx
import pytest
from signals import default_sigint

from graphs import CHECKMATE_LINEAR_OPTIMA as KNOWN_OPTIMA
from graphs import chain, parameter_gradient_graph, random_dag, training_graph, trap_graph
from solvers import Infeasible, Schedule, SolverUnavailable, simulate, solve
from solvers.errors import SolverTimeout
from solvers import ilp
from solvers.clock import Clock
from solvers.exhaustive import min_cost_schedule, min_peak
from solvers.graph import node_costs
from solvers.store_all import store_all_schedule



def check(graph, schedule, budget):
    """The schedule is valid and within budget; returns its simulated compute cost."""
    outcome = simulate(graph, schedule)
    assert outcome.valid, outcome.error
    assert outcome.peak_bytes <= budget, (outcome.peak_bytes, budget)
    return outcome.compute_cost


def store_all_peak(graph) -> int:
    return simulate(graph, store_all_schedule(graph)).peak_bytes


def with_extras(graph, seed: int):
    """Add the docs/costgraph.md extensions: workspace on some nodes, one pinned node."""
    rng = random.Random(seed)
    for node in graph.nodes:
        if rng.random() < 0.4:
            graph.nodes[node]["workspace"] = rng.randint(1, 3)
    candidates = [node for node in graph.nodes if graph.out_degree(node) > 0]
    graph.nodes[rng.choice(candidates)]["pinned"] = True
    return graph


# ---- Checkmate's known optima ----------------------------------------------------------------


@pytest.mark.parametrize("layers", sorted(KNOWN_OPTIMA))
def test_linear_training_graph_known_optima(layers):
    graph = training_graph(layers, unit=True)
    for budget, optimum in KNOWN_OPTIMA[layers].items():
        schedule = solve(graph, budget, method="ilp")
        assert check(graph, schedule, budget) == optimum, budget
        assert schedule.info.status == "optimal"
        assert schedule.info.gap == 0.0
        assert schedule.info.lower_bound == pytest.approx(optimum)
    with pytest.raises(Infeasible) as caught:
        solve(graph, 2, method="ilp")
    assert caught.value.min_budget == 3  # the smallest budget with a known optimum


def test_exhaustive_agrees_with_known_optima_l4():
    graph = training_graph(4, unit=True)
    for budget, optimum in KNOWN_OPTIMA[4].items():
        assert min_cost_schedule(graph, budget).info.compute_cost == optimum


def test_fixed_order_trap():
    # Optimal in the model's order only: the status and the message say so, and the lower bound is
    # one that holds in every order (it said "optimal" with lower_bound 13).
    graph = trap_graph()
    schedule = solve(graph, 4, method="ilp")
    assert check(graph, schedule, 4) == 13
    assert min_cost_schedule(graph, 4).info.compute_cost == 10  # order 0, 3, 1, 2 is cheaper
    info = schedule.info
    assert info.status == "optimal-in-order" and not info.optimal
    assert "optimal in its order of first computations" in info.message
    assert info.lower_bound == pytest.approx(10)  # the order-free bound is exact here
    assert info.gap == pytest.approx(3 / 13)


@pytest.mark.parametrize("graph,budget,optimum", [(random_dag(7, 0.5, seed=33), 6, 26),
                                                  (random_dag(7, 0.3, seed=90), 6, 13)])
def test_optimal_in_order_on_random_dags(graph, budget, optimum):
    # Two 7-node DAGs where the model's optimum in its order (32 and 17) is above the true one: it
    # reported "optimal" with a lower bound above the optimum before it was fixed.
    schedule = solve(graph, budget, method="ilp")
    assert min_cost_schedule(graph, budget).info.compute_cost == optimum
    assert check(graph, schedule, budget) > optimum
    assert schedule.info.status == "optimal-in-order"
    assert schedule.info.lower_bound <= optimum + 1e-9


def test_a_given_warm_start_sets_the_order():
    # The trap's cheaper order comes from outside (here the exhaustive search; in practice cpsat):
    # the model takes that schedule's first-computation order and proves it optimal in it.
    graph = trap_graph()
    given = min_cost_schedule(graph, 4)
    schedule = solve(graph, 4, method="ilp", warm_starts=[given])
    assert check(graph, schedule, 4) == 10
    assert schedule.info.status == "optimal"
    assert "given" in schedule.info.message
    # A start over the budget is only unusable: the model's own order and optimum remain.
    assert check(graph, solve(graph, 4, method="ilp", warm_starts=[store_all_schedule(graph)]), 4) == 13


def test_an_invalid_warm_start_is_refused():
    graph = trap_graph()
    with pytest.raises(ValueError, match=r"warm_starts\[0\] is not a valid schedule"):
        solve(graph, 4, method="ilp", warm_starts=[Schedule([("compute", 1)])])
    with pytest.raises(ValueError, match=r"warm_starts\[0\] is a list, not a Schedule"):
        solve(graph, 4, method="ilp", warm_starts=[[("compute", 0)]])


@pytest.mark.parametrize("seed", [0, 1])
def test_never_above_its_warm_starts(seed):
    # The chain methods' backward runs a gradient's consumers in another order than the trace
    # did; with the trace's order fixed, the model could not express their schedules and its
    # optimum was above them (3 of these 4 budgets). The model now takes the cheapest start's order.
    graph = parameter_gradient_graph(5 + 2 * seed, seed=seed)
    other_order = 0
    for fraction in (0.8, 0.9):
        budget = int(store_all_peak(graph) * fraction)
        starts = ilp.warm_start_candidates(graph, budget, Clock(None))
        other_order += not ilp.expressible(graph, node_costs(graph), starts[0].schedule)
        assert check(graph, ilp.solve_ilp(graph, budget), budget) <= starts[0].cost + 1e-9
    assert other_order  # the case this test is about occurs


# ---- against the exhaustive search -----------------------------------------------------------


def property_graphs():
    graphs = []
    for seed in range(4):
        outputs = ("sinks", "last", "none")[seed % 3]
        graphs.append((f"random{seed}", random_dag(7 + seed % 3, 0.35, seed=seed, outputs=outputs)))
    graphs.append(("random-extras", with_extras(random_dag(8, 0.3, seed=11), seed=5)))
    # Exact group: one topological order (so the fixed order costs nothing) and outputs that are
    # sinks; the stage structure loses nothing there either (Checkmate's linear graphs).
    graphs.append(("chain7", chain(7, seed=3)))
    graphs.append(("chain9-extras", with_extras(chain(9, seed=4), seed=6)))
    graphs.append(("linear4", training_graph(4, seed=3)))
    graphs.append(("linear4-extras", with_extras(training_graph(4, seed=1), seed=3)))
    graphs.append(("training-skips", training_graph(4, seed=2, skips=2)))
    graphs.append(("params", parameter_gradient_graph(3, seed=1)))  # "loss" is pinned
    return graphs


@pytest.mark.parametrize("name,graph", property_graphs(), ids=[name for name, _ in property_graphs()])
def test_never_below_exhaustive_and_exact_on_chains(name, graph):
    true_min = min_peak(graph)
    top = store_all_peak(graph)
    is_chain = name.startswith(("chain", "linear"))
    feasible = 0
    for budget in range(true_min - 1, top + 1):
        try:
            schedule = ilp.solve_ilp(graph, budget)
        except Infeasible as error:
            assert error.min_budget is not None and error.min_budget >= true_min
            assert error.min_budget > budget
            assert not is_chain or budget < true_min  # on a chain the model reaches the true minimum
            continue
        feasible += 1
        cost = check(graph, schedule, budget)
        optimum = min_cost_schedule(graph, budget).info.compute_cost
        assert cost >= optimum - 1e-9, (budget, cost, optimum)
        if is_chain:
            assert cost == pytest.approx(optimum), budget
        # Proven in the model's order; "optimal" only where that is the true optimum.
        assert schedule.info.status in ("optimal", "optimal-in-order")
        if is_chain:  # the order-free bound meets the optimum there: proven over every order
            assert schedule.info.status == "optimal", budget
        if schedule.info.status == "optimal":
            assert cost == pytest.approx(optimum), budget
        assert schedule.info.lower_bound <= optimum + 1e-9
        for node in graph.nodes:
            if graph.nodes[node].get("pinned"):
                assert schedule.computes().count(node) == 1
    assert feasible >= 1  # the store-all peak is always feasible


@pytest.mark.parametrize("graph", [random_dag(8, 0.4, seed=21), with_extras(random_dag(8, 0.3, seed=22), seed=1),
                                   trap_graph(), training_graph(4, seed=5)])
def test_min_budget_is_the_model_minimum(graph):
    true_min = min_peak(graph)
    with pytest.raises(Infeasible) as caught:
        ilp.solve_ilp(graph, true_min - 1)
    least = caught.value.min_budget
    assert least >= true_min
    assert str(least) in str(caught.value)
    check(graph, ilp.solve_ilp(graph, least), least)  # the model meets it...
    if least > true_min:
        with pytest.raises(Infeasible):  # ...and nothing below it
            ilp.solve_ilp(graph, least - 1)


def test_model_minimum_can_exceed_the_true_minimum():
    # The fixed first-computation order also costs memory: here a schedule that computes node 3
    # before node 2 (and frees it) peaks at 10 bytes, while the model's order needs 12.
    graph = random_dag(5, 0.4, seed=202, outputs="none")
    assert sorted(graph.edges) == [(0, 1), (0, 4), (1, 2), (1, 3), (2, 4)]
    assert min_peak(graph) == 10
    with pytest.raises(Infeasible) as caught:
        solve(graph, 11, method="ilp")
    assert caught.value.min_budget == 12
    assert "12 bytes" in str(caught.value)
    check(graph, solve(graph, 12, method="ilp"), 12)


def test_tight_budget_starts_from_a_least_memory_schedule():
    # At the model's minimum budget no heuristic or LP rounding fits; the peak-minimising MILP,
    # stopped at the first schedule within the budget, gives the start.
    graph = random_dag(10, 0.3, seed=7)
    schedule = solve(graph, 14, method="ilp")
    assert "least-memory" in schedule.info.message
    assert check(graph, schedule, 14) == 60 and schedule.info.status in ("optimal", "optimal-in-order")
    assert min_cost_schedule(graph, 14).info.compute_cost <= 60
    with pytest.raises(Infeasible) as caught:
        solve(graph, 13, method="ilp")
    assert caught.value.min_budget == 14


# ---- byte-sized numbers ----------------------------------------------------------------------


def test_large_bytes_and_small_seconds_scale():
    graph = training_graph(8, unit=True)
    unit_bytes = 123_456_789
    for node in graph.nodes:
        graph.nodes[node]["mem"] *= unit_bytes
        graph.nodes[node]["cost"] = 3e-5
    for budget, optimum in [(5, 22), (6, 21)]:
        schedule = solve(graph, budget * unit_bytes, method="ilp")
        assert check(graph, schedule, budget * unit_bytes) == pytest.approx(optimum * 3e-5)
        assert schedule.info.status == "optimal"
        assert schedule.info.lower_bound == pytest.approx(optimum * 3e-5)
    # One byte short of the tightest budget: the model needs 3 units, to the byte.
    with pytest.raises(Infeasible) as caught:
        solve(graph, 3 * unit_bytes - 1, method="ilp")
    assert caught.value.min_budget == 3 * unit_bytes


# ---- model internals -------------------------------------------------------------------------


def test_set_budget_matches_a_fresh_model():
    # Rows whose R[t,t] = 1 carry workspace[t] on their right-hand side: changing the budget in
    # place must keep it (lp-rounding's tighter LPs and the MILP after them rely on this).
    graph = with_extras(training_graph(4, seed=1), seed=3)
    costs = node_costs(graph)
    scales = ilp.Scales.of(costs)
    moved = ilp.build_model(costs, 30, scales)
    moved.set_budget(17)
    fresh = ilp.build_model(costs, 17, scales)
    assert any(costs.workspace)
    assert list(moved.row_upper[moved.budget_rows]) == list(fresh.row_upper[fresh.budget_rows])


def test_warm_start_values_satisfy_the_model_and_round_trip():
    graph = training_graph(8, unit=True)
    costs = node_costs(graph)
    schedule = solve(graph, 5, method="chen-greedy")
    model = ilp.build_model(costs, 5, ilp.Scales.of(costs))
    values = ilp.model_values(model, graph, schedule)
    assert values is not None and ilp._check_values(model, values)
    order = ilp.compute_order(model, values)
    assert [costs.order[i] for i in order] == schedule.computes()
    # A schedule whose first computations are out of the fixed order cannot be expressed.
    swapped = Schedule([("compute", 0), ("compute", 1), ("compute", 2)])
    graph2 = nx.DiGraph([(0, 1), (0, 2)])
    for node in graph2.nodes:
        graph2.nodes[node].update(cost=1.0, mem=1)
    costs2 = node_costs(graph2)
    model2 = ilp.build_model(costs2, 3, ilp.Scales.of(costs2))
    assert ilp.model_values(model2, graph2, swapped) is not None
    assert ilp.model_values(model2, graph2, Schedule([("compute", 0), ("compute", 2), ("compute", 1)])) is None


def test_the_lp_bound_holds_for_any_duals():
    # The LP's bound is weak duality from its row duals: at HiGHS's duals it is the LP optimum; from
    # any other multipliers (a stopped or inexact LP) it is lower, never above the model's optimum.
    import numpy as np

    from solvers.ilp import backends

    graph = training_graph(8, unit=True)
    costs = node_costs(graph)
    model = ilp.build_model(costs, 5, ilp.Scales.of(costs))
    highs = backends.load_highs(model, relax=True)
    highs.run()
    duals = np.array(highs.getSolution().row_dual)
    lp = highs.getInfo().objective_function_value
    assert backends.dual_bound(model, duals) == pytest.approx(lp, rel=1e-9)
    rng = np.random.default_rng(0)
    for scale in (0.0, 0.5, 2.0):
        noisy = duals * scale + rng.normal(0, 0.1, len(duals))
        assert backends.dual_bound(model, noisy) <= lp + 1e-9
    assert lp * model.scales.cost_unit <= KNOWN_OPTIMA[8][5] + 1e-9


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_backend_accepts_the_warm_start(backend):
    graph = training_graph(14, unit=True, skips=3)
    costs = node_costs(graph)
    budget = 12
    start = solve(graph, budget, method="chen-greedy")
    start_cost = check(graph, start, budget)
    model = ilp.build_model(costs, budget, ilp.Scales.of(costs))
    values = ilp.model_values(model, graph, start)
    assert values is not None
    # A time limit far too short to solve the model: what comes back is the start (or better).
    # (0.5 s: under load CBC needs a few tenths just to start and read the model and its start)
    outcome = ilp.run_backend(model, backend, time_limit=0.5, warm=values)
    assert outcome.has_solution
    assert outcome.objective * model.scales.cost_unit <= start_cost + 1e-6


# ---- time limits, LP rounding, backends ------------------------------------------------------


def test_time_limit_returns_incumbent_with_gap():
    # A budget at which HiGHS needs ~20 CPU seconds to prove optimality (this machine): stopped
    # after 3, it returns its incumbent with the proven gap.
    graph = training_graph(20, seed=1)
    budget = 24
    schedule = solve(graph, budget, method="ilp", time_limit=3)
    cost = check(graph, schedule, budget)
    info = schedule.info
    assert info.status == "feasible" and "time limit" in info.message
    assert info.lower_bound is not None and 0 < info.lower_bound < cost
    assert info.gap == pytest.approx((cost - info.lower_bound) / cost)
    assert 0 < info.gap < 0.5
    assert info.lower_bound <= 141 <= cost + 1e-9  # 141: the proven optimum (solved without a limit)


def test_time_limit_without_incumbent_raises_timeout():
    graph = training_graph(22, seed=1)
    # No warm start and no time to solve: neither a schedule nor a proof of infeasibility.
    with pytest.raises(TimeoutError, match="time limit"):
        ilp.solve_ilp(graph, 30, time_limit=0.01, warm_start=False)


@pytest.mark.parametrize("budget", [4, 6])
def test_lp_rounding_on_the_linear_training_graph(budget):
    graph = training_graph(8, unit=True)
    schedule = solve(graph, budget, method="ilp", mode="lp-rounding")
    cost = check(graph, schedule, budget)
    bound = schedule.info.lower_bound
    # Here the model's optimum is the true optimum: the LP value is below both it and the cost.
    assert bound is not None and bound <= KNOWN_OPTIMA[8][budget] + 1e-9 <= cost + 1e-9
    assert schedule.info.gap == pytest.approx((cost - bound) / cost, abs=1e-9)
    assert schedule.info.status == ("optimal" if schedule.info.gap == 0 else "feasible")


def test_lp_rounding_with_skips_and_extras():
    graph = with_extras(training_graph(6, seed=3, skips=2), seed=2)
    budget = (min_peak(graph) + store_all_peak(graph)) // 2
    schedule = solve(graph, budget, method="ilp", mode="lp-rounding")
    cost = check(graph, schedule, budget)
    exact = solve(graph, budget, method="ilp")
    assert schedule.info.lower_bound <= check(graph, exact, budget) + 1e-9 <= cost + 1e-9


def test_lp_rounding_lower_bound_on_trap_is_the_model_s():
    schedule = solve(trap_graph(), 4, method="ilp", mode="lp-rounding")
    assert check(trap_graph(), schedule, 4) == 13
    assert schedule.info.lower_bound <= 13 + 1e-9


def test_cbc_backend_matches_highs():
    graph = training_graph(4, seed=7, skips=1)
    budget = (min_peak(graph) + store_all_peak(graph)) // 2
    highs = solve(graph, budget, method="ilp")
    cbc = solve(graph, budget, method="ilp", backend="cbc")
    cbc_cold = solve(graph, budget, method="ilp", backend="cbc", warm_start=False)
    assert check(graph, cbc, budget) == pytest.approx(check(graph, highs, budget))
    assert check(graph, cbc_cold, budget) == pytest.approx(check(graph, highs, budget))
    assert cbc_cold.info.status == "optimal"
    with pytest.raises(Infeasible) as caught:
        solve(graph, min_peak(graph) - 1, method="ilp", backend="cbc")
    assert caught.value.min_budget >= min_peak(graph)


def test_highs_without_warm_start_matches():
    graph = training_graph(6, unit=True)
    warm = solve(graph, 4, method="ilp")
    cold = solve(graph, 4, method="ilp", warm_start=False)
    optimum = min_cost_schedule(graph, 4).info.compute_cost
    assert optimum == 18  # 13 nodes once each, 5 recomputations
    assert check(graph, cold, 4) == check(graph, warm, 4) == optimum
    assert cold.info.status == "optimal" and "warm start" not in cold.info.message


def test_overshoot_is_retried_with_a_tighter_budget(monkeypatch):
    # Pretend the solver's tolerance let its first solution overshoot the budget in bytes: the
    # MILP is re-solved for less, and the answer no longer claims optimality for the real budget.
    graph = training_graph(6, unit=True)
    real = ilp._candidate
    milp_calls = []

    def first_milp_overshoots(graph, schedule, budget, source):
        if source == "milp":
            milp_calls.append(budget)
            if len(milp_calls) == 1:
                return None
        return real(graph, schedule, budget, source)

    monkeypatch.setattr(ilp.exact, "_candidate", first_milp_overshoots)  # where the MILP's solution is checked
    schedule = ilp.solve_ilp(graph, 5, warm_start=False)
    assert len(milp_calls) == 2
    assert "tightened" in schedule.info.message and schedule.info.status == "feasible"
    check(graph, schedule, 5)


def test_thread_counts_can_change_between_solves():
    # HiGHS sizes one thread pool per process; a later solve with another size must still work.
    graph = training_graph(6, unit=True)
    for threads in (1, 2, 1):
        schedule = solve(graph, 4, method="ilp", threads=threads, warm_start=False)
        assert check(graph, schedule, 4) == 18 and schedule.info.status == "optimal"


def test_bad_options_and_missing_backend(monkeypatch):
    graph = trap_graph()
    with pytest.raises(ValueError, match="highs, cbc"):
        solve(graph, 4, method="ilp", backend="gurobi")
    with pytest.raises(ValueError, match="exact, lp-rounding"):
        solve(graph, 4, method="ilp", mode="heuristic")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "highspy" else real(name, *a))
    with pytest.raises(SolverUnavailable, match="highspy"):
        solve(graph, 4, method="ilp")


def test_refuses_graphs_too_large_for_the_model():
    with pytest.raises(ValueError, match="max_nodes=10"):
        solve(chain(11), 3, method="ilp", max_nodes=10)


def test_store_all_budget_and_empty_graph():
    graph = training_graph(4, seed=1)
    top = store_all_peak(graph)
    schedule = solve(graph, top, method="ilp")
    assert check(graph, schedule, top) == pytest.approx(sum(d["cost"] for _, d in graph.nodes(data=True)))
    assert schedule.info.status == "optimal"
    assert len(solve(nx.DiGraph(), 0, method="ilp")) == 0


def test_node_costs_refuses_an_order_that_is_not_topological():
    graph = chain(4)
    order = list(nx.topological_sort(graph))
    assert node_costs(graph, order).order == tuple(order)
    with pytest.raises(ValueError, match="not a topological order"):
        node_costs(graph, order[::-1])
    with pytest.raises(ValueError, match="not a topological order"):
        node_costs(graph, order[:-1])


# ---- honest verdicts under a time limit, and loud heuristics --------------------------------------


def test_an_unproven_minimum_is_a_timeout_not_infeasible():
    # Issue 17: out of time, ilp reported the least peak it had found as the minimum budget
    # (exit 3, "minimum 194 MiB", where 122 MiB is met given 120 s). Budget 13 is below what the
    # model needs (14, proven by the MILP given time); with no time to prove the minimum, the
    # answer is a timeout; with any time, the minimum reported is the proven one.
    graph = random_dag(10, 0.3, seed=7)
    with pytest.raises(SolverTimeout, match="not proven within the time limit"):
        solve(graph, 13, method="ilp", time_limit=1e-6)
    for limit in (0.05, 0.3, None):
        try:
            solve(graph, 13, method="ilp", time_limit=limit)
        except Infeasible as error:
            assert error.min_budget == 14, limit
        except SolverTimeout:
            assert limit is not None


def test_the_time_limit_holds_while_building_the_model(monkeypatch):
    # Issue 17: ilp ran 135 s against --time-limit 120; building (and loading) the model was not
    # charged to the limit. Here every block of rows (one family at one stage) takes 50 ms to add:
    # ~12 s per model of this graph.
    import time

    from solvers.ilp import model as ilp_model

    add = ilp_model._Blocks.add

    def slowly(self, *args, **kwargs):
        time.sleep(0.05)
        return add(self, *args, **kwargs)

    monkeypatch.setattr(ilp_model._Blocks, "add", slowly)
    graph = training_graph(30, seed=1)
    started = time.perf_counter()
    try:
        schedule = solve(graph, 30, method="ilp", time_limit=2)
    except TimeoutError as error:
        assert "time limit" in str(error)
    else:  # the cheapest warm start stands, and the report says why
        assert schedule.info.status == "feasible" and "building Checkmate's model" in schedule.info.message
    assert time.perf_counter() - started < 2 + 1.5


def test_a_model_too_large_for_the_time_left_is_refused_before_it_is_built(monkeypatch):
    # The build time is estimated from the model's columns: a model that cannot be built in the time
    # left is not started, and the cheapest warm start comes back saying so.
    from solvers.ilp import model as ilp_model

    graph = training_graph(30, seed=1)
    costs = node_costs(graph)
    columns = ilp.estimated_columns(costs)
    assert ilp.build_model(costs, 30, ilp.Scales.of(costs)).num_cols <= columns
    monkeypatch.setattr(ilp_model, "BUILD_SECONDS_PER_COLUMN", 100.0 / columns)  # ~100 s to build
    schedule = solve(graph, 30, method="ilp", time_limit=10)
    assert schedule.info.status == "feasible"
    assert "would have" in schedule.info.message and "not built" in schedule.info.message


def test_a_warm_start_heuristic_that_fails_is_a_loud_bug(monkeypatch):
    # Only Infeasible, a timeout or a missing library mean "no warm start from this method";
    # once any exception was swallowed, hiding a heuristic's invalid schedule.
    from solvers import chen

    monkeypatch.setattr(chen, "solve_chen_greedy", lambda graph, budget, time_limit=None: Schedule([("compute", 1)]))
    graph = training_graph(6, seed=1)
    with pytest.raises(AssertionError, match="chen-greedy"):
        solve(graph, store_all_peak(graph) - 1, method="ilp")


INTERRUPTED_MILP = """
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from graphs import store_all_peak, training_graph
from solvers import solve
from solvers.ilp import backends

original = backends.run_interruptibly

def announced(highs):
    print("solving", flush=True)  # the parent sends SIGINT once HiGHS runs
    return {run}

backends.run_interruptibly = announced
graph = training_graph(40, seed=0, skips=4)
started = time.perf_counter()
try:
    solve(graph, store_all_peak(graph) // 2, method="ilp", time_limit=120, warm_start=False, threads=1)
except KeyboardInterrupt:
    print(f"interrupted after {{time.perf_counter() - started:.1f}} s", flush=True)
    raise
print("returned", flush=True)
"""


def run_interrupted_milp(run: str = "original(highs)") -> tuple[str, str, float]:
    """A MILP of ~20 s (81 nodes, no warm start) in a subprocess, sent SIGINT 1 s into HiGHS's run:
    its stdout, stderr and the seconds from the signal to its end."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = INTERRUPTED_MILP.format(root=root, tests=os.path.join(root, "tests"), run=run)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=default_sigint)
    try:
        assert process.stdout.readline().strip() == "solving"
        time.sleep(1.0)
        sent = time.perf_counter()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=180)
        return out, err, time.perf_counter() - sent
    finally:
        process.kill()


def test_ctrl_c_during_a_highs_run_raises_keyboard_interrupt_at_once():
    # HiGHS's run holds the thread that calls it: a Ctrl-C used to wait for the end of the MILP.
    out, err, waited = run_interrupted_milp()
    assert "returned" not in out
    assert "interrupted after" in out and "KeyboardInterrupt" in err, (out, err[-2000:])
    assert waited < 5, waited  # stopped within the run, not at its end (~20 s)
