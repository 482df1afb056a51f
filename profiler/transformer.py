"""``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` / ``nn.Transformer`` with an attention mask.

Given ``mask=`` without ``is_causal=``, these modules ask whether the mask is causal by comparing
its values with a causal mask (``torch.nn.modules.transformer._detect_is_causal_mask``): a Python
``bool`` of tensor values, which the tracer cannot follow (``GuardOnDataDependentSymNode``), so the
model went to the fallback plan. The answer only picks how attention applies the mask: the mask
itself, or scaled-dot-product attention's ``is_causal`` in its place when the mask is causal.

While tracing, :func:`masks_applied_as_given` answers "not causal" (unless the caller said
``is_causal``): the traced step applies the mask it is given, which is correct whatever the mask
holds at a later call. On CPU the two ways compute the same bits (measured: gradients of a 2-layer
``TransformerEncoder`` with a causal mask, dropout on, identical either way); where a device's
kernels differ (a GPU's fused causal attention), gradients equal eager's to rounding only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.nn.modules import transformer


def _as_given(mask=None, is_causal=None, size=None) -> bool:
    """``_detect_is_causal_mask`` without looking at the mask's values: the caller's hint, else False."""
    return is_causal is True


@contextlib.contextmanager
def masks_applied_as_given() -> Iterator[None]:
    """Within the block, torch's transformer modules do not test their mask for causality (module
    state of torch, restored on exit, exception or not)."""
    original = transformer._detect_is_causal_mask
    transformer._detect_is_causal_mask = _as_given
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = original
