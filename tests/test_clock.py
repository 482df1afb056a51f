"""The native planner's clock (issue 28, item 4): what torch.utils.checkpoint itself costs, measured
(profiler/checkpoint_cost.py, planner/checkpoint_clock.py) and priced (solvers/regions/)."""

from __future__ import annotations

import random

import pytest

from solvers.regions import RegionModel, checkpoint_overhead, evaluate, plan_regions, region_costs, split_policy
from test_regions import block_chain

RATES = {"region_seconds": 0.25, "recomputed_op_seconds": 0.125,
         "policy_region_seconds": {"matmuls": 0.5}, "policy_op_seconds": {"matmuls": 0.0625}}


def with_rates(graph, rates):
    graph = graph.copy()
    graph.graph["checkpoint_costs"] = rates
    return graph


def test_region_costs_price_the_checkpoint_itself():
    plain = block_chain(blocks=4, ops=4)
    priced = with_rates(plain, RATES)
    for region in ("layers.1", "layers.2@matmuls", "layers.0.op1"):
        bare, costs = region_costs(plain, region), region_costs(priced, region)
        assert bare.overhead_seconds == 0.0
        assert costs.recomputed == bare.recomputed
        expected = 0.25 + 0.125 * len(costs.recomputed)
        if split_policy(region)[1]:
            passed = costs.nodes.index(costs.recomputed[-1]) + 1
            expected += 0.5 + 0.0625 * (len(costs.nodes) + passed)
        assert costs.overhead_seconds == pytest.approx(expected)
        assert costs.seconds == pytest.approx(bare.seconds + expected)
        assert checkpoint_overhead(plain, split_policy(region)[1], 4, 4, 4) == 0.0
    # The simulated step and the search's fast model count the same overheads, once per region.
    regions = ("layers.0", "layers.2@matmuls", "layers.3.op2")
    assert evaluate(priced, regions).outcome.compute_cost == pytest.approx(
        evaluate(plain, regions).outcome.compute_cost + sum(region_costs(priced, r).overhead_seconds for r in regions))
    model = RegionModel(priced)
    candidates = ["layers.0", "layers.1@matmuls", "layers.2", "layers.3@matmuls", "layers.1.op0", "layers.3.op3"]
    rng = random.Random(0)
    for _ in range(20):
        chosen = [r for r in candidates if rng.random() < 0.4]
        try:
            expected = evaluate(priced, chosen).outcome
        except ValueError:  # overlapping regions
            continue
        assert model.peak_and_cost(chosen) == (expected.peak_bytes, pytest.approx(expected.compute_cost))


def _budget_where_a_policy_is_chosen(graph):
    """A budget at which the ops-only search checkpoints some region under a policy."""
    bare = evaluate(graph, ()).outcome.peak_bytes
    for percent in range(95, 30, -5):
        budget = bare * percent // 100
        try:
            plan = plan_regions(graph, budget, policies=("matmuls",))
        except Exception:  # noqa: BLE001 - below the least: try no lower
            break
        if any("@" in r for r in plan.regions):
            return budget, plan
    raise AssertionError("no budget where the ops-only search chose a policy")


def test_a_policy_that_does_not_pay_is_not_chosen():
    plain = block_chain(blocks=6, ops=4, mem=100)
    budget, ops_only = _budget_where_a_policy_is_chosen(plain)
    # Measured: the policy's dispatch costs more per op than recomputing the ops it saves spares.
    costly = with_rates(plain, {**RATES, "policy_region_seconds": {"matmuls": 0.0},
                                "policy_op_seconds": {"matmuls": 2.0}})
    honest = plan_regions(costly, budget, policies=("matmuls",))
    assert honest.outcome.peak_bytes <= budget
    assert not any("@" in r for r in honest.regions), honest.regions
    # ... and it is cheaper, by the measured clock, than the plan the ops-only clock chose.
    assert honest.outcome.compute_cost < evaluate(costly, ops_only.regions).outcome.compute_cost
    # Where the measurement says the policy pays (a cheap dispatch), it is still bought.
    cheap = with_rates(plain, {**RATES, "policy_op_seconds": {"matmuls": 1e-6}, "policy_region_seconds": {"matmuls": 0.0}})
    assert any("@" in r for r in plan_regions(cheap, budget, policies=("matmuls",)).regions)


def test_calibration_is_positive_and_bounded():
    from planner.checkpoint_clock import synthetic_costs
    from solvers.regions import SAVE_POLICIES

    costs = synthetic_costs("cpu", tuple(SAVE_POLICIES))
    # Positive: the checkpoint costs something; bounded: a tiny op's machinery is microseconds, not
    # milliseconds (10x the figures of a loaded 2-core machine, so that load does not fail it).
    assert 0 < costs.region_seconds < 5e-3
    assert 0 < costs.recomputed_op_seconds < 5e-4
    assert set(costs.policy_op_seconds) == set(SAVE_POLICIES)
    assert all(0 < seconds < 5e-4 for seconds in costs.policy_op_seconds.values())
    assert all(0 <= seconds < 5e-3 for seconds in costs.policy_region_seconds.values())
    assert synthetic_costs("cpu", tuple(SAVE_POLICIES)) is costs  # once per process
    # The per-call figure priced is measured from emptied caches, as a step's recomputation runs:
    # above the one stepped back to back (88 us against 390-440 us here: profiler/cache_eviction.py).
    assert 0 < costs.warm_region_seconds < costs.region_seconds
    assert costs.as_graph_data()["warm_region_seconds"] == costs.warm_region_seconds


