"""The exhaustive search, ground truth for the exact solvers, reproduces known optima."""

import networkx as nx
import pytest

from graphs import random_dag, training_graph
from solvers import Infeasible, simulate
from solvers.exhaustive import min_cost_schedule, min_peak

CHECKMATE_LINEAR = {
    4: {3: 15, 4: 11, 5: 10, 6: 9},
    8: {3: 45, 4: 26, 5: 22, 6: 21, 7: 20, 8: 19, 9: 18, 10: 17},
}


@pytest.mark.parametrize("layers", [4, 8])
def test_checkmate_linear_training_graph_optima(layers):
    g = training_graph(layers, unit=True)
    assert min_peak(g) == 3
    with pytest.raises(Infeasible) as raised:
        min_cost_schedule(g, 2)
    assert raised.value.min_budget == 3
    for budget, optimum in CHECKMATE_LINEAR[layers].items():
        schedule = min_cost_schedule(g, budget)
        result = simulate(g, schedule)
        assert result.valid and result.peak_bytes <= budget
        assert result.compute_cost == optimum


def test_order_free_optimum_beats_checkmates_fixed_order():
    """docs/algorithms.md, Checkmate trap 1: the true optimum computes node 3 before 1 and 2."""
    g = nx.DiGraph()
    for node, (cost, mem) in enumerate(zip([3, 1, 1, 5], [1, 2, 2, 3])):
        g.add_node(node, cost=float(cost), mem=mem)
    g.add_edges_from([(0, 1), (1, 2), (0, 3)])
    schedule = min_cost_schedule(g, 4)
    assert simulate(g, schedule).compute_cost == 10
    computes = schedule.computes()
    assert computes.index(3) < computes.index(1)


@pytest.mark.parametrize("seed", range(6))
def test_minimum_budget_is_tight(seed):
    g = random_dag(9, seed=seed)
    low = min_peak(g)
    assert simulate(g, min_cost_schedule(g, low)).peak_bytes <= low
    with pytest.raises(Infeasible):
        min_cost_schedule(g, low - 1)
