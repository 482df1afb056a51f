"""plan(..., compile=True): native regions priced on the compiled step (planner/compiled.py).

The search's logic is tested with the compiled measurement replaced by a deterministic stand-in (the
eager step's measured peak, scaled down as inductor's is), so that no test compiles more than it
must; one test compiles for real and checks the gradients of the planned compiled model against the
unplanned compiled model's.
"""

import copy
import json

import pytest
import torch

import planner
import planner.compiled as compiled
from models import max_relative_error, mlp, residual_mlp, training_step
from planner.compiled import CompiledCandidate, CompiledNativePlan, choose
from planner.native_measure import measure_native
from runtime.native import native_regions, remove_native
from planner.planfile import PlanFileError
from profiler.memory import StepMeasurement

SHRINK = 0.7  # the stand-in compiled step holds this share of the eager step's activations


@pytest.fixture
def stand_in(monkeypatch):
    """measure_compiled without compiling: the eager step with the regions checkpointed, measured,
    its activations scaled by SHRINK; records the region sets asked for."""
    asked = []

    def measure(model, regions, example_inputs, loss_fn, repeats=1):
        asked.append(tuple(regions))
        eager = measure_native(model, regions, example_inputs, loss_fn)
        peak = eager.resident_bytes + int(SHRINK * eager.step_peak_bytes)
        return StepMeasurement(peak, eager.resident_bytes, peak - eager.resident_bytes, eager.seconds, 1, "cpu")

    monkeypatch.setattr(compiled, "measure_compiled", measure)
    return asked


@pytest.fixture(scope="module")
def small():
    """A residual MLP, its inputs and its profile (profiled once for the tests that plan it; the
    plans leave the model as it was)."""
    torch.manual_seed(0)
    model, inputs = residual_mlp(width=64, hidden=256, depth=4), (torch.randn(256, 64),)
    return model, inputs, planner.profile_for(model, inputs)


def test_compile_is_for_the_native_executor(small):
    model, inputs, _ = small
    for options in ({"solver": "dp"}, {"executor": "traced"}):
        with pytest.raises(ValueError, match="executor='native'") as error:
            planner.plan(model, inputs, "50%", compile=True, **options)
        assert isinstance(error.value, planner.SolverError)
    with pytest.raises(ValueError, match="distributed"):
        planner.plan(model, inputs, "50%", compile=True, distributed="ddp")


def test_percent_of_the_compiled_step_and_regions_that_fit_it(stand_in, small, tmp_path):
    model, inputs, profile = small
    plan = planner.plan(model, inputs, "60%", compile=True, profile=profile)
    assert isinstance(plan, CompiledNativePlan) and plan.executor == "native"
    none = plan.candidates[0]
    assert none.regions == () and stand_in[0] == ()
    assert plan.unplanned_peak_bytes == none.peak_bytes  # "N%" is of the compiled un-checkpointed step
    assert plan.budget_bytes == int(0.6 * none.peak_bytes)
    assert plan.regions and plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.predicted_peak_bytes == plan.measured_peak_bytes  # the compiled figures are measured
    assert 2 <= plan.compiles == len(set(stand_in)) == len(stand_in) <= compiled.MAX_COMPILES  # no set twice
    chosen = next(c for c in plan.candidates if c.regions == plan.regions)
    assert chosen.peak_bytes == plan.measured_peak_bytes and chosen.eager_target_bytes is not None
    # Priced compiled, the plan needs less than the eager plan for the same bytes: the compiled
    # step holds less, so the eager target it was searched at is above the budget.
    assert chosen.eager_target_bytes > plan.budget_bytes
    assert "compiled" in plan.summary() and "torch.compile(planner.apply(model, plan))" in plan.summary()
    assert plan.to_dict()["compiled"]["compiles"] == plan.compiles
    plan.save(tmp_path / "plan.json")  # the native format, its compiled figures in a section of their own
    loaded = planner.load(tmp_path / "plan.json")
    assert isinstance(loaded, CompiledNativePlan) and loaded.regions == plan.regions
    assert (loaded.candidates, loaded.compiles, loaded.measured_peak_bytes) == (
        plan.candidates, plan.compiles, plan.measured_peak_bytes)
    assert loaded.summary() == plan.summary()
    data = plan.to_dict()
    data["compiled"]["candidates"][0]["peak_bytes"] = "many"
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match="peak_bytes"):
        planner.load(tmp_path / "edited.json")
    assert not hasattr(model.get_submodule("0"), "_native_region")  # the search leaves the model as it was
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_nothing_checkpointed_when_the_compiled_step_fits(stand_in, small):
    model, inputs, profile = small
    plan = planner.plan(model, inputs, "100%", compile=True, profile=profile)
    assert plan.regions == () and plan.compiles == 1 and stand_in == [()]
    # An eager "100%" would be the eager peak; this budget is the compiled one, measured.
    assert plan.budget_bytes == plan.unplanned_peak_bytes == plan.measured_peak_bytes


