"""Issue 28 item 3, the API side: where only the traced executor reaches a budget, ``planner.plan``
returns its plan with a notice (planner/executor_choice.py); pinned to the native executor the
refusal stands and points at the traced one; a budget neither reaches is refused naming each one's
least. Native plans carry the order-free bound beside their time (planner/unrestricted.py).

The model: a chain of matmuls, tanh and dropout applied with functional ops in the root's own
forward (its weights a ``ParameterList``, never called). No module computes anything, so the native
executor has nothing to wrap: its least budget is the un-checkpointed step. The traced executor
recomputes any op and reaches about 40% of it."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import planner
import profiler
from planner.planfile import PlanFileError, PlanWarning
from planner.unrestricted import held_by_any_executor, order_free_bound_within
from test_cli import error_lines, model_file, run

ROOT_OPS_MODEL = """
import torch
from torch import nn


class RootOps(nn.Module):
    def __init__(self, width=64, depth=4):
        super().__init__()
        torch.manual_seed(0)
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(width, width) / width ** 0.5)
                                         for _ in range(depth)])

    def forward(self, x):
        for w in self.weights:
            x = torch.nn.functional.dropout(torch.tanh(x @ w), 0.1, self.training)
        return x


def build_model():
    return RootOps()


def example_inputs():
    return (torch.randn(256, 64, generator=torch.Generator().manual_seed(0)),)
