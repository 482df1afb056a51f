"""The planner's search over groupings (planner/granularity.py): with the profiler's own granularity
the chain methods also plan every finer grouping of the same measurements."""

import pytest
import torch

import planner
import profiler
from models import max_relative_error, residual_mlp, training_step


def square_loss(output):
    return output.float().pow(2).mean()


@pytest.fixture(scope="module")
def setup():
    model, inputs = residual_mlp(), (torch.randn(256, 32, generator=torch.Generator().manual_seed(0)),)
    prof = profiler.profile(model, inputs, loss_fn=square_loss, granularity="module:1")
    return model, inputs, prof


def least(model, inputs, prof, **options) -> int:
    with pytest.raises(planner.BudgetInfeasible) as raised:
        planner.plan(model, inputs, budget=1, solver="chen-greedy", loss_fn=square_loss, profile=prof, **options)
    return raised.value.min_budget


def test_finer_groupings_are_distinct_and_finer(setup):
    _, _, prof = setup
    finer = prof.finer()
    assert [p.granularity for p in finer] == ["module:2", "op"]
    sizes = [prof.graph.number_of_nodes()] + [p.graph.number_of_nodes() for p in finer]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert finer[-1].finer() == []


def test_a_finer_grouping_reaches_below_the_profiled_one_and_runs(setup):
    """Below chen-greedy's least peak on module:1 (a block's saved tensors are one node), a plan on a
    finer grouping fits; applied, it gives the original's gradients within the budget, measured."""
    model, inputs, prof = setup
    coarse = least(model, inputs, prof, granularity="module:1")  # the given grouping only
    searched = least(model, inputs, prof)
    assert searched < coarse
    budget = coarse - 1
    plan = planner.plan(model, inputs, budget=budget, solver="chen-greedy", loss_fn=square_loss, profile=prof)
    assert plan.granularity in ("module:2", "op") and "grouping" in plan.schedule.info.message
    assert plan.predicted_peak_bytes <= budget
    planned = planner.apply(model, plan)
    measured = profiler.measure_step(planned, inputs, loss_fn=square_loss, repeats=1)
    assert measured.peak_bytes <= budget
    reference = training_step(model, inputs, square_loss)
    loss, grads, rng = training_step(planned, inputs, square_loss)
    assert torch.equal(loss, reference[0]) and torch.equal(rng, reference[2])
    assert max_relative_error(reference[1], grads) <= 1e-5


def test_never_costlier_than_the_profiled_grouping(setup):
    model, inputs, prof = setup
    for solver in ("dp", "chen-greedy", "auto"):
        for budget in ("70%", "90%"):
            given = planner.plan(model, inputs, budget=budget, solver=solver, loss_fn=square_loss, profile=prof,
                                 granularity="module:1", time_limit=2, executor="traced")
            searched = planner.plan(model, inputs, budget=budget, solver=solver, loss_fn=square_loss, profile=prof,
                                    time_limit=2, executor="traced")
            assert given.granularity == "module:1"
            assert searched.predicted_seconds <= given.predicted_seconds * (1 + 1e-9), (solver, budget)
            assert searched.predicted_peak_bytes <= searched.budget_bytes


@pytest.mark.parametrize("solver", ["auto", "store-all"])
def test_store_all_on_a_finer_grouping_when_it_fits_there_only(setup, solver):
    """A block node is freed only as a whole, after the block's backward is done with all of it:
    store-all on module:1 holds more than on the finer groupings (the benchmark residual MLP:
    325.6 MiB against eager's 318.5). At a budget only a finer grouping's store-all meets, nothing
    is recomputed (before: auto recomputed, store-all was refused)."""
    from planner.footprint import held_besides_schedule
    from solvers import simulate
    from solvers.store_all import store_all_schedule

    model, inputs, prof = setup

    def store_all_peak(grouping) -> int:
        graph = grouping.graph
        return held_besides_schedule(graph) + simulate(graph, store_all_schedule(graph)).peak_bytes

    budget = min(store_all_peak(finer) for finer in prof.finer())
    assert budget < store_all_peak(prof)
    plan = planner.plan(model, inputs, budget=budget, solver=solver, loss_fn=square_loss, profile=prof,
                        executor="traced")
    assert plan.granularity != "module:1" and plan.schedule.info.method == "store-all"
    assert plan.predicted_seconds == pytest.approx(plan.unplanned_seconds)
    measured = profiler.measure_step(planner.apply(model, plan), inputs, loss_fn=square_loss, repeats=1)
    assert measured.peak_bytes <= budget
