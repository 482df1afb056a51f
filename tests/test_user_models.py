"""The user's own model as it comes (issue 29): Hugging Face decoders at their default config
(``use_cache=True``) plan like ``gradient_checkpointing_enable()`` does (runtime/hf_cache.py), and
``planner.plan_of(model)`` gives back the plan ``planner.checkpoint`` chose."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import planner
from models import hf_loss
from runtime.hf_cache import CacheOffInTraining
from runtime.native import remove_native

STEPS = 3


def _gpt2_default():
    """GPT-2 from ``GPT2Config`` at its defaults but for its sizes: use_cache on, dropouts 0.1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                       bos_token_id=0, eos_token_id=0))
    model.loss_type = "ForCausalLM"
    return model


def _llama_default():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        vocab_size=128, attention_dropout=0.1, pad_token_id=0, bos_token_id=0,
                                        eos_token_id=0))


def _batch(vocab: int, seed: int, batch: int = 4, tokens: int = 64) -> dict:
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


def _train(model, batches) -> list[dict]:
    """AdamW steps from fixed seeds (dropout on); each step's loss and gradients."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    for step, batch in enumerate(batches):
        torch.manual_seed(step)
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        history.append({"loss": loss.detach().clone(),
                        **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}})
        optimizer.step()
    return history


def _without_cache(build):
    def built():
        model = build()
        model.config.use_cache = False
        return model
    return built


# Llama under -m slow: the gpt2 case covers the same path (the zoo plans every decoder at its defaults).
@pytest.mark.parametrize("build, vocab", [(_gpt2_default, 256),
                                          pytest.param(_llama_default, 128, marks=pytest.mark.slow)],
                         ids=["gpt2", "llama"])
def test_a_decoder_at_its_default_config_plans_at_half_and_three_quarters(build, vocab):
    """Refused before at 50% (gpt2) and 75% (9 of 10 zoo decoders): its attention blocks returned
    their keys and values as model outputs. Planned, the training step runs without the cache (one
    notice) and trains as the same model with ``use_cache=False`` does, bit for bit (with the cache
    on, the keys and values pass through its concatenation: rounding apart); eval and generation
    keep the cache and the config is untouched."""
    model = build()
    assert model.config.use_cache
    example = _batch(vocab, seed=0)
    plans = {budget: planner.plan(model, example, budget=budget, loss_fn=hf_loss) for budget in ("50%", "75%")}
    for budget, plan in plans.items():
        assert plan.regions, budget
        assert plan.measured_peak_bytes <= plan.budget_bytes, budget
    assert model.config.use_cache  # planning put it back

    batches = [_batch(vocab, seed=s) for s in range(STEPS)]
    reference = _train(_without_cache(build)(), batches)
    planned = planner.apply(build(), plans["50%"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = _train(planned, batches)
    notices = [w for w in caught if issubclass(w.category, CacheOffInTraining)]
    assert len(notices) == STEPS and "use_cache=False" in str(notices[0].message)  # one line a step, shown once
    for a, b in zip(reference, history, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), name
    assert planned.config.use_cache
    planned.eval()
    with torch.no_grad():
        assert planned(**example).past_key_values is not None  # eval keeps the cache
    generated = planned.generate(example["input_ids"][:1, :4], max_new_tokens=3, do_sample=False,
                                 pad_token_id=0)
    assert generated.shape == (1, 7)
    remove_native(planned)
    planned.train()
    assert planned(**example).past_key_values is not None  # the plan removed, the cache is back in training


def test_plan_of_gives_the_plan_checkpoint_chose():
    """``planner.checkpoint`` returned the model and kept no plan; ``plan_of`` gives it back, with its
    summary, through deepcopy and torch.compile's wrapper; a model without a plan is one clear error."""
    from models import mlp

    model = mlp(width=64, depth=6, dropout=0.2)
    inputs = (torch.randn(256, 64, generator=torch.Generator().manual_seed(0)),)
    checkpointed = planner.checkpoint(model, inputs, budget="70%", loss_fn=lambda out: out.pow(2).mean())
    plan = planner.plan_of(checkpointed)
    assert isinstance(plan, planner.NativePlan) and plan.regions
    assert f"Checkpointed:      {plan.regions[0]}" in plan.summary()
    assert planner.plan_of(copy.deepcopy(checkpointed)).regions == plan.regions
    assert planner.plan_of(torch.compile(checkpointed)) is plan
    saved = io.BytesIO()
    torch.save(checkpointed, saved)
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    assert planner.plan_of(loaded).regions == plan.regions and planner.plan_of(loaded).summary() == plan.summary()
    remove_native(checkpointed)
    with pytest.raises(planner.NoPlan, match="runs no plan"):
        planner.plan_of(checkpointed)
    with pytest.raises(TypeError, match="plan_of\\(\\) takes the model"):
        planner.plan_of(plan)
