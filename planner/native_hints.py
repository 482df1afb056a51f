"""What a native plan or refusal tells the user besides its figures: a Hugging Face decoder whose cache
no checkpoint can free, and a bounded profile that held more than its bound.
"""

from __future__ import annotations

import warnings

import torch

import profiler

from .budget import format_bytes
from .planfile import PlanWarning


def warn_if_above_bound(profile: profiler.Profile, bound: int | None, device_memory: int | None) -> None:
    """Say so when the bounded profile held more than its bound: what one op needs at once (its
    inputs, outputs and scratch, with the parameters and inputs) is above it, and above the device
    when that is the bound."""
    held = profile.times.held_peak_bytes if profile.times is not None else 0
    if bound is None or held <= bound:
        return
    where = "the device's memory" if device_memory is not None and bound == device_memory else "the budget"
    warnings.warn(f"profiling held {format_bytes(held)}, above {where} ({format_bytes(bound)}): one op of the step, "
                  "with the parameters and inputs, needs that much at once; the plan's step needs it too",
                  PlanWarning, stacklevel=3)


def cache_hint(model: torch.nn.Module, profile: profiler.Profile) -> str:
    """Why a Hugging Face decoder with its cache on cannot go lower, and what to do. Only when the
    traced step returns a cache: encoders' configs say use_cache=True too (BERT's), and return none."""
    config = getattr(model, "config", None)
    if not getattr(config, "use_cache", False) or not _returns_a_cache(profile.joint.output_spec):
        return ""
    return ("; the model's config has use_cache=True: its attention blocks return their key/value cache as model "
            "outputs, which no checkpoint can free; set model.config.use_cache = False for training (as "
            "gradient_checkpointing_enable() does) and plan again")


def _returns_a_cache(spec) -> bool:
    """Whether a model output's pytree spec holds a key/value cache (a ``...Cache`` object, or a
    ``past_key_values`` / ``cache`` field of a Hugging Face ModelOutput)."""
    if spec.type is not None and spec.type.__name__.endswith("Cache"):
        return True
    keys = spec.context if isinstance(spec.context, (list, tuple)) else ()
    if any(key in ("past_key_values", "cache") for key in keys if isinstance(key, str)):
        return True
    return any(_returns_a_cache(child) for child in spec.children())
