"""``planner.plan(..., autocast=...)``: the step planned as it will run under ``torch.autocast``.

A plan's sizes are those of the dtypes its step was traced and measured in: a native plan made in
float32 and trained under bf16 autocast (nanoGPT on a GPU does exactly this) checkpointed 4 regions
where 3 sufficed, its peak over-predicted by 22.7%; made under autocast and run without it, the step
holds float32 activations the plan sized as bfloat16 ones and can exceed the budget. So autocast is
part of the plan (``Plan.autocast``, ``"cpu:bfloat16"``; empty for none): recorded from the ambient
autocast when the plan is made inside ``with torch.autocast(...)``, or planned for on request with
``autocast=torch.bfloat16`` (the model's device; or ``"cuda:float16"``, a device and a dtype), shown
in the summary, and checked when the plan runs (runtime/autocast_check.py: a mismatch warns once).
"""

from __future__ import annotations

import contextlib

import torch

from profiler.capture import AUTOCAST_DEVICES

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "half": torch.float16}
ACCEPTED = ("a torch dtype (torch.bfloat16, torch.float16), its name ('bfloat16', 'bf16', 'float16', 'fp16'), "
            f"or a device and a name ('cpu:bfloat16'; devices {', '.join(AUTOCAST_DEVICES)})")


def _model_device(model: torch.nn.Module) -> str:
    devices = {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()}
    return "cuda" if "cuda" in devices else "cpu"


def autocast_for(model: torch.nn.Module, autocast) -> tuple[str, torch.dtype]:
    """``(device type, dtype)`` that ``autocast`` asks for; raises ValueError saying what is
    accepted."""
    device = _model_device(model)
    dtype = autocast
    if isinstance(autocast, str):
        text = autocast.strip().lower()
        if ":" in text:
            device, _, text = text.partition(":")
        dtype = DTYPES.get(text.removeprefix("torch."))
        if device not in AUTOCAST_DEVICES or dtype is None:
            raise ValueError(f"autocast={autocast!r} is not understood; accepted: {ACCEPTED}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast={autocast!r} is not a lower-precision dtype torch.autocast runs; accepted: "
                         f"{ACCEPTED}, or None for no autocast")
    return device, dtype


def planning_under(model: torch.nn.Module, autocast):
    """The context the plan is made in: ``torch.autocast`` as asked, or nothing (``autocast=None``:
    the ambient autocast, if any, is what the plan records)."""
    if autocast is None:
        return contextlib.nullcontext()
    device, dtype = autocast_for(model, autocast)
    return torch.autocast(device, dtype=dtype)


def describe(state: str) -> str:
    """The summary's words for a plan's autocast state."""
    if not state:
        return "none (planned in the model's own dtypes: train without torch.autocast)"
    return f"{state} (planned under torch.autocast: train under the same)"


__all__ = ["ACCEPTED", "autocast_for", "describe", "planning_under"]
