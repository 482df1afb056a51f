"""Every method, on random DAGs, chains and training graphs, at budgets from nothing to more than
enough: a schedule that simulates valid within the budget, or Infeasible (docs/contract.md, "The solver contract").

Per-method tests check optimality against exhaustive search; this one checks the shared contract
over the same random graphs for all of them."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import check_contract
from graphs import chain, random_dag, store_all_peak, training_graph, with_extras
from solvers import METHODS

# ilp and cpsat search: keep their graphs small so that a hypothesis run stays in seconds.
FAST_METHODS = ["store-all", "chen-sqrtn", "chen-greedy", "revolve", "dp"]
SEARCH_METHODS = ["ilp", "cpsat"]


def graphs(max_nodes: int):
    kinds = st.sampled_from(["dag", "chain", "training", "training-skips"])
    return st.builds(
        _make, kinds, st.integers(3, max_nodes), st.integers(0, 10_000), st.booleans()
    )


def _make(kind: str, size: int, seed: int, extras: bool):
    if kind == "dag":
        graph = random_dag(size, edge_probability=0.3, seed=seed)
    elif kind == "chain":
        graph = chain(size, seed=seed)
    else:
        graph = training_graph(max(2, size // 2), seed=seed, skips=2 if kind == "training-skips" else 0)
    return with_extras(graph, seed) if extras else graph


def test_every_method_is_covered():
    assert set(FAST_METHODS + SEARCH_METHODS + ["exhaustive"]) == set(METHODS)


@pytest.mark.parametrize("method", FAST_METHODS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(24), fraction=st.floats(0.0, 1.2))
def test_fast_methods_fit_or_raise_infeasible(method, graph, fraction):
    check_contract(graph, int(fraction * store_all_peak(graph)), method)


@pytest.mark.parametrize("method", SEARCH_METHODS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(9), fraction=st.floats(0.0, 1.2))
def test_search_methods_fit_or_raise_infeasible(method, graph, fraction):
    check_contract(graph, int(fraction * store_all_peak(graph)), method, time_limit=20)


@settings(max_examples=15, deadline=None)
@given(graph=graphs(9), fraction=st.floats(0.0, 1.2))
def test_exhaustive_fits_or_raises_infeasible(graph, fraction):
    check_contract(graph, int(fraction * store_all_peak(graph)), "exhaustive")
