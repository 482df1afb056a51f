"""Hugging Face causal masks traced as eager builds them.

A causal LM called without ``attention_mask`` and ``position_ids`` (a training batch of unpadded
sequences) builds no mask in eager: transformers' ``masking_utils.find_packed_sequence_indices``
reads the positions the model made (``arange``: one sequence a row), answers "not packed", and
attention runs with ``is_causal=True``. On fake tensors it cannot read them and answers "packed"
(a tensor), so the traced step materialised a ``(batch, 1, tokens, tokens)`` mask and gave it to
every attention call: on CUDA the memory-efficient kernel saved a float bias of that size per layer
(an 8-layer GPT-2 at 16 x 1024 tokens was predicted 512 MiB, +12.9%, above its measured
un-checkpointed step on an H200: docs/benchmarks/cuda-bounded.md), and the mask rules out the flash
kernel, so the graph priced was not the one eager runs.

:func:`unpacked_positions_as_eager` answers "not packed" while the model's forward is traced, where
that is eager's answer at every call: a transformers model called without ``position_ids`` (it makes
them from ``arange``). Given ``position_ids`` (packed sequences, say), or a model of the user's that
wraps a transformers one (it may pass positions of its own), are left to transformers: its traced
mask is then the packed one, correct at every call. Nothing is imported: a process without
transformers loaded is left alone.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator

import torch


def positions_given(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether the call may pass ``position_ids`` on to transformers: True unless ``model`` is a
    transformers model called without them (a wrapper of one may make its own, packed ones, which
    it does not show here; True also where the signature cannot say)."""
    if not type(model).__module__.startswith("transformers."):
        return True
    try:
        bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return True
    return bound.arguments.get("position_ids") is not None or "position_ids" in bound.arguments.get("kwargs", {})


def _not_packed(position_ids):
    return None


@contextlib.contextmanager
def unpacked_positions_as_eager(model: torch.nn.Module, args: tuple, kwargs: dict) -> Iterator[None]:
    """Within the block, transformers' packed-sequence detection answers "not packed" when the call
    gives no ``position_ids`` (module state of transformers, restored on exit, exception or not)."""
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None or positions_given(model, args, kwargs):
        yield
        return
    masking.find_packed_sequence_indices = _not_packed
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original