def test_the_cache_evictor_writes_more_than_the_last_level_cache():
    from profiler.cache_eviction import MOST_EVICTION_BYTES, CacheEvictor, last_level_cache_bytes

    cache = last_level_cache_bytes()
    assert cache >= 2**20  # a megabyte at least, on any machine this runs on
    evictor = CacheEvictor()
    written = evictor.buffer.numel() * evictor.buffer.element_size()
    assert written >= min(cache, MOST_EVICTION_BYTES // 2) and written <= MOST_EVICTION_BYTES
    evictor.evict()
    assert bool((evictor.buffer == 1.0).all())


def test_the_planner_fits_the_clock_to_the_model_and_prices_its_plans():
    import torch

    import planner
    from models import gpt2, gpt2_inputs, hf_loss
    from planner import checkpoint_clock
    from planner.native import plan_native

    torch.manual_seed(0)
    model = gpt2(layers=2, embd=64, heads=2, vocab=256, positions=32).train()
    inputs = gpt2_inputs(batch=2, tokens=32, vocab=256)
    profile = planner.profile_for(model, inputs, loss_fn=hf_loss)
    graph = profile.regroup("op").graph
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    costs = checkpoint_clock.measure_costs(model, inputs, graph, ("matmuls",))
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())  # nothing trained
    assert costs.source == "transformer.h.0"  # a block: the largest region with at most half the ops
    floor = checkpoint_clock.synthetic_costs("cpu", ("matmuls",))
    assert floor.recomputed_op_seconds <= costs.recomputed_op_seconds < 5e-3
    assert floor.policy_op_seconds["matmuls"] <= costs.policy_op_seconds["matmuls"] < 5e-3

    plan = plan_native(model, inputs, planner.parse_budget("85%"), loss_fn=hf_loss, profile=profile,
                       policies=("matmuls",))
    assert checkpoint_clock.KEY in graph.graph and plan.regions
    overheads = sum(region_costs(graph, r).overhead_seconds for r in plan.regions)
    assert overheads > 0
    assert plan.predicted_seconds == pytest.approx(evaluate(graph, plan.regions).outcome.compute_cost)
    ops_only = plan_native(model, inputs, planner.parse_budget("85%"), loss_fn=hf_loss, profile=profile,
                           policies=("matmuls",), clock=False, measure=False)
    assert checkpoint_clock.KEY not in graph.graph
    assert ops_only.predicted_seconds == pytest.approx(evaluate(graph, ops_only.regions).outcome.compute_cost)


def test_the_fit_takes_each_rounds_residual_and_pools_the_policies():
    """fit_to_region (profiler/checkpoint_cost.py): each round's residual against that round's plain
    step and forward, the median over the rounds (one slow round moves nothing), the policies fitted
    as one factor on their synthetic rates."""
    from profiler.checkpoint_cost import CheckpointCosts, RegionShape, fit_to_region

    us = 1e-6
    # The region is stepped back to back: it pays the warm per-call figure, not the cold one priced.
    synthetic = CheckpointCosts("cpu", region_seconds=400 * us, recomputed_op_seconds=5 * us,
                                policy_region_seconds={"matmuls": 0.0, "matmuls+draws": 0.0},
                                policy_op_seconds={"matmuls": 6 * us, "matmuls+draws": 8 * us},
                                warm_region_seconds=100 * us)
    plain = RegionShape(forward_ops=40, pass_ops=40, recomputed_ops=40, recomputed_share=1.0, forward_seconds=0.02)
    policy = RegionShape(forward_ops=40, pass_ops=40, recomputed_ops=10, recomputed_share=0.25, forward_seconds=0.02)
    shapes = {"checkpoint": plain, "policy:matmuls": policy, "policy:matmuls+draws": policy}
    op_rate, factor = 50 * us, 4.0  # what the model's region "costs": 10x and 4x the synthetic rates
    steps = {name: [] for name in ("plain", "forward", "checkpoint", "policy:matmuls", "policy:matmuls+draws")}
    for load in (1.0, 1.3, 1.0, 1.0, 1.0, 1.1, 1.0):  # a load that stretches a whole round stretches all its variants
        forward, step = 0.02 * load, 0.06 * load
        steps["plain"].append(step)
        steps["forward"].append(forward)
        steps["checkpoint"].append(step + forward + (100 * us + op_rate * 40) * load)
        for name, rate in (("matmuls", 6 * us), ("matmuls+draws", 8 * us)):
            steps[f"policy:{name}"].append(step + forward * 0.25 + (100 * us + op_rate * 10 + factor * rate * 80) * load)
    steps["checkpoint"][1] += 0.05  # one round's checkpoint preempted: the median ignores it
    # One round's plain step 5 ms faster than the others (noise): each variant's least against the
    # least plain step would read those 5 ms as the checkpoint's; paired within the round, one round.
    steps["plain"][2] -= 0.005
    costs = fit_to_region(synthetic, steps, shapes, source="block", rescale=False)
    assert costs.recomputed_op_seconds == pytest.approx(op_rate, rel=0.02)
    assert costs.policy_op_seconds["matmuls"] == pytest.approx(factor * 6 * us, rel=0.02)
    assert costs.policy_op_seconds["matmuls+draws"] == pytest.approx(factor * 8 * us, rel=0.02)
    assert (costs.region_seconds, costs.warm_region_seconds) == (400 * us, 100 * us)  # both kept (scale 1)
    # A measurement below the synthetic rates keeps them (the floor).
    cheap = {**steps, "checkpoint": [p + f for p, f in zip(steps["plain"], steps["forward"])]}
    assert fit_to_region(synthetic, cheap, shapes, source="block", rescale=False).recomputed_op_seconds == 5 * us
