"""Models the tracer cannot follow get native plans from an eager step (planner/untraced.py,
profiler/eager.py): an MoE routing each token to its top-2 experts (data-dependent shapes, an expert
no token chose skipped) and blocks with Python control flow on a tensor's value, dropout on in both."""

import copy
import json
import warnings

import pytest
import torch

import planner
import profiler
from benchmarks.zoo_models import _control_flow, _sparse_moe
from models import gpt2, gpt2_inputs
from planner.native_plan import NativePlan
from planner.planfile import PlanWarning
from runtime.native import native_regions
from solvers.regions import evaluate

BUDGETS = ("50%", "75%")
PREDICTION_TOLERANCE = 0.02  # of the measured peak, as for traced models (benchmarks/zoo.py)
MODELS = {"sparse-moe": _sparse_moe, "control-flow": _control_flow}


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request):
    """(name, build, {budget: plan}) for one model, planned at each budget."""
    build = MODELS[request.param]
    model, inputs, loss_fn = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # step times on a loaded machine
        first = planner.plan(model, inputs, BUDGETS[0], loss_fn=loss_fn)
        # The other budgets on the first plan's eager profile: planned as the first, not recorded again.
        plans = {budget: planner.plan(model, inputs, budget, loss_fn=loss_fn, profile=first.profile)
                 for budget in BUDGETS[1:]}
    return request.param, build, {BUDGETS[0]: first, **plans}


def test_an_untraceable_model_gets_a_native_plan_that_says_how_it_was_profiled(planned):
    _, _, plans = planned
    for plan in plans.values():
        assert isinstance(plan, NativePlan) and plan.method == "regions" and plan.regions
        assert "profiled from an eager step" in plan.schedule.info.message
        assert "Predicted peak" in plan.summary() and "FALLBACK" not in plan.summary()
    assert len(plans["50%"].regions) >= 1 and plans["50%"].predicted_peak_bytes < plans["75%"].predicted_peak_bytes


def test_the_prediction_is_within_two_percent_of_the_measured_peak_and_the_budget_holds(planned):
    _, build, plans = planned
    for budget, plan in plans.items():
        model, inputs, loss_fn = build()
        planner.apply(model, plan)
        measured = profiler.measure_step(model, inputs, loss_fn=loss_fn, repeats=1).peak_bytes
        assert measured <= plan.budget_bytes, budget
        assert abs(plan.predicted_peak_bytes - measured) <= PREDICTION_TOLERANCE * measured, (budget, plan.summary())
        assert plan.measured_peak_bytes == measured  # the plan's own measurement: the same step, the same bytes


def _train(model, inputs, loss_fn, steps: int = 4):
    """``steps`` AdamW steps from one seed (dropout draws from it); the losses and the parameters after."""
    torch.manual_seed(7)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        # a new batch each step (the routing changes with it); token ids stay as they are
        batch = tuple(x + 0.1 * step if x.is_floating_point() else x for x in inputs)
        optimizer.zero_grad()
        loss = loss_fn(model(*batch))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_training_with_the_plan_is_bit_identical_to_training_without(planned):
    _, build, plans = planned
    model, inputs, loss_fn = build()
    reference = copy.deepcopy(model)
    planner.apply(model, plans["50%"])
    assert sorted(native_regions(model)) == sorted(plans["50%"].regions)
    assert model.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    losses0, params0 = _train(reference, inputs, loss_fn)
    losses1, params1 = _train(model, inputs, loss_fn)
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses1))
    assert all(torch.equal(params0[name], params1[name]) for name in params0)


def test_the_plan_saves_loads_and_applies_like_any_native_plan(planned, tmp_path):
    _, build, plans = planned
    plan = plans["75%"]
    plan.save(tmp_path / "plan.json")
    assert json.loads((tmp_path / "plan.json").read_text())["format"] == "plan-checkpoints/native/1"
    loaded = planner.load(tmp_path / "plan.json")
    assert isinstance(loaded, NativePlan) and loaded.regions == plan.regions
    model = build()[0]
    assert planner.apply(model, loaded) is model and sorted(native_regions(model)) == sorted(plan.regions)


