"""``planner.plan_of(model)``: the plan a model runs, after ``planner.checkpoint`` or ``planner.apply``.

A native plan checkpoints the model itself, which returns as the same object: :func:`attach` keeps
the plan on it (``runtime.native.PLAN_ATTRIBUTE``; ``runtime.native.remove_native`` drops it with
the regions). A traced or fallback plan's module carries its plan as ``.plan``. Wrappers are looked
through: ``torch.compile``'s ``OptimizedModule`` (``_orig_mod``) and DistributedDataParallel
(``.module``).

The kept plan is not part of the model's state: a ``deepcopy`` of the model shares it, and
``torch.save`` of the whole model stores it as its plan file's JSON (read back by :func:`plan_of`).
"""

from __future__ import annotations

import json

import torch

from runtime.native import PLAN_ATTRIBUTE

from .loading import plan_from_data
from .planfile import Plan


class NoPlan(LookupError):
    """The module runs no plan of plan-checkpoints."""


class AttachedPlan:
    """The plan kept on a natively checkpointed model. ``deepcopy`` shares it; pickling stores the
    plan file's JSON text (a plan's graph holds pytree specs whose pickling torch deprecates)."""

    def __init__(self, plan: Plan | None = None, saved: str | None = None):
        self._plan, self._saved = plan, saved

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = plan_from_data(json.loads(self._saved), source="the saved model's plan")
        return self._plan

    def __deepcopy__(self, memo) -> AttachedPlan:
        return self

    def __reduce__(self):
        return AttachedPlan, (None, self._saved if self._plan is None else json.dumps(self._plan.to_dict()))


def attach(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """Keep ``plan`` on ``model`` (a natively checkpointed model: the same object); return ``model``."""
    model.__dict__[PLAN_ATTRIBUTE] = AttachedPlan(plan)
    return model


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
    attached = inner.__dict__.get(PLAN_ATTRIBUTE)
    if isinstance(attached, AttachedPlan):
        return attached.plan
    if isinstance(inner.__dict__.get("plan"), Plan):
        return inner.__dict__["plan"]
    raise NoPlan(f"this {type(inner).__name__} runs no plan: planner.checkpoint(model, inputs, budget) or "
                 "planner.apply(model, plan) makes one run (and plan_of returns it)")


__all__ = ["AttachedPlan", "NoPlan", "attach", "plan_of"]
