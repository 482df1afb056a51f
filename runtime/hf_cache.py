"""A Hugging Face model's key/value cache off in training, kept for evaluation and generation.

A decoder built from its default config (``use_cache=True``) returns every attention block's keys
and values as model outputs: no checkpoint can free them, so a plan of such a step saves little
(9 of 10 zoo decoders refused 75%). Hugging Face's own ``gradient_checkpointing_enable()`` turns
the cache off by itself whenever autograd records in training (``transformers.utils.generic``,
"`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.") and
leaves it on under ``no_grad`` and in eval mode (``generate``). A native plan does the same:

- planning (:func:`cache_off_while_planning`) traces and measures the training step called with
  ``use_cache=False``, as it will run;
- :func:`install_cache_off` (runtime/native.py's ``apply_native``) registers a forward pre-hook
  on the model that passes ``use_cache=False`` to a training call that records autograd, with a
  one-line :class:`CacheOffInTraining` notice (Python shows it once per process), and changes
  nothing else: ``config.use_cache`` stays True, eval and ``generate`` keep the cache.

Only models whose class ``forward`` takes a ``use_cache`` argument and whose config has
``use_cache`` on are touched; anything else runs as it is.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

import torch

from .hooks import remove_pre_hook

NOTICE = ("use_cache=True is incompatible with activation checkpointing: the key/value cache is off in training "
          "(use_cache=False), as Hugging Face's gradient_checkpointing_enable() does; eval and generation keep it")


class CacheOffInTraining(UserWarning):
    """The one-line notice that a planned model's training call ran with ``use_cache=False``."""


def _use_cache_index(model: torch.nn.Module) -> int | None:
    """The position of ``use_cache`` among the class forward's arguments (``self`` not counted), or
    None when the forward takes no ``use_cache``."""
    try:
        parameters = list(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return None
    if "use_cache" not in parameters:
        return None
    return parameters.index("use_cache") - 1


def caches_in_training(model: torch.nn.Module) -> bool:
    """Whether ``model`` would return a key/value cache from a training call: a forward that takes
    ``use_cache`` and a config that has it on."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "use_cache", False)) and _use_cache_index(model) is not None


def _without_cache(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with ``use_cache`` False, where the class forward takes it."""
    index = _use_cache_index(model)
    if index is not None and index < len(args):
        return (*args[:index], False, *args[index + 1:]), kwargs
    return args, {**kwargs, "use_cache": False}


class _ForwardWithoutCache:
    """The class forward called with ``use_cache=False``: the model's instance ``forward`` while it
    is planned (the profiler traces ``model.forward``, not ``model(...)``: hooks do not run there)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, *args, **kwargs):
        args, kwargs = _without_cache(self.model, args, kwargs)
        return type(self.model).forward(self.model, *args, **kwargs)


@contextlib.contextmanager
def cache_off_while_planning(model: torch.nn.Module):
    """Inside the block, ``model.forward`` (and so ``model(...)``) passes ``use_cache=False``: the step
    a plan is traced and measured on is the training step as it will run. The same argument as the
    run's hook, not ``config.use_cache = False``: the config does not reach every submodule (T5's
    decoder holds a copy of it), and the two paths differ in rounding (1.6e-8 in T5's gradients)."""
    if not caches_in_training(model) or "forward" in model.__dict__:
        yield model
        return
    model.__dict__["forward"] = _ForwardWithoutCache(model)
    try:
        yield model
    finally:
        if isinstance(model.__dict__.get("forward"), _ForwardWithoutCache):
            del model.__dict__["forward"]


# Run eagerly under torch.compile (as runtime/native.py's shape check): one graph break before the
# forward, none inside it.
@torch.compiler.disable
def _cache_off_in_training(module: torch.nn.Module, args: tuple, kwargs: dict):
    """The forward pre-hook: ``use_cache=False`` for a training call that records autograd."""
    if not (module.training and torch.is_grad_enabled()):
        return None
    if isinstance(module.__dict__.get("forward"), _ForwardWithoutCache):
        return None  # being planned: the planning forward passes it (no notice for the planner's own steps)
    index = _use_cache_index(module)
    if index is None:
        return None
    if index < len(args):
        asked = args[index]
    else:
        asked = kwargs.get("use_cache")
    if asked is None:
        asked = getattr(getattr(module, "config", None), "use_cache", False)
    if not asked:
        return None
    _notice()
    return _without_cache(module, args, kwargs)


def _notice() -> None:
    warnings.warn(NOTICE, CacheOffInTraining, stacklevel=2)


def install_cache_off(model: torch.nn.Module) -> bool:
    """Register :func:`_cache_off_in_training` on ``model`` when it caches in training (once);
    return whether it is registered."""
    if not caches_in_training(model):
        return False
    if not has_cache_off(model):
        model.register_forward_pre_hook(_cache_off_in_training, with_kwargs=True)
    return True


def has_cache_off(model: torch.nn.Module) -> bool:
    return any(hook is _cache_off_in_training for hook in model._forward_pre_hooks.values())


def remove_cache_off(model: torch.nn.Module) -> None:
    """Undo :func:`install_cache_off`."""
    remove_pre_hook(model, _cache_off_in_training)


__all__ = ["CacheOffInTraining", "NOTICE", "cache_off_while_planning", "caches_in_training", "has_cache_off",
           "install_cache_off", "remove_cache_off"]