def test_refused_with_the_least_compiled_peak_measured(stand_in, small):
    model, inputs, profile = small
    with pytest.raises(planner.BudgetInfeasible) as error:
        planner.plan(model, inputs, 300_000, compile=True, profile=profile)
    minimum = error.value.min_budget
    assert minimum > 300_000 and stand_in[-1]  # the last compile is the eager search's least plan
    assert "below every compiled step measured" in str(error.value)
    measured = compiled.measure_compiled(model, stand_in[-1], inputs, None)
    assert minimum == measured.peak_bytes


def test_checkpoint_with_compile_plans_priced_compiled_and_compiles_in_place(stand_in, small):
    """planner.checkpoint(..., compile=True) on the native executor: the compile-priced plan's
    regions, and the same model object compiled in place (its state_dict keys unchanged)."""
    model, inputs, profile = small
    model = copy.deepcopy(model)
    keys = list(model.state_dict())
    returned = planner.checkpoint(model, inputs, "60%", compile=True, profile=profile)
    try:
        assert returned is model and list(model.state_dict()) == keys
        assert model._compiled_call_impl is not None  # nn.Module.compile's in-place compiled call
        assert native_regions(model) and any(set(c) == set(native_regions(model)) for c in stand_in)  # compiled, measured
    finally:
        remove_native(model)


def test_ties_go_to_the_least_recomputation():
    def candidate(regions, seconds, predicted):
        return CompiledCandidate(regions, 1, 1, predicted, 1, seconds, 0.0)

    slow_few = candidate(("a",), 1.02, 1.0)
    fast_many = candidate(("a", "b"), 1.00, 1.5)
    assert choose([slow_few, fast_many]) is slow_few  # within TIE: the lesser recomputation
    assert choose([candidate(("a",), 1.2, 1.0), fast_many]) is fast_many  # beyond it: the faster


def _gradients_match(model, plan, inputs):
    reference = copy.deepcopy(model)
    planned = torch.compile(planner.apply(model, plan))
    unplanned = torch.compile(reference)
    for seed in (1, 2):  # the first step compiles, the second runs the compiled code
        loss0, grads0, rng0 = training_step(unplanned, inputs, seed=seed)
        loss1, grads1, rng1 = training_step(planned, inputs, seed=seed)
        assert torch.allclose(loss0, loss1, rtol=1e-5)
        assert max_relative_error(grads0, grads1) < 1e-5  # fused kernels: to rounding, not to the bit
        assert torch.equal(rng0, rng1)


def test_compiled_plan_gradients_equal_the_compiled_model_without_it(stand_in):
    """A plan's regions under torch.compile, on a small model with dropout: the loss and gradients of
    two steps equal the model's compiled without checkpointing (the same dropout masks), to rounding.
    The plan's search uses the stand-in measurement (compiling only the two models compared)."""
    torch._dynamo.reset()
    model, inputs = mlp(width=64, depth=4, dropout=0.1), (torch.randn(512, 64),)
    plan = planner.plan(model, inputs, "70%", compile=True)
    assert plan.regions
    _gradients_match(model, plan, inputs)
    torch._dynamo.reset()


@pytest.mark.slow  # several real compiles; the two tests above cover the search and the gradients
def test_compiled_search_for_real_then_gradients():
    torch._dynamo.reset()
    model, inputs = mlp(width=64, depth=4, dropout=0.1), (torch.randn(512, 64),)
    plan = planner.plan(model, inputs, "70%", compile=True)
    assert plan.regions and plan.measured_peak_bytes <= plan.budget_bytes
    check = compiled.measure_compiled(model, plan.regions, inputs, None, repeats=1)
    assert check.peak_bytes == plan.measured_peak_bytes  # measured as the user's compiled step measures
    _gradients_match(model, plan, inputs)
    torch._dynamo.reset()
