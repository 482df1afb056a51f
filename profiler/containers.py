"""Output containers the tracer must see into: Hugging Face's key/value caches as pytree nodes.

A model's output is flattened with ``torch.utils._pytree``: tensors become graph outputs, other
leaves constants returned as traced. A leaf that holds tensors would hand the caller the trace's
fake tensors, so :func:`holds_tensors` finds those (profiler/capture.py refuses them) and
:func:`register_output_containers` makes the caches transformers returns pytree nodes instead.
"""

from __future__ import annotations

import sys

import torch
import torch.utils._pytree as pytree


def register_output_containers() -> None:
    """Let the tracer see the tensors inside Hugging Face's ``DynamicCache``: with ``use_cache`` on
    (GPT-2's default config) a causal LM returns its keys and values in one, and a cache flattened
    as a constant leaf handed the caller the trace's fake tensors. Registered as a pytree node (the
    flattening transformers itself uses for ``torch.export``), its tensors are model outputs, held by
    the caller as eager's are; an encoder-decoder's ``EncoderDecoderCache`` likewise. Registering
    is global and once; nothing happens without transformers, and a cache registered already (by
    transformers' export support) keeps that registration."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
        from transformers.integrations import executorch
    except ImportError:  # another transformers version: its caches stay leaves (holds_tensors refuses them)
        return
    nodes = {
        DynamicCache: (lambda cache: executorch._flatten_cache_dict(executorch._get_cache_dict(cache),
                                                                    executorch._get_dynamic_cache_layout(cache)),
                       _unflatten_dynamic_cache),
        # An encoder-decoder's (T5, BART, Whisper): its two DynamicCaches, each flattened as above.
        EncoderDecoderCache: (lambda cache: ([cache.self_attention_cache, cache.cross_attention_cache], None),
                               lambda caches, _: EncoderDecoderCache(*caches)),
    }
    for kind, (flatten, unflatten) in nodes.items():
        if kind in pytree.SUPPORTED_NODES:
            continue
        try:
            pytree.register_pytree_node(kind, flatten, unflatten,
                                        serialized_type_name=f"{kind.__module__}.{kind.__name__}")
        except ValueError as error:  # registered meanwhile
            if "already registered" not in str(error):
                raise


def _unflatten_dynamic_cache(values, context):
    """A DynamicCache holding ``values`` themselves. Transformers' own unflattening fills each layer
    by concatenating to an empty tensor, a copy of the whole cache beside the step's outputs (the
    planned GPT-2 measured that much, 128 KiB, over its prediction): it is given empty slices of
    the keys and values instead, and the layers then take the tensors."""
    from transformers.integrations import executorch

    names, layout = context
    tensors = pytree._dict_unflatten(values, names)
    keys, values_ = tensors["key_cache"], tensors["value_cache"]
    empty = [[t[..., :0, :] for t in group] for group in values]  # the children: lists of tensors
    cache = executorch._unflatten_dynamic_cache(empty, context)
    filled = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    for layer, k, v in zip(filled, keys, values_):
        layer.keys, layer.values = k, v
    return cache


def holds_tensors(value, depth: int = 3) -> bool:
    """Whether a non-tensor output leaf holds tensors (in its attributes, lists, tuples or dicts,
    ``depth`` levels down)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth == 0 or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return False
    if isinstance(value, dict):
        return any(holds_tensors(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(holds_tensors(v, depth - 1) for v in value)
    attributes = getattr(value, "__dict__", None)
    return isinstance(attributes, dict) and any(holds_tensors(v, depth - 1) for v in attributes.values())
