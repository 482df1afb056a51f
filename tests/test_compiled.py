"""apply(..., compile=True): the schedule's two phases as inductor-compiled graphs.

Compiling takes seconds per graph here, so these tests use small models; the benchmark
(benchmarks/compare.py) runs GPT-2, BERT, the residual MLP and the U-Net compiled.
"""

import pytest
import torch

import planner
import profiler
from models import cnn, gpt2, gpt2_inputs, hf_loss, max_relative_error, mlp, residual_mlp, training_step
from schedules import recompute_everything, saved_forward_node, thrice, with_schedule

# Fused kernels reorder float arithmetic: gradients agree to rounding, not to the bit.
TOLERANCE = 1e-5


@pytest.mark.parametrize("schedule", ["recompute-everything", "thrice-random"])
def test_gradients_random_masks_and_rng_equal_the_original(schedule):
    model, inputs = mlp(width=32, depth=3), (torch.randn(16, 32),)
    plan = planner.plan(model, inputs, budget="100%", solver="store-all")
    if schedule == "recompute-everything":  # every random op replayed once, in the backward
        plan = with_schedule(plan, recompute_everything(plan.graph))
    else:  # a dropout computed three times: replayed twice from its saved state
        plan = with_schedule(plan, thrice(plan.graph, saved_forward_node(plan.graph, random=True)))
    loss0, grads0, rng0 = training_step(model, inputs)
    planned = planner.apply(model, plan, compile=True)
    for _ in range(2):  # the first call compiles; the second runs the compiled code
        loss1, grads1, rng1 = training_step(planned, inputs)
        assert torch.allclose(loss0, loss1, rtol=TOLERANCE)
        assert max_relative_error(grads0, grads1) < TOLERANCE  # the same dropout masks, replayed
        assert torch.equal(rng0, rng1)  # the forward drew what an unplanned step draws
    assert planned._planned_bound.executor.compile_seconds > 0


def test_batchnorm_statistics_update_once_per_step_and_convolutions_keep_their_layout():
    inputs = (torch.randn(4, 3, 8, 8),)
    original, twin = cnn(), cnn()
    plan = planner.plan(twin, inputs, budget="100%", solver="store-all")
    plan = with_schedule(plan, recompute_everything(plan.graph))
    planned = planner.apply(twin, plan, compile=True)
    training_step(original, inputs)
    training_step(planned, inputs)
    for a, b in zip(original.buffers(), twin.buffers()):
        assert torch.allclose(a.float(), b.float(), rtol=TOLERANCE, atol=1e-7)
    assert twin[1].num_batches_tracked.item() == 1
    # inductor's channels-last conversion of convolutions would hold a second copy of activations
    assert profiler.measure_step(planned, inputs, repeats=1).peak_bytes <= plan.predicted_peak_bytes * 1.01


def test_measured_peak_within_the_prediction():
    model, inputs = residual_mlp(width=256, hidden=1024, depth=4), (torch.randn(512, 256),)
    plan = planner.plan(model, inputs, budget="75%", solver="dp")
    eager, compiled = planner.apply(model, plan), planner.apply(model, plan, compile=True)
    eager_step = profiler.measure_step(eager, inputs, repeats=5)
    compiled_step = profiler.measure_step(compiled, inputs, repeats=5)
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    # Fusion only removes buffers the eager step allocates; the schedule's frees are kept.
    assert compiled_step.peak_bytes <= plan.predicted_peak_bytes * 1.01
    assert eager_step.peak_bytes <= plan.predicted_peak_bytes * 1.01
    _, grads0, _ = training_step(model, inputs)
    _, grads1, _ = training_step(compiled, inputs)
    assert max_relative_error(grads0, grads1) < TOLERANCE


class Classifier(torch.nn.Module):
    """Returns its own cross-entropy loss: the profiler fuses its backward into a custom op, which
    the compiled graph must call as it is."""

    def __init__(self, width: int = 32, classes: int = 50):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Dropout(0.1))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x, labels):
        return torch.nn.functional.cross_entropy(self.head(self.body(x)), labels)


def test_an_in_model_cross_entropy_loss_compiled():
    torch.manual_seed(0)
    model = Classifier()
    inputs = (torch.randn(64, 32), torch.randint(0, 50, (64,)))
    plan = planner.plan(model, inputs, budget="100%", solver="store-all", loss_fn=lambda loss: loss)
    assert any("cross_entropy_backward" in str(n.target) for n in plan.profile.joint.graph_module.graph.nodes)
    planned = planner.apply(model, with_schedule(plan, recompute_everything(plan.graph)), compile=True)
    loss0, grads0, rng0 = training_step(model, inputs, lambda loss: loss)
    loss1, grads1, rng1 = training_step(planned, inputs, lambda loss: loss)
    assert torch.allclose(loss0, loss1, rtol=TOLERANCE)
    assert max_relative_error(grads0, grads1) < TOLERANCE
    assert torch.equal(rng0, rng1)


@pytest.mark.slow  # a minute of compiling; test_an_in_model_cross_entropy_loss_compiled covers the fused loss
def test_a_hugging_face_model_planned_and_compiled():
    model, inputs = gpt2(layers=2, embd=64, vocab=200, positions=32), gpt2_inputs(batch=2, tokens=32, vocab=200)
    planned = planner.checkpoint(model, inputs, budget="70%", loss_fn=hf_loss, compile=True)
    loss0, grads0, rng0 = training_step(model, inputs, hf_loss)
    loss1, grads1, rng1 = training_step(planned, inputs, hf_loss)
    assert type(planned(**inputs)).__name__ == "CausalLMOutputWithCrossAttentions"
    assert torch.allclose(loss0, loss1, rtol=TOLERANCE)
    assert max_relative_error(grads0, grads1) < 1e-4
    assert torch.equal(rng0, rng1)
    measured = profiler.measure_step(planned, inputs, loss_fn=hf_loss, repeats=1)
    assert measured.peak_bytes <= planned.plan.budget_bytes


def test_an_untraced_plan_is_a_native_plan_compiled_by_torch_compile_not_by_apply():
    class Untraceable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])

        def forward(self, x):
            return self.blocks(x) if x.sum() > 0 else -self.blocks(x)

    model, inputs = Untraceable(), (torch.ones(2, 8),)
    plan = planner.plan(model, inputs, budget="100%")
    assert isinstance(plan, planner.NativePlan)
    with pytest.raises(ValueError, match="a native plan runs the model's own forward"):
        planner.apply(model, plan, compile=True)
