"""A native plan's autocast, checked when its training step runs.

A native plan was sized in the dtypes its step was planned in (``plan.autocast``: ``"cpu:bfloat16"``,
or empty for none; planner/autocast.py). The model runs its own forward, so any autocast works, but
under another one the plan's figures are not the step's: made in float32 and trained under bf16
autocast it checkpoints more than needed (peak over-predicted by 22.7% on nanoGPT); made under
autocast and trained without it, the step holds float32 activations and can exceed the budget.
:func:`install_autocast_check` registers a forward pre-hook that compares the ambient autocast of a
training call (grad enabled, ``model.training``) with the planned one and warns once per model
(:class:`AutocastMismatch`, with the plan's figures); it changes nothing in the step. Calls under
``no_grad`` (evaluation) are not checked: nothing is checkpointed there.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from profiler.capture import autocast_state

from .hooks import remove_pre_hook

_CHECK = "_native_autocast_check"


class AutocastMismatch(UserWarning):
    """A native plan's training step runs under another autocast than it was planned under."""


@dataclass
class AutocastCheck:
    """The planned autocast state and the plan's figures for the warning; ``warned`` once."""

    planned: str
    figures: str
    warned: bool = False


def _describe(state: str) -> str:
    return f"under torch.autocast ({state})" if state else "without autocast"


def mismatch_message(planned: str, current: str, figures: str) -> str:
    again = (f"planner.plan(model, inputs, budget, autocast={current.split(',')[0].split(':')[1]!r})" if current
             else "planner.plan(model, inputs, budget) outside torch.autocast")
    effect = ("its activations are now smaller than planned: it checkpoints more than the budget needs"
              if current and not planned else
              "its activations are now larger than planned: the step can exceed the budget" if planned and not current
              else "its activations' sizes differ from the planned ones")
    return (f"this native plan was made {_describe(planned)} and the training step runs {_describe(current)}: "
            f"{effect} ({figures}); train as planned, or plan again: {again}")


# Run eagerly under torch.compile (as runtime/native.py's shape check): one graph break before the
# forward, none inside it.
@torch.compiler.disable
def _check_autocast(module: torch.nn.Module, args: tuple, kwargs: dict):
    check = module.__dict__.get(_CHECK)
    if check is None or check.warned or not (module.training and torch.is_grad_enabled()):
        return None
    current = autocast_state()
    if current != check.planned:
        check.warned = True
        warnings.warn(mismatch_message(check.planned, current, check.figures), AutocastMismatch, stacklevel=2)
    return None


def install_autocast_check(model: torch.nn.Module, planned: str, figures: str) -> None:
    """Check each training call of ``model`` against the ``planned`` autocast state (``figures``:
    the plan's budget and peaks, for the warning)."""
    remove_autocast_check(model)
    model.__dict__[_CHECK] = AutocastCheck(planned, figures)
    model.register_forward_pre_hook(_check_autocast, with_kwargs=True)


def remove_autocast_check(model: torch.nn.Module) -> None:
    """Undo :func:`install_autocast_check`."""
    remove_pre_hook(model, _check_autocast)
    model.__dict__.pop(_CHECK, None)


__all__ = ["AutocastCheck", "AutocastMismatch", "install_autocast_check", "mismatch_message", "remove_autocast_check"]
