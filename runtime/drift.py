"""The Python state a traced step depends on besides tensors, and its drift (runtime/module.py).

The traced executor replays the forward as it ran once. :func:`python_state` snapshots what that
run read besides tensors (module classes, ``training`` flags, hooks, plain attributes and those of a
settings object such as a Hugging Face config); every training call compares (:func:`check_drift`),
and the first refuses a forward whose Python code acts at every call in a way no replay can
(:func:`check_python_effects`: Python's or NumPy's generator drawn from, a plain attribute changed).
Why: docs/runtime.md.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import sys
import types
from typing import Any

import torch

from profiler.state import cuda_devices, preserved_state

from .guards import NATIVE_HINT, PlanMismatch


MODULE_TABLES = frozenset(k for k, v in torch.nn.Module().__dict__.items() if isinstance(v, (dict, set)))
_INTERNAL = MODULE_TABLES | {"training", "_is_full_backward_hook", "_compiled_call_impl"}
_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)
_UNREAD = object()  # a value the snapshot does not look into


_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})


def _plain(value, depth: int = 0):
    """A comparable copy of a plain value (numbers, flags, strings, tuples of them), or ``_UNREAD``.
    Mutable containers (lists, dicts, sets) are not read: modules keep caches and logs in them
    (Hugging Face's ``warnings_issued``), which an eval forward between training steps changes."""
    kind = type(value)
    if kind in _SCALARS or isinstance(value, _PLAIN):
        return (kind.__name__, repr(value))  # repr: nan equals nan, and 1 is not True
    if depth < 2 and isinstance(value, (tuple, frozenset)):
        items = [_plain(v, depth + 1) for v in value]
        if any(v is _UNREAD for v in items):
            return _UNREAD
        return (kind.__name__, tuple(sorted(items) if isinstance(value, frozenset) else items))
    return _UNREAD


def _is_settings(value, config_class) -> bool:
    """Objects that hold a forward's settings: a Hugging Face config, a dataclass instance, a namespace."""
    if config_class is not None and isinstance(value, config_class):
        return True
    return type(value) is types.SimpleNamespace or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _config_class():
    transformers = sys.modules.get("transformers")  # only where the model could hold a config
    return getattr(transformers, "PretrainedConfig", None) if transformers is not None else None


def python_state(root: torch.nn.Module) -> dict[tuple, Any]:
    """What a traced step depends on besides tensors, in comparable form: each module's class,
    ``training`` flag, hook tables (the root's excepted: its hooks run around the planned forward),
    instance-level ``forward``, plain attributes (and those of a settings object it holds: a Hugging
    Face config, a dataclass instance, a SimpleNamespace), and the global module hooks. Cheap enough for every call (a pass over the modules' attributes)."""
    from torch.nn.modules import module as nn_module

    config_class = _config_class()
    state: dict[tuple, Any] = {}
    seen_configs: set[int] = set()
    for path, module in root.named_modules():
        state[("class", path)] = type(module)
        attributes = module.__dict__
        if module is not root:
            state[("training", path)] = module.training
            # hook ids are never reused: the same keys are the same hooks
            state[("hooks", path)] = (*attributes["_forward_pre_hooks"], None, *attributes["_forward_hooks"], None,
                                      *attributes["_backward_pre_hooks"], None, *attributes["_backward_hooks"])
        state[("forward", path)] = id(attributes["forward"]) if "forward" in attributes else None
        for name, value in attributes.items():
            if name in _INTERNAL or name == "plan" or name.startswith("_planned"):
                continue
            if _is_settings(value, config_class):
                if id(value) not in seen_configs:
                    seen_configs.add(id(value))
                    for key, item in getattr(value, "__dict__", {}).items():
                        plain = _plain(item)
                        if plain is not _UNREAD:
                            state[("config", path, f"{name}.{key}")] = plain
                continue
            plain = _plain(value)
            if plain is not _UNREAD:
                state[("attr", path, name)] = plain
    state[("global hooks",)] = tuple(
        tuple(getattr(nn_module, table, {})) for table in
        ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks")
    )
    return state


def _where(path: str) -> str:
    return f"submodule {path!r}" if path else "the model"


def _shown(plain) -> str:
    """A :func:`_plain` value as messages write it: a scalar's repr, a tuple's items."""
    return plain[1] if isinstance(plain[1], str) else "(" + ", ".join(_shown(item) for item in plain[1]) + ")"


def check_drift(traced: dict[tuple, Any], now: dict[tuple, Any]) -> None:
    """Refuse (PlanMismatch) when the Python state the step was traced with has changed."""
    reason = _drift_reason(traced, now, "when the step was traced")
    if reason is not None:
        raise PlanMismatch(
            f"the planned module has changed since its step was traced: {reason}. Make a new plan for the model as "
            f"it is now (planner.plan, then planner.apply), {NATIVE_HINT}."
        )


def _drift_reason(traced: dict[tuple, Any], now: dict[tuple, Any], then: str) -> str | None:
    """What differs first between two :func:`python_state` snapshots, in words; ``then`` says when
    the first was taken ("when the step was traced")."""
    if traced == now:
        return None
    for key in [*traced, *(k for k in now if k not in traced)]:
        before, after = traced.get(key, _UNREAD), now.get(key, _UNREAD)
        if before == after:
            continue
        kind, path = key[0], key[1] if len(key) > 1 else ""
        if kind == "class":
            if before is _UNREAD:
                return f"{_where(path)} was added"
            if after is _UNREAD:
                return f"{_where(path)} was removed"
            return f"{_where(path)} is a {after.__name__} now, a {before.__name__} {then}"
        if before is _UNREAD or after is _UNREAD:
            if kind in ("training", "hooks", "forward"):
                continue  # a module added or removed: its ("class", path) entry says so
            what = f"{path}.{key[2]}" if path else key[2]
            return (f"attribute {what!r} was {'added' if before is _UNREAD else 'removed'}"
                    f"{'' if before is _UNREAD else f' (it was {_shown(before)})'}")
        if kind == "training":
            mode = {True: "training", False: "eval"}
            return (f"{_where(path)} is in {mode[after]} mode now and was in {mode[before]} mode {then} "
                    "(the traced step keeps that mode's dropout and BatchNorm behaviour)")
        if kind == "hooks":
            return (f"hooks were added to or removed from {_where(path)} after the step was traced: the traced "
                    "step never calls a submodule's hooks (their ops ran once, when it was traced)")
        if kind == "forward":
            return f"{_where(path)} has another instance-level forward than {then}"
        if kind == "global hooks":
            return ("global module hooks (torch.nn.modules.module.register_module_forward_hook and friends) were "
                    "added or removed after the step was traced: the traced step never calls them")
        what = f"{path}.{key[2]}" if path else key[2]
        return (f"attribute {what!r} is {_shown(after)} now and was {_shown(before)} {then} "
                "(the traced step computes with what the forward read then)")
    return None


def hook_state(module: torch.nn.Module) -> dict[tuple, Any]:
    """The hook entries of :func:`python_state`: what apply() saw, compared at the first call."""
    return {key: value for key, value in python_state(module).items() if key[0] in ("hooks", "global hooks")}


def python_rng_states() -> tuple:
    """Python's and (where imported) NumPy's global generator states, comparable with ==."""
    states = [random.getstate()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        states.append((kind, keys.tobytes(), position, has_gauss, gauss))
    return tuple(states)


def check_python_effects(model: torch.nn.Module, args: tuple, kwargs: dict, random_before: tuple,
                          state_before: dict) -> None:
    """Refuse a forward whose Python code does something at every call that a replayed trace cannot:
    draw from Python's or NumPy's generator (a layer drop on ``random.random()``: the trace took one
    path and would take it at every step), or change a plain attribute (a step counter a schedule
    reads). A change made once, by a first call (a lazily set flag), is told from one made at every
    call by a second, eager forward without grad, its effects on the RNG and buffers undone."""
    if python_rng_states() != random_before:
        raise PlanMismatch(
            "the model's forward draws from Python's random module or NumPy's global generator (a layer drop, a "
            "random depth): the traced step would take the path of the one call it traced at every step. "
            f"Plan it {NATIVE_HINT.removeprefix('or ')}."
        )
    after_trace = python_state(model)
    changed = [k for k in after_trace.keys() | state_before.keys()
               if k[0] in ("attr", "config") and after_trace.get(k, _UNREAD) != state_before.get(k, _UNREAD)]
    if not changed:
        return
    original = type(model)._planned_original.forward
    with torch.no_grad(), preserved_state(model, cuda_devices([*model.parameters()])):
        original(model, *args, **kwargs)
    reason = _drift_reason(after_trace, python_state(model), "before the call")
    if reason is not None:
        raise PlanMismatch(
            f"the model's forward changes its Python state at every call: after a second call, {reason}. The traced "
            "step does not run the forward's Python code, so it would neither change it nor compute with its new "
            f"value. Plan it {NATIVE_HINT.removeprefix('or ')}."
        )
