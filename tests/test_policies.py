"""Save policies on real models (solvers/regions/policies.py SAVE_POLICIES, runtime/native.py): each policy's
regions forced on a small model are predicted within 1% of the measured peak, and train as the
un-checkpointed model does, bit for bit, with dropout on.

The models use eager attention (the score matrix materialised, as SDPA's math path on CPU with
attention dropout), where ``projections`` and ``matmuls`` differ: ``matmuls`` saves the attention's
bmm outputs, ``projections`` recomputes them. A runtime that saved other ops than the prediction
assumes would miss by the score matrices (about 10% of these peaks, checked below).
"""

from __future__ import annotations

import pytest
import torch

import profiler
from models import gpt2, gpt2_inputs, hf_loss, training_step
from planner.native_measure import measure_native
from planner.native_solve import fixed_bytes, rng_bytes
from runtime.native import apply_native, remove_native
from runtime.save_policies import UnsafeSavePolicy
from solvers.regions import SAVE_POLICIES, evaluate, region_costs

transformers = pytest.importorskip("transformers")


def _gpt2():
    model = gpt2(layers=3, embd=64, heads=4, vocab=256, positions=64)
    model.set_attn_implementation("eager")
    return model.train(), gpt2_inputs(batch=2, tokens=64, vocab=256)


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=172,
        vocab_size=256, max_position_embeddings=64, use_cache=False, attention_dropout=0.1,
        attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model.train(), gpt2_inputs(batch=2, tokens=64, vocab=256)


MODELS = {"gpt2": (_gpt2, "transformer.h"), "llama": (_llama, "model.layers")}


def _predicted(graph, regions) -> int:
    return fixed_bytes(graph) + evaluate(graph, regions).outcome.peak_bytes + rng_bytes(regions, [])


@pytest.fixture(scope="module", params=sorted(MODELS))
def profiled(request):
    """(name, model, inputs, op graph), profiled once per model for the tests below."""
    build, _ = MODELS[request.param]
    model, inputs = build()
    graph = profiler.profile(model, inputs, loss_fn=hf_loss, fuse_loss=False).regroup("op").graph
    return request.param, model, inputs, graph


@pytest.mark.parametrize("policy", sorted(SAVE_POLICIES))
def test_a_policy_is_predicted_within_a_percent_and_trains_bit_for_bit(profiled, policy):
    name, model, inputs, graph = profiled
    blocks = MODELS[name][1]
    for regions in [(f"{blocks}.0@{policy}", f"{blocks}.1@{policy}"), (f"{blocks}.2@{policy}",)]:
        predicted = _predicted(graph, regions)
        measured = measure_native(model, regions, inputs, hf_loss).peak_bytes
        assert abs(predicted - measured) <= 0.01 * measured, (regions, predicted, measured)

    expected_loss, expected, _ = training_step(model, inputs, hf_loss)
    apply_native(model, [f"{blocks}.{i}@{policy}" for i in range(3)])
    try:
        loss, grads, _ = training_step(model, inputs, hf_loss)
    finally:
        remove_native(model)
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected.keys()
    assert all(torch.equal(grads[k], expected[k]) for k in expected), name


def test_projections_recompute_the_attention_products_that_matmuls_saves(profiled):
    """The two policies differ by the bmm outputs (the attention scores, s^2 per head), by more than
    the 1% the test above allows between prediction and measurement: a runtime saving the other
    policy's ops fails it."""
    name, model, inputs, graph = profiled
    blocks = MODELS[name][1]
    ops = {policy: [graph.nodes[v]["op"] for v in region_costs(graph, f"{blocks}.1@{policy}").saved]
           for policy in ("matmuls", "projections")}
    assert any(op.startswith("aten.bmm.") for op in ops["matmuls"])
    assert not any(op.startswith(("aten.bmm.", "aten.baddbmm.")) for op in ops["projections"])
    assert ops["projections"] and all(op.startswith(("aten.mm.", "aten.addmm.")) for op in ops["projections"])
    peaks = {policy: _predicted(graph, (f"{blocks}.0@{policy}", f"{blocks}.1@{policy}"))
             for policy in ("matmuls", "projections")}
    assert peaks["projections"] < 0.95 * peaks["matmuls"], peaks


class _CountDraws(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.draws = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.draws += torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _draws_in_backward(model, inputs, regions) -> int:
    apply_native(model, regions)
    try:
        loss = hf_loss(model(**inputs))
        with _CountDraws() as counter:
            loss.backward()
    finally:
        remove_native(model)
        model.zero_grad(set_to_none=True)
    return counter.draws


def test_draws_policies_do_not_draw_again_in_the_backward():
    """CPU dropout draws in place (empty_like, bernoulli_, div_); a '+draws' policy keeps the first
    run's buffer, so the recomputation draws nothing, where the policy without it draws again."""
    model, inputs = _gpt2()
    for policy, expect_draws in (("matmuls", True), ("matmuls+draws", False), ("projections+draws", False)):
        draws = _draws_in_backward(model, inputs, [f"transformer.h.{i}@{policy}" for i in range(3)])
        assert (draws > 0) == expect_draws, (policy, draws)


class _Block(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))
        self.body = body

    def forward(self, x):
        return self.body(self, x)


def _rewrites_an_allocation(block, x):
    buffer = torch.empty_like(x)
    buffer.copy_(x @ block.weight)
    buffer.mul_(2)
    noise = torch.empty_like(x).bernoulli_(0.5)
    noise.div_(0.5)
    return (buffer * noise).sin()


def _mutates_a_read_draw(block, x):
    noise = torch.empty_like(x).bernoulli_(0.5)
    y = x @ block.weight * noise
    noise.mul_(2)
    return y * noise


def _mutates_a_saved_matmul(block, x):
    h = x @ block.weight
    h.add_(1)
    return h.sin()


def _wrapped(body):
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(body), torch.nn.Linear(8, 1))


def _grads(model, x):
    torch.manual_seed(1)
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_draws_policies_replay_in_place_ops_on_saved_buffers_exactly():
    model, x = _wrapped(_rewrites_an_allocation), torch.randn(4, 8, requires_grad=True)
    expected = _grads(model, x)
    apply_native(model, ["0@projections+draws"])
    assert all(torch.equal(a, b) for a, b in zip(_grads(model, x), expected, strict=True))


@pytest.mark.parametrize("body", [_mutates_a_read_draw, _mutates_a_saved_matmul])
def test_draws_policies_refuse_an_in_place_op_they_cannot_replay(body):
    model = _wrapped(body)
    apply_native(model, ["0@matmuls+draws"])
    with pytest.raises(UnsafeSavePolicy, match="writes in place into a tensor the policy saved"):
        model(torch.randn(4, 8, requires_grad=True))
