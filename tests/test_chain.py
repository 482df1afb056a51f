"""Tests of the chain view (solvers/chain.py): where backward nodes go, and the several views the
chain methods plan on."""

from __future__ import annotations

import pytest
from graphs import parameter_gradient_graph, projection_head_graph, random_dag, store_all_peak, training_graph

from solvers import Infeasible, simulate, solve
from solvers import dp
from solvers.chain import PERSISTENT_SHARES, chain_view, chain_views, coarsened
from solvers.chen import segment_sequence
from solvers.chainmodel import simulate_chain
from solvers.dp import plan_chain


def test_a_projections_backward_joins_its_stage():
    """The output projection's input gradient reads its input and the logits' gradient, not its
    output. It belongs to the projection's stage, so the logits' gradient flows as y into it;
    placed one stage lower (the input's producer), the gradient skipped a stage and the chain model
    held all 120 bytes of it as a result kept to the end (``gout``), GPT-2's 32 MiB."""
    graph = projection_head_graph(6)
    view = chain_view(graph)
    assert view.stage_of["g_in"] == view.stage_of["head"]
    chain = view.chain()
    assert max(chain.gout) < graph.nodes["g_head"]["mem"]
    assert chain.gout[view.stage_of["head"]] == graph.nodes["w_head"]["mem"]  # the weight gradient, kept


def test_views_differ_in_what_they_hold_throughout():
    graph = projection_head_graph(6)
    views = chain_views(graph)
    reserved = [view.reserved for view in views]
    assert len(set(reserved)) == 2 and len(views) == 4  # two shares x two backward placements
    assert "mask" in reserved[0] and "mask" not in reserved[-1]  # 2% first, nothing persistent last
    placements = {view.stage_of["g_in"] for view in views if view.reserved == reserved[0]}
    assert placements == {views[0].stage_of["head"], views[0].stage_of["head"] - 1}
    assert views[0].length > views[-1].length  # the mask held throughout is what splits the layers
    assert chain_view(graph).stage_of == views[0].stage_of
    assert chain_view(graph, PERSISTENT_SHARES[-1]).reserved == views[-1].reserved


@pytest.mark.parametrize("make", [
    lambda: projection_head_graph(6),
    lambda: projection_head_graph(9, seed=3, head_bytes=60),
    lambda: random_dag(10, seed=1),
    lambda: training_graph(10, seed=1, skips=2),
    lambda: parameter_gradient_graph(7, seed=2),
])
def test_every_view_is_conservative(make):
    """On every view, each dp plan and each segment plan lowers to a schedule that peaks at most at
    its chain-model peak plus the reserved bytes."""
    graph = make()
    for view in [v for base in chain_views(graph) for v in (base, coarsened(base, 2), coarsened(base, 3))]:
        chain = view.chain()
        plans = plan_chain(chain)
        sequences = [plans.plan(budget).sequence for budget in plans.budgets()]
        sequences += [segment_sequence(view.length, list(range(0, view.length, step))) for step in (1, 2, 3)]
        for sequence in sequences:
            modelled = simulate_chain(chain, sequence)
            outcome = simulate(graph, view.lower(sequence))
            assert modelled.valid and outcome.valid
            assert outcome.peak_bytes <= modelled.peak + view.reserved_bytes


@pytest.mark.parametrize("method", ["dp", "chen-greedy"])
def test_methods_reach_their_minimum(method):
    """Over all views, min_budget is the least peak the method's plans reach: attained, and below
    store-all on a graph whose layers only the view holding the mask can split."""
    graph = projection_head_graph(9, seed=3, head_bytes=60)
    with pytest.raises(Infeasible) as caught:
        solve(graph, 0, method=method)
    least = caught.value.min_budget
    assert least < store_all_peak(graph)
    assert simulate(graph, solve(graph, least, method=method)).peak_bytes <= least
    with pytest.raises(Infeasible):
        solve(graph, least - 1, method=method)


def test_dp_reaches_below_every_single_view():
    graph = projection_head_graph(9, seed=3, head_bytes=60)
    with pytest.raises(Infeasible) as caught:
        solve(graph, 0, method="dp")
    for view in chain_views(graph):
        plans = plan_chain(view.chain())
        lowered = simulate(graph, view.lower(plans.plan(plans.budgets()[0]).sequence))
        assert caught.value.min_budget <= lowered.peak_bytes


def test_dp_with_no_time_left_plans_on_the_default_view_only():
    graph = projection_head_graph(9, seed=3, head_bytes=60)
    budget = (store_all_peak(graph) * 9) // 10
    quick = solve(graph, budget, method="dp", time_limit=1e-9)
    assert simulate(graph, quick).peak_bytes <= budget
    assert solve(graph, budget, method="dp").info.compute_cost <= quick.info.compute_cost


def test_coarsened_view_merges_consecutive_stages():
    view = chain_view(training_graph(7, seed=2))
    merged = coarsened(view, 3)
    assert merged.length == 3  # stages 0-2, 3-5, 6; the loss stage apart
    assert merged.forward[0] == view.forward[0] + view.forward[1] + view.forward[2]
    assert merged.backward[0] == view.backward[2] + view.backward[1] + view.backward[0]
    assert merged.forward[-1] == view.forward[-1] and merged.backward[-1] == view.backward[-1]
    assert coarsened(view, 1).forward == view.forward
    with pytest.raises(ValueError, match="stages_per_group"):
        coarsened(view, 0)


def test_dp_plans_long_chains_coarsened_too(monkeypatch):
    """Where the grid has few memory levels (a long chain: here the caps are lowered to make 60
    stages long), merging stages and planning on finer levels finds cheaper plans."""
    graph = training_graph(60, seed=3)
    for _, data in graph.nodes(data=True):
        data["mem"] *= 1000  # sizes of many grid units
    budget = store_all_peak(graph) // 2
    monkeypatch.setattr(dp, "MAX_GRID_WORK", 4e5)  # 10 memory levels at 60 stages, 556 at 15
    monkeypatch.setattr(dp, "COARSE_STAGES", 10**9)
    fine_only = solve(graph, budget, method="dp")
    monkeypatch.setattr(dp, "COARSE_STAGES", 15)
    with_coarse = solve(graph, budget, method="dp")
    assert simulate(graph, with_coarse).peak_bytes <= budget
    assert with_coarse.info.compute_cost < 0.95 * fine_only.info.compute_cost
