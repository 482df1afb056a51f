"""``planner.plan_of(model)``: the plan a model runs, after ``planner.checkpoint`` or ``planner.apply``.

A native plan is kept on the model it checkpoints (runtime/native.py, ``PLAN_ATTRIBUTE``, set by
``apply_native_plan`` and dropped by ``remove_native``); a traced or fallback plan's module carries
its plan as ``.plan``. Wrappers are looked through: ``torch.compile``'s ``OptimizedModule``
(``_orig_mod``) and DistributedDataParallel (``.module``).
"""

from __future__ import annotations

import torch

from runtime.native import PLAN_ATTRIBUTE

from .planfile import Plan


class NoPlan(LookupError):
    """The module runs no plan of plan-checkpoints."""


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = model.__dict__.get("_orig_mod") or model.__dict__.get("_modules", {}).get("_orig_mod")
        if inner is None and type(model).__name__ == "DistributedDataParallel":
            inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def plan_of(model: torch.nn.Module) -> Plan:
    """The plan ``model`` runs (its ``summary()`` says what is checkpointed and predicted): the one
    :func:`planner.checkpoint` chose or :func:`planner.apply` applied. Raises :class:`NoPlan` for a
    model no plan was applied to (or whose plan ``runtime.native.remove_native`` removed)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"plan_of() takes the model planner.checkpoint() or planner.apply() returned, got "
                        f"{type(model).__name__}")
    inner = _unwrapped(model)
    for found in (inner.__dict__.get(PLAN_ATTRIBUTE), inner.__dict__.get("plan")):
        if isinstance(found, Plan):
            return found
    raise NoPlan(f"this {type(inner).__name__} runs no plan: planner.checkpoint(model, inputs, budget) or "
                 "planner.apply(model, plan) makes one run (and plan_of returns it)")


__all__ = ["NoPlan", "plan_of"]
