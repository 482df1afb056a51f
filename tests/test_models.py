"""Real-world model kinds: the planned module's gradients equal the unplanned model's.

Every traced model runs the heaviest schedule there is, "recompute everything" (each forward node
computed again in the backward), so each kind of op is recomputed at least once. The comparison is
exact (relative error 0) where the ops are the same, which they are: the planned step runs the
traced aten ops of the original step in the same dtypes. Dropout (test_runtime.py) and BatchNorm's
running statistics (test_runtime.py) are covered there; here they appear inside other models.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import planner
import profiler
import runtime
from models import gpt2, gpt2_inputs, hf_loss, max_relative_error, training_step
from schedules import recompute_everything, with_schedule


def recomputing_plan(model, inputs, loss_fn=None):
    """A plan of ``model`` whose schedule recomputes every forward node in the backward."""
    plan = planner.plan(model, inputs, budget="100%", solver="store-all", loss_fn=loss_fn)
    return with_schedule(plan, recompute_everything(plan.graph))


def assert_same_step(original, planned, inputs, loss_fn):
    loss0, grads0, rng0 = training_step(original, inputs, loss_fn)
    loss1, grads1, rng1 = training_step(planned, inputs, loss_fn)
    assert torch.equal(loss0, loss1)
    assert max_relative_error(grads0, grads1) == 0.0
    assert torch.equal(rng0, rng1)
    return grads1


# -- keyword and dict inputs; dict, tuple and non-tensor outputs -------------------------------------
class KeywordModel(nn.Module):
    """Keyword arguments (a tensor, a float, a default left out), a dict output with a nested tuple
    holding a non-tensor."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(8, 8), nn.Linear(8, 8), nn.Dropout(0.2)

    def forward(self, x, mask=None, scale=1.0, unused=None):
        h = self.drop(torch.tanh(self.a(x))) * scale
        if mask is not None:
            h = h * mask
        return {"out": self.b(h), "aux": (h.mean(), 3), "note": "text"}


def keyword_loss(output):
    return output["out"].pow(2).sum() + output["aux"][0]


def test_keyword_inputs_and_dict_output(tmp_path):
    model = KeywordModel()
    inputs = {"x": torch.randn(4, 8), "mask": (torch.rand(4, 8) > 0.5).float(), "scale": 2.0}
    plan = recomputing_plan(model, inputs, keyword_loss)
    planned = planner.apply(model, plan)
    output = planned(**inputs)
    assert set(output) == {"out", "aux", "note"} and output["aux"][1] == 3 and output["note"] == "text"
    assert_same_step(model, planned, inputs, keyword_loss)
    plan.save(tmp_path / "plan.json")  # a saved plan re-traces the keyword call
    assert_same_step(model, planner.apply(model, planner.load(tmp_path / "plan.json")), inputs, keyword_loss)
    with pytest.raises(runtime.InputMismatch, match="non-tensor input"):
        planned(**{**inputs, "scale": 3.0})


# -- several losses, a tuple output, frozen parameters ---------------------------------------------------
class TwoLosses(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.regress, self.classify = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 3)
        self.trunk.weight.requires_grad_(False)  # frozen: a resident input of the graph, no gradient

    def forward(self, x, target):
        h = torch.tanh(self.trunk(x))
        return (self.regress(h) - target).pow(2).mean(), nn.functional.cross_entropy(self.classify(h), target.long().view(-1) % 3)


def sum_of_losses(output):
    return output[0] + output[1]


def test_several_losses_and_frozen_parameters():
    model = TwoLosses()
    inputs = (torch.randn(6, 8), torch.randint(0, 3, (6, 1)).float())
    plan = recomputing_plan(model, inputs, sum_of_losses)
    grads = assert_same_step(model, planner.apply(model, plan), inputs, sum_of_losses)
    assert "trunk.weight" not in grads and "trunk.bias" in grads
    assert model.trunk.weight.grad is None


# -- in-place ops and views, BatchNorm with an in-place ReLU -------------------------------------------
class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.norm, self.relu = nn.BatchNorm1d(8), nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.a(x)
        h.add_(x)  # x.add_(y) on an activation
        h = self.relu(self.norm(h))  # the classic in-place ReLU after BatchNorm
        g = self.b(h)
        g[:, :4] = h[:, 4:] * 2  # slicing assignment on an activation
        g.view(-1)[::3].mul_(1.5)  # in place through a strided view
        return torch.relu_(g)


