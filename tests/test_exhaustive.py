"""The exhaustive search, ground truth for the exact solvers, reproduces known optima."""

import pytest

from graphs import CHECKMATE_LINEAR_OPTIMA as CHECKMATE_LINEAR
from graphs import random_dag, training_graph, trap_graph
from solvers import Infeasible, simulate
from solvers.exhaustive import min_cost_schedule, min_peak



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
    g = trap_graph()
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