"""


def _built():
    namespace: dict = {}
    exec(compile(ROOT_OPS_MODEL, "root_ops_model", "exec"), namespace)
    return namespace["build_model"](), namespace["example_inputs"]()


@pytest.fixture(scope="module")
def leasts():
    """(native least, traced least) in whole-step bytes, from the refusals of a 1-byte budget: the
    pinned native one's and the default's, which names both."""
    model, inputs = _built()
    with pytest.raises(planner.BudgetInfeasible) as pinned:
        planner.plan(model, inputs, budget=1, executor="native")
    with pytest.raises(planner.BudgetInfeasible) as both:
        planner.plan(model, inputs, budget=1)
    native, least = pinned.value.min_budget, both.value.min_budget
    message = str(both.value)
    assert f"({native} bytes" in message and f"({least} bytes)" in message, message
    assert "does not reach it either" in message
    assert least < native  # the traced executor reaches less: the refusal's figure is its least
    return native, least


def _between(leasts) -> int:
    native, traced = leasts
    return (native + traced) // 2


def test_a_budget_only_the_traced_executor_reaches_is_planned_by_it_with_a_notice(leasts, tmp_path):
    native_least, _ = leasts
    budget = _between(leasts)
    model, inputs = _built()
    with pytest.warns(PlanWarning, match="below what the native executor") as warned:
        made = planner.plan(model, inputs, budget=budget)
    assert not isinstance(made, planner.NativePlan)
    assert made.predicted_peak_bytes <= budget < native_least
    assert f"({native_least} bytes)" in made.executor_notice and "executor='native'" in made.executor_notice
    assert any(str(w.message) == made.executor_notice for w in warned)
    assert "Executor:          traced, chosen by the planner" in made.summary()
    path = tmp_path / "plan.json"
    made.save(path)
    assert planner.load(path).executor_notice == made.executor_notice

    # It trains as the model does, within the budget: its measured peak, the same loss and gradients
    # from the same seed (dropout on), then several optimizer steps. The loss is the one planned for
    # (loss_fn=None: the sum of the output).
    reference, _ = _built()
    planned = planner.apply(model, made)
    assert all(a is b for a, b in zip(planned.parameters(), model.parameters()))
    measured = profiler.measure_step(planned, inputs, repeats=1)
    assert measured.peak_bytes <= budget, (measured.peak_bytes, budget)
    losses = []
    for module in (reference, planned):
        module.zero_grad(set_to_none=True)  # measure_step leaves its steps' gradients
        torch.manual_seed(7)
        losses.append(module(*inputs).sum())
        losses[-1].backward()
    torch.testing.assert_close(losses[0], losses[1])
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(4):
        optimizer.zero_grad(set_to_none=True)
        loss = planned(*inputs).sum()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("pin", [{"executor": "native"}, {"solver": "regions"}])
def test_pinned_to_the_native_executor_the_refusal_stands_and_points_at_the_traced_one(leasts, pin):
    native_least, _ = leasts
    model, inputs = _built()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # no traced plan, no notice
        with pytest.raises(planner.BudgetInfeasible) as refused:
            planner.plan(model, inputs, budget=_between(leasts), **pin)
    assert refused.value.min_budget == native_least
    assert "executor='traced'" in str(refused.value) and "may reach it" in str(refused.value)


@pytest.mark.slow  # tests/test_hostile_limits.py plans a default refusal's least budget too
def test_the_least_budget_of_a_refusal_plans(leasts):
    _, traced_least = leasts
    model, inputs = _built()
    with pytest.warns(PlanWarning, match="below what the native executor"):
        made = planner.plan(model, inputs, budget=traced_least)
    assert made.predicted_peak_bytes <= traced_least


def test_what_the_traced_executor_does_not_count_keeps_the_native_refusal(leasts):
    model, inputs = _built()
    with pytest.raises(planner.BudgetInfeasible, match="cannot stand in here: it does not count distributed="):
        planner.plan(model, inputs, budget=_between(leasts), distributed="ddp")


def test_the_command_line_plans_it_traced_and_says_why(leasts, tmp_path):
    native_least, _ = leasts
    budget = _between(leasts)
    out = tmp_path / "plan.json"
    # With a device memory, both executors profile within the budget (planner/bounded.py).
    result = run(model_file(tmp_path, ROOT_OPS_MODEL), "--budget", budget, "--out", out, "--json",
                 "--device-memory", 4 * native_least)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["executor"] == "traced" and f"({native_least} bytes)" in summary["executor_notice"]
    assert summary["predicted_peak_bytes"] <= budget
    warnings_ = [line for line in error_lines(result.stderr) if line.startswith("plan-checkpoints: warning: ")]
    assert any("below what the native executor" in line for line in warnings_), result.stderr
    assert planner.load(out).executor_notice == summary["executor_notice"]


# -- the class's cost beside a native plan -------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_3():
    from models import gpt2, gpt2_inputs, hf_loss

    model, inputs = gpt2(layers=3, embd=64, heads=2, vocab=256, positions=64), gpt2_inputs(batch=2, tokens=64, vocab=256)
    return model, inputs, hf_loss, planner.profile_for(model, inputs, loss_fn=hf_loss)


@pytest.mark.parametrize("budget", ["60%", "80%"])
def test_the_unrestricted_bound_is_below_the_native_optimum(gpt2_3, budget, tmp_path):
    model, inputs, loss_fn, profile = gpt2_3
    made = planner.plan(model, inputs, budget=budget, loss_fn=loss_fn, profile=profile)
    assert isinstance(made, planner.NativePlan) and made.regions
    # The plan's own bound is time-limited (a share of the planning time): either a bound or a note.
    if made.unrestricted_seconds is None:
        assert made.unrestricted_note.startswith("not computed")
    else:
        assert made.unplanned_seconds * (1 - 1e-9) <= made.unrestricted_seconds <= made.predicted_seconds
        assert "unrestricted bound +" in made.summary()
    # Given the time, the same bound on the same graph and budget: below the native optimum's time.
    graph = profile.regroup("op").graph
    bound = order_free_bound_within(graph, made.budget_bytes - held_by_any_executor(made, graph), seconds=2)
    assert bound.seconds is not None, bound.note
    assert made.unplanned_seconds * (1 - 1e-9) <= bound.seconds <= made.predicted_seconds
    # Kept in the plan file; a file from before it was recorded loads without one; an edited one is refused.
    made.unrestricted_seconds, made.unrestricted_note = bound.seconds, bound.note
    path = tmp_path / "plan.json"
    made.save(path)
    loaded = planner.load(path)
    assert (loaded.unrestricted_seconds, loaded.unrestricted_note) == (bound.seconds, bound.note)
    data = json.loads(path.read_text())
    old = {k: v for k, v in data.items() if k not in ("unrestricted_seconds", "unrestricted_note")}
    path.write_text(json.dumps(old))
    assert planner.load(path).unrestricted_seconds is None
    path.write_text(json.dumps({**data, "unrestricted_seconds": made.predicted_seconds * 2}))
    with pytest.raises(PlanFileError, match="unrestricted bound"):
        planner.load(path)
