"""Hugging Face causal masks are traced as eager builds them (profiler/hf_masks.py): no mask for an
unpadded batch without position_ids (attention with is_causal), the packed mask where the caller
gives positions."""

from __future__ import annotations

import pytest
import torch

import profiler
from models import gpt2, gpt2_inputs, hf_loss


@pytest.fixture
def attention_calls(monkeypatch):
    """(mask given?, is_causal, on fake tensors?) of every scaled-dot-product attention call."""
    import transformers.integrations.sdpa_attention as sdpa

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None, is_causal, type(query).__name__ == "FakeTensor"))
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(sdpa.torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


def test_an_unpadded_batch_traces_without_a_mask_as_eager_runs_it(attention_calls):
    import transformers.masking_utils as masking

    original = masking.find_packed_sequence_indices
    model, inputs = gpt2(layers=2, embd=32, heads=2, vocab=100, positions=64), gpt2_inputs(batch=2, tokens=64, vocab=100)
    model(**inputs)
    eager = [c[:2] for c in attention_calls if not c[2]]
    attention_calls.clear()
    found = profiler.profile(model, inputs, loss_fn=hf_loss, granularity="op", fuse_loss=False)
    traced = [c[:2] for c in attention_calls if c[2]]
    assert eager == [(False, True)] * 2 and traced == eager  # no mask, is_causal: as eager
    assert masking.find_packed_sequence_indices is original  # transformers' state restored
    # No (batch, 1, tokens, tokens) mask in the graph, 2 * 64 * 64 * 4 bytes a layer in its float
    # form (CPU's math attention applies is_causal as a (tokens, tokens) one, as eager does).
    assert not [n for n, d in found.graph.nodes(data=True) if d.get("op") == "aten.where.self" and d["mem"] >= 2 * 64 * 64 * 4]


def test_given_positions_are_left_to_transformers(attention_calls):
    """position_ids the caller gives may pack several sequences a row: the traced mask stays the one
    transformers builds from them (correct at every call), not eager's answer for this batch."""
    model, inputs = gpt2(layers=1, embd=32, heads=2, vocab=100, positions=64), gpt2_inputs(batch=2, tokens=64, vocab=100)
    inputs["position_ids"] = torch.arange(64).expand(2, 64)
    profiler.profile(model, inputs, loss_fn=hf_loss, granularity="op", fuse_loss=False)
    assert [c[:2] for c in attention_calls if c[2]] == [(True, False)]


def test_a_wrapper_of_a_transformers_model_is_left_to_transformers(attention_calls):
    """A model of the user's around a transformers one may pass packed positions it makes itself:
    not eager's answer to assume there, the mask transformers traces stays (correct at every call)."""
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = gpt2(layers=1, embd=32, heads=2, vocab=100, positions=64)

        def forward(self, input_ids, labels):
            return self.inner(input_ids=input_ids, labels=labels)

    inputs = gpt2_inputs(batch=2, tokens=64, vocab=100)
    profiler.profile(Wrapper(), inputs, loss_fn=hf_loss, granularity="op", fuse_loss=False)
    assert [c[:2] for c in attention_calls if c[2]] == [(True, False)]