def test_the_eager_graph_predicts_the_unplanned_step_it_recorded(planned):
    """Without checkpointing, the recorded graph's store-all peak is the measured step's (the same
    allocations, counted by the same allocator events), to a fraction of a percent; forward and
    backward ops carry the module that ran them."""
    name, _, plans = planned
    graph = plans["50%"].profile.graph
    predicted = graph.graph["fixed_bytes"] + graph.graph["loss_value_bytes"] + evaluate(graph, ()).outcome.peak_bytes
    measured = plans["50%"].unplanned_peak_bytes  # "N%": the eager step measured before planning
    assert abs(predicted - measured) <= 0.005 * measured
    assert {data["kind"] for _, data in graph.nodes(data=True)} == {"forward", "loss", "backward"}
    leaf = "layers.0.1.experts.0.0" if name == "sparse-moe" else "blocks.0.up"
    for kind in ("forward", "backward"):
        assert any(d["kind"] == kind and d["module"] == leaf for _, d in graph.nodes(data=True)), kind


def test_a_budget_below_the_least_plan_is_refused_as_for_a_traced_model(planned):
    _, build, plans = planned
    model, inputs, loss_fn = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        with pytest.raises(planner.BudgetInfeasible, match=r"budget 5% \(.*\) is below the least"):
            planner.plan(model, inputs, "5%", loss_fn=loss_fn, profile=plans["50%"].profile)


class GatedGPT2(torch.nn.Module):
    """A Hugging Face GPT-2 (from its config, dropout on) whose loss is scaled when the logits' mean
    is positive: control flow on a value after a model the tracer follows by itself."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lm = gpt2(layers=2, embd=64, heads=2, vocab=500, positions=64)
        self.lm.config.use_cache = False

    def forward(self, input_ids):
        out = self.lm(input_ids=input_ids, labels=input_ids)
        return out.loss * 2 if out.logits.mean() > 0 else out.loss


def test_a_hugging_face_model_behind_control_flow_is_planned_natively():
    model, inputs = GatedGPT2(), (gpt2_inputs(batch=4, tokens=64, vocab=500)["input_ids"],)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        plan = planner.plan(model, inputs, "50%")
    assert isinstance(plan, NativePlan) and "profiled from an eager step" in plan.schedule.info.message
    planner.apply(model, plan)
    measured = profiler.measure_step(model, inputs, repeats=1).peak_bytes
    assert measured <= plan.budget_bytes
    assert abs(plan.predicted_peak_bytes - measured) <= PREDICTION_TOLERANCE * measured
    losses0, params0 = _train(reference, inputs, lambda loss: loss, steps=3)
    losses1, params1 = _train(model, inputs, lambda loss: loss, steps=3)
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses1))
    assert all(torch.equal(params0[name], params1[name]) for name in params0)


UNTRACEABLE_MODEL_FILE = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.drop, self.down = nn.Linear(32, 128), nn.Dropout(0.1), nn.Linear(128, 32)

    def forward(self, x):
        h = self.down(self.drop(torch.tanh(self.up(x))))
        return x + (h * 2 if h.mean() > 0 else h)  # control flow on a value: not traceable

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(4)])

def example_inputs():
    return (torch.randn(128, 32, generator=torch.Generator().manual_seed(0)),)
"""


def test_the_command_line_plans_an_untraceable_model_natively(tmp_path):
    from test_cli import model_file, run

    out = tmp_path / "plan.json"
    result = run(model_file(tmp_path, UNTRACEABLE_MODEL_FILE), "--budget", "60%", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Could not trace the model" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["figures"] == "predicted" and summary["fallback"] is None
    assert "profiled from an eager step" in summary["message"]
    assert summary["predicted_peak_bytes"] <= summary["budget_bytes"]
    assert json.loads(out.read_text())["format"] == "plan-checkpoints/native/1"
