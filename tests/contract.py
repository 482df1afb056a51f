"""What every method's solve() promises, checked at one budget (docs/contract.md, "The solver contract")."""

from __future__ import annotations

import pytest
from graphs import store_all_peak

from solvers import Infeasible, simulate, solve, total_cost


def check_contract(graph, budget: int, method: str, retry: bool = True, **options):
    """A schedule that simulates valid within ``budget``, or Infeasible whose min_budget (when
    given) is over the budget and, with ``retry``, is met by the method. Returns the simulation of
    the schedule obtained, or None."""
    try:
        schedule = solve(graph, budget, method=method, **options)
    except Infeasible as error:
        assert error.min_budget is None or error.min_budget > budget, (method, budget, error.min_budget)
        assert error.method == method
        if error.min_budget is None or not retry:
            return None
        outcome = simulate(graph, solve(graph, error.min_budget, method=method, **options))
        assert outcome.valid, outcome.error
        assert outcome.peak_bytes <= error.min_budget
        return outcome
    outcome = simulate(graph, schedule)
    assert outcome.valid, outcome.error
    assert outcome.peak_bytes <= budget
    assert schedule.info.method == method
    assert schedule.info.predicted_peak_bytes == outcome.peak_bytes
    if schedule.info.status == "optimal" and budget >= store_all_peak(graph):
        assert outcome.compute_cost == pytest.approx(total_cost(graph))
    return outcome


def check_method_at(graph, budget: int, method: str):
    """The contract at one budget: a schedule that simulates valid within the budget, or Infeasible
    whose min_budget is over the budget and at which the method then succeeds with that exact peak.
    Returns the simulation of the schedule obtained (at ``budget`` or at ``min_budget``)."""
    try:
        schedule = solve(graph, budget, method=method)
    except Infeasible as error:
        assert error.min_budget is not None and error.min_budget > budget, (method, budget, error.min_budget)
        assert str(error.min_budget) in str(error)
        assert error.method == method
        schedule = solve(graph, error.min_budget, method=method)
        outcome = simulate(graph, schedule)
        assert outcome.valid, outcome.error
        assert outcome.peak_bytes == error.min_budget  # the least peak of the method's plans
        return outcome
    outcome = simulate(graph, schedule)
    assert outcome.valid, outcome.error
    assert outcome.peak_bytes <= budget
    assert schedule.info.method == method
    if budget >= store_all_peak(graph):
        assert schedule.info.status == "optimal"
        assert outcome.compute_cost == pytest.approx(total_cost(graph))
    else:
        assert schedule.info.status == "heuristic"
    return outcome




def check_candidate_bounds(graph, view, candidate) -> None:
    """A chain-heuristic candidate's predicted cost is its lowered schedule's simulated cost, and
    its lower bounds on cost and peak are sound."""
    outcome = simulate(graph, view.lower(candidate.build()))
    assert outcome.valid
    assert candidate.cost() == pytest.approx(outcome.compute_cost)
    assert candidate.cost_lower_bound <= candidate.cost() + 1e-9
    assert candidate.peak_lower_bound <= outcome.peak_bytes