def test_in_place_ops_and_views():
    original, twin = InPlace(), InPlace()
    inputs = (torch.randn(6, 8),)
    planned = planner.apply(twin, recomputing_plan(twin, inputs))
    assert_same_step(original, planned, inputs, None)
    for a, b in zip(original.buffers(), twin.buffers()):  # running statistics: once per step, same values
        assert torch.equal(a, b)


def test_an_input_changed_in_place():
    """x.mul_(2) on the caller's tensor: changed once, as by the original, and the backward's
    recomputations read the value from before the step (runtime/executor.py)."""

    class ScalesItsInput(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            x.mul_(2)
            return torch.relu(self.a(x))

    model, x = ScalesItsInput(), torch.randn(3, 4)
    planned = planner.apply(model, recomputing_plan(model, (x.clone(),)))
    original_input, planned_input = x.clone(), x.clone()
    loss0, grads0, _ = training_step(model, (original_input,))
    loss1, grads1, _ = training_step(planned, (planned_input,))
    assert torch.equal(original_input, x * 2) and torch.equal(planned_input, x * 2)
    assert torch.equal(loss0, loss1) and max_relative_error(grads0, grads1) == 0.0


# -- tied parameters: Hugging Face GPT-2's embeddings are its output projection ---------------------------
def test_gpt2_tied_embeddings():
    model, inputs = gpt2(layers=1, embd=32, vocab=100, positions=16), gpt2_inputs(batch=2, tokens=16, vocab=100)
    assert model.lm_head.weight is model.transformer.wte.weight
    planned = planner.apply(model, recomputing_plan(model, inputs, hf_loss))
    assert planned.lm_head.weight is planned.transformer.wte.weight
    grads = assert_same_step(model, planned, inputs, hf_loss)
    assert "transformer.wte.weight" in grads and "lm_head.weight" not in grads  # one parameter, both uses


# -- torch.autocast -----------------------------------------------------------------------------------
def test_bf16_autocast_plan_runs_under_the_same_autocast(tmp_path):
    """The plan records autocast; the traced graph holds the casts, so the runtime runs it with
    autocast off (docs/runtime.md). Same kernels, same dtypes: the gradients are bit-identical to the
    unplanned model's under the same autocast (investigated: CPU bf16 matmuls are deterministic)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.LayerNorm(32),
                          nn.Linear(32, 4))
    inputs = (torch.randn(8, 16),)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plan = recomputing_plan(model, inputs)
    assert plan.autocast == "cpu:bfloat16" and "autocast" in plan.summary()
    planned = planner.apply(model, plan)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert planned(*inputs).dtype == torch.bfloat16
        assert_same_step(model, planned, inputs, None)
    with pytest.raises(runtime.PlanMismatch, match=r"made under torch.autocast \(cpu:bfloat16\).*no autocast"):
        planned(*inputs)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(runtime.PlanMismatch, match="cpu:float16"):
        planned(*inputs)
    plan.save(tmp_path / "plan.json")
    loaded = planner.load(tmp_path / "plan.json")
    assert loaded.autocast == "cpu:bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_same_step(model, planner.apply(model, loaded), inputs, None)
    with torch.no_grad():  # inference runs the original forward, under whatever autocast
        planned(*inputs)


def test_gpt2_under_bf16_autocast():
    model, inputs = gpt2(layers=1, embd=32, vocab=100, positions=16), gpt2_inputs(batch=2, tokens=16, vocab=100)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        planned = planner.apply(model, recomputing_plan(model, inputs, hf_loss))
        assert_same_step(model, planned, inputs, hf_loss)


def test_a_plan_made_without_autocast_is_refused_under_autocast():
    model, inputs = nn.Linear(4, 4), (torch.randn(2, 4),)
    planned = planner.checkpoint(model, inputs, budget="100%", solver="store-all")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(runtime.PlanMismatch, match="no autocast"):
        planned(*inputs)


# -- Python control flow the tracer cannot follow: a native plan from an eager step -------------------------
class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear, self.drop = nn.Linear(width, width), nn.Dropout(0.1)

    def forward(self, x):
        h = self.drop(torch.tanh(self.linear(x)))
        if h.mean() > 0:  # data-dependent: make_fx cannot follow it
            h = h * 2
        return x + h


class Untraceable(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 6):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


UNTRACEABLE_INPUTS = (torch.randn(64, 64, generator=torch.Generator().manual_seed(3)),)
# A plan file of the format such models got before they got native plans (planner/fallback.py),
# written by that version of planner.plan(Untraceable(), UNTRACEABLE_INPUTS, budget="90%").
MODULE_CHAIN_PLAN = Path(__file__).parent / "data" / "module-chain-plan.json"


@pytest.fixture(scope="module")
def untraced():
    model = Untraceable()
    with pytest.raises(profiler.TraceError):
        profiler.profile(model, UNTRACEABLE_INPUTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = planner.plan(model, UNTRACEABLE_INPUTS, budget="90%")
    return model, plan, caught


def test_untraceable_model_gets_a_native_plan_and_says_how_it_was_profiled(untraced):
    model, plan, caught = untraced
    assert not [w for w in caught if issubclass(w.category, planner.FallbackWarning)]
    assert isinstance(plan, planner.NativePlan) and plan.method == "regions" and plan.regions
    assert "profiled from an eager step: the tracer cannot follow the model" in plan.schedule.info.message
    assert plan.measured_peak_bytes <= plan.budget_bytes < plan.unplanned_peak_bytes
    assert abs(plan.predicted_peak_bytes - plan.measured_peak_bytes) <= 0.02 * plan.measured_peak_bytes
    reference = Untraceable()
    assert planner.apply(model, plan) is model
    assert list(model.state_dict()) == list(reference.state_dict())
    assert_same_step(reference, model, UNTRACEABLE_INPUTS, None)  # dropout replayed: bit-identical
    runtime.remove_native(model)


def test_a_module_chain_plan_file_still_loads_and_applies():
    loaded = planner.load(MODULE_CHAIN_PLAN)
    assert isinstance(loaded, planner.fallback.ModuleChainPlan) and loaded.chain.checkpointed == ("blocks.3", "blocks.4")
    model = Untraceable()
    planned = planner.apply(model, loaded)
    checkpointed = {f"blocks.{i}" for i in range(6) if type(planned.blocks[i]).__name__ == "CheckpointedBlock"}
    assert checkpointed == set(loaded.chain.checkpointed)
    assert all(type(b) is Block for b in model.blocks)  # the original is untouched
    assert all(a is b for a, b in zip(planned.parameters(), model.parameters()))
    assert_same_step(model, planned, UNTRACEABLE_INPUTS, None)
    with pytest.raises(runtime.PlanMismatch, match="different model"):
        planner.apply(Untraceable(width=32), loaded)
    with pytest.raises(runtime.PlanMismatch, match="does not have"):
        planner.apply(Untraceable(blocks=4), loaded)


def test_untraceable_budget_below_the_least_plan(untraced):
    model, _, _ = untraced
    with pytest.raises(planner.BudgetInfeasible, match="below the least"):
        planner.plan(model, UNTRACEABLE_INPUTS, budget=1)


def test_untraceable_model_without_repeated_blocks_is_planned_natively():
    class NoChain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x))) * 2 if x.sum() > 0 else self.b(self.a(x))

    plan = planner.plan(NoChain(), (torch.randn(2, 4),), budget="100%")
    assert isinstance(plan, planner.NativePlan) and plan.regions == ()


def test_outputs_are_rebuilt_with_their_structure():
    """A tuple output with a None and an int among the tensors comes back as the original's."""

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return h, None, (h.sum(), 7)

    model, inputs = Mixed(), (torch.randn(3, 4),)
    planned = planner.apply(model, recomputing_plan(model, inputs, lambda out: out[0].sum() + out[2][0]))
    got, expected = planned(*inputs), model(*inputs)
    assert pytree.tree_structure(got) == pytree.tree_structure(expected)
    assert got[1] is None and got[2][1] == 7
