"""The rewritten module: same gradients, RNG and buffers as the original; shared parameters."""

import pytest
import torch

import planner
import runtime
from models import TwoBranches, cnn, gpt2, gpt2_inputs, hf_loss, max_relative_error, mlp, training_step
from schedules import recompute_everything, saved_forward_node, thrice, with_schedule
from solvers.graph import topological_order
from solvers import schedule_from_computes


@pytest.fixture(scope="module")
def mlp_setup():
    model, inputs = mlp(), (torch.randn(16, 64),)
    return model, inputs, planner.plan(model, inputs, budget="100%", solver="store-all")


def _check_same_step(original, planned, inputs, loss_fn=None):
    loss0, grads0, rng0 = training_step(original, inputs, loss_fn)
    loss1, grads1, rng1 = training_step(planned, inputs, loss_fn)
    assert torch.equal(loss0, loss1)
    assert max_relative_error(grads0, grads1) == 0.0  # bit-identical: same ops, same random masks
    assert torch.equal(rng0, rng1)  # the global RNG ends where an unplanned step leaves it


@pytest.mark.parametrize("schedule", ["store-all", "recompute-everything", "thrice-random", "thrice-plain"])
def test_gradients_and_rng_equal_the_original(mlp_setup, schedule):
    model, inputs, plan = mlp_setup
    g = plan.graph
    if schedule == "recompute-everything":
        plan = with_schedule(plan, recompute_everything(g))
    elif schedule.startswith("thrice"):
        plan = with_schedule(plan, thrice(g, saved_forward_node(g, random=schedule == "thrice-random")))
    _check_same_step(model, planner.apply(model, plan), inputs)


def test_random_branches_computed_out_of_trace_order():
    """The schedule runs the second dropout branch first: a pre-pass replays the draws in trace order."""
    model, inputs = TwoBranches(), (torch.randn(8, 32),)
    plan = planner.plan(model, inputs, budget="100%", solver="store-all")
    g = plan.graph
    random = [n for n in topological_order(g) if g.nodes[n].get("random")]
    assert len(random) == 2
    first, second = random
    order = topological_order(g)
    # move the second random group (and what it needs that comes after the first) ahead of the first
    needed = [n for n in order if n in __import__("networkx").ancestors(g, second) | {second} and order.index(n) > order.index(first)]
    reordered = [n for n in order if n not in needed]
    position = reordered.index(first)
    reordered[position:position] = needed
    schedule = schedule_from_computes(g, reordered)
    computes = schedule.computes()
    assert computes.index(second) < computes.index(first)
    planned = planner.apply(model, with_schedule(plan, schedule))
    _check_same_step(model, planned, inputs)
    assert planned._planned_bound.executor.rng.prepass


def test_batchnorm_statistics_update_once_per_step():
    inputs = (torch.randn(4, 3, 8, 8),)
    original, twin = cnn(), cnn()
    plan = planner.plan(twin, inputs, budget="100%", solver="store-all")
    planned = planner.apply(twin, with_schedule(plan, recompute_everything(plan.graph)))
    training_step(original, inputs)
    training_step(planned, inputs)
    for a, b in zip(original.buffers(), twin.buffers()):
        assert torch.equal(a, b)  # the same kernel, applied once
    assert twin[1].num_batches_tracked.item() == 1
    _, grads0, _ = training_step(original, inputs)
    _, grads1, _ = training_step(planned, inputs)
    assert max_relative_error(grads0, grads1) == 0.0


def test_eval_and_no_grad_run_the_original_forward(mlp_setup):
    model, inputs, plan = mlp_setup
    planned = planner.apply(model, plan)
    planned.eval()
    with torch.no_grad():
        expected = model.eval()(*inputs)
        assert torch.equal(planned(*inputs), expected)
    assert "_planned_bound" not in planned.__dict__  # nothing was traced
    model.train()
    planned.train()
    with torch.no_grad():
        planned(*inputs)
    assert "_planned_bound" not in planned.__dict__


def test_parameters_are_shared_and_the_module_is_a_drop_in(mlp_setup):
    model, inputs, plan = mlp_setup
    planned = planner.apply(model, plan)
    assert isinstance(planned, type(model))
    assert planned.plan is plan
    assert list(planned.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(planned.parameters(), model.parameters()))
    optimizer = torch.optim.SGD(planned.parameters(), lr=0.1)
    before = model[0].weight.detach().clone()
    training_step(planned, inputs)
    optimizer.step()
    assert not torch.equal(model[0].weight, before)  # the original's parameters moved
    planned.load_state_dict(model.state_dict())


def test_inputs_that_do_not_match_the_plan_are_refused(mlp_setup):
    model, inputs, plan = mlp_setup
    planned = planner.apply(model, plan)
    with pytest.raises(runtime.InputMismatch, match=r"float32\[16, 64\]"):
        planned(torch.randn(8, 64))
    with pytest.raises(runtime.InputMismatch, match="structure"):
        planned(torch.randn(16, 64), torch.randn(16, 64))


def test_a_saved_plan_is_retraced_and_checked(tmp_path, mlp_setup):
    model, inputs, plan = mlp_setup
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = planner.load(path)
    assert loaded.profile is None and loaded.fingerprint == plan.fingerprint
    _check_same_step(model, planner.apply(model, loaded), inputs)
    other = mlp(width=64, depth=5)
    with pytest.raises(runtime.PlanMismatch, match="different model"):
        training_step(planner.apply(other, loaded), inputs)


def test_hugging_face_output_structure_is_kept():
    model, inputs = gpt2(layers=1, embd=32, vocab=100, positions=16), gpt2_inputs(batch=2, tokens=16, vocab=100)
    planned = planner.checkpoint(model, inputs, budget="100%", loss_fn=hf_loss, solver="store-all")
    output = planned(**inputs)
    assert type(output).__name__ == "CausalLMOutputWithCrossAttentions"
    assert output.logits.shape == (2, 16, 100) and output.loss.requires_grad
    _check_same_step(model, planned, inputs, hf_loss)


def test_a_loss_on_an_output_the_plan_did_not_differentiate_is_refused():
    model, inputs = gpt2(layers=1, embd=32, vocab=100, positions=16), gpt2_inputs(batch=2, tokens=16, vocab=100)
    planned = planner.checkpoint(model, inputs, budget="100%", loss_fn=hf_loss, solver="store-all")
    output = planned(**inputs)
    with pytest.raises(RuntimeError, match="re-plan"):
        output.logits.sum().backward()
