"""``planner.plan_from_profile``: a traced plan solved on a profile alone (what sweeps and --max-batch
use), the same plan ``planner.plan`` makes from that profile; ``plan`` without a model is refused."""

import pytest
import torch

import planner
import profiler
from solvers import simulate

from models import mlp


@pytest.fixture(scope="module")
def step():
    torch.manual_seed(0)
    model = mlp(width=32, depth=4, dropout=0.0)
    inputs = (torch.randn(512, 32),)  # activations well above the parameters: 60% is reachable
    return model, inputs, profiler.profile(model, inputs)


def test_same_plan_as_plan_on_that_profile(step):
    model, inputs, prof = step
    from_model = planner.plan(model, inputs, "60%", solver="dp", profile=prof, executor="traced")
    alone = planner.plan_from_profile(prof, "60%", solver="dp", model_name=type(model).__name__)
    assert alone.schedule.steps == from_model.schedule.steps
    assert alone.predicted_peak_bytes == from_model.predicted_peak_bytes <= alone.budget_bytes
    assert alone.budget_bytes == from_model.budget_bytes
    assert alone.model == from_model.model == "Sequential"
    assert alone.predicted_seconds > alone.unplanned_seconds  # 60% needs recomputation: not store-all
    assert alone.fixed_bytes + simulate(alone.graph, alone.schedule).peak_bytes == alone.predicted_peak_bytes


def test_budget_out_of_reach_names_the_minimum(step):
    _, _, prof = step
    with pytest.raises(planner.BudgetInfeasible) as caught:
        planner.plan_from_profile(prof, 1, solver="dp")
    assert caught.value.min_budget is not None and caught.value.min_budget > 1


def test_native_solver_is_refused(step):
    _, _, prof = step
    with pytest.raises(planner.SolverError, match="executor='native'"):
        planner.plan_from_profile(prof, "60%", solver="regions")


def test_plan_without_a_model_points_at_plan_from_profile(step):
    _, _, prof = step
    with pytest.raises(TypeError, match="plan_from_profile"):
        planner.plan(None, None, "60%", profile=prof)
