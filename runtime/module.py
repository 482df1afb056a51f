"""The planned module: a drop-in replacement whose training step runs the plan's schedule.

``apply(model, plan)`` returns a copy of ``model``'s module tree whose root's class derives from the
model's own class. What it shares with ``model``, and what it does not:

- shared: each module's tables of parameters and buffers (the same dicts holding the same tensors,
  so optimizers, ``load_state_dict``, in-place updates such as BatchNorm's statistics, a parameter
  reassigned and ``model.to(...)``'s new buffers reach both) and every other attribute value (a
  Hugging Face ``config`` object is the same object);
- its own: every module of the tree is a new object with its own ``training`` flag, hook tables
  and table of children. So ``fast.eval()`` leaves ``model`` in training mode, a hook registered on
  ``fast`` or one of its submodules never fires on ``model`` (and the reverse), and replacing a
  child module of one leaves the other's as it was (train the one you replaced it in). A hook
  registered on ``model`` before ``apply`` is in both tables (its handle removes it from
  ``model``'s only).

``state_dict`` keys, ``named_parameters``, attribute access (``model.config``) and ``isinstance``
behave as before. Only ``forward`` differs, and only while training with grad enabled: it then runs
the schedule's forward steps inside an ``autograd.Function`` whose backward runs the rest. In
``eval()`` or under ``torch.no_grad()`` it runs the original forward.

The traced step is the Python forward as it ran once, when the module was bound to the plan (its
first training call). Every training call checks that nothing it depends on has drifted since, and
refuses (:class:`PlanMismatch`) rather than run a step that is no longer the model's: submodules
replaced or of another class, their ``training`` flags, hooks added to or removed from any submodule
(or globally), plain Python attributes of every module (numbers, flags, strings, and those of a
Hugging Face ``config``) that the forward may read, an instance-level ``forward``. The first training
call also refuses a forward whose Python code acts at every call in a way no replay can: drawing from
Python's or NumPy's global generator (a layer drop) or changing a plain attribute (a step counter).
A plan that carries its profile (an in-memory plan) is also compared op by op with the model's own
trace, so that it is never run on another architecture that happens to have the same parameter
shapes; the model's own trace is what runs in any case. The default
native executor (runtime/native.py) runs the model's Python forward at every call and needs none of
this.

``copy.deepcopy`` and ``torch.save`` of the planned module drop the bound trace; the copy traces
again at its first training call.

Why an ``autograd.Function`` over the joint graph, rather than a rotor-style executor over stages:
any valid schedule of the profiled graph can run, not only segment checkpointing, because the
schedule itself decides what crosses from the forward to the backward. See docs/runtime.md.

Here: the planned class, its copies and pickles, and :func:`apply`. The traced step and its
``autograd.Function``: runtime/step.py; the checks of tensors and ops: runtime/guards.py; of the
Python state: runtime/drift.py.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types

import torch

from profiler.inputs import InputMismatch

from .drift import MODULE_TABLES, check_drift, hook_state
from .guards import PlanMismatch, check_autocast, check_no_sharded_submodules, flatten_call, op_signature
from .step import ScheduleStep, bind


def _planned_forward(self, *args, **kwargs):
    # Not super(type(self), self): wrappers that swap the class (FSDP2's fully_shard makes
    # FSDP<Planned...>) would make that name this very function again.
    original = functools.partial(type(self)._planned_original.forward, self)
    if not self.training or not torch.is_grad_enabled() or self.__dict__.get("_planned_tracing"):
        return original(*args, **kwargs)
    check_autocast(getattr(self.plan, "autocast", ""))
    bound = self.__dict__.get("_planned_bound")
    if bound is None:
        check_no_sharded_submodules(self)
        hooks = self.__dict__.get("_planned_hooks")
        if hooks is not None:  # a hook added between apply() and this first call would run once, when traced
            check_drift(hooks, hook_state(self))
        self.__dict__["_planned_tracing"] = True  # tracing this module traces the original forward
        try:
            bound = bind(self, self.plan, args, kwargs, self.__dict__.get("_planned_compiled", False),
                         self.__dict__.get("_planned_ops"))
        finally:
            del self.__dict__["_planned_tracing"]
        self.__dict__["_planned_bound"] = bound
    inputs = flatten_call(bound.joint.layout, args, kwargs)
    bound.check_call(self, inputs)
    tensors = bound.function_inputs(self, inputs)
    outputs = ScheduleStep.apply(bound, self, *tensors)
    return bound.assemble(outputs)


# What a copy or a pickle of a planned module leaves out: the bound trace (fx graphs over fake
# tensors, compiled code; rebuilt at the next training call) and the flag set while tracing.
_UNCOPIED = ("_planned_bound", "_planned_tracing")


def _copyable_state(module: torch.nn.Module) -> dict:
    state = module.__getstate__()
    for key in _UNCOPIED:
        state.pop(key, None)
    return state


def _restore_planned(base: type) -> torch.nn.Module:
    """An empty planned module of ``base``'s planned class; pickle then sets its state."""
    return object.__new__(_planned_class(base))


def _planned_reduce_ex(self, protocol):
    # Pickle the planned class by its base (it is made at run time, so it has no importable name)
    # and the plan without its in-memory profile (fake tensors, fx graphs); the op signature
    # taken from that profile at apply() is kept, so the checks stay as strict after loading.
    state = _copyable_state(self)
    plan = state.get("plan")
    if getattr(plan, "profile", None) is not None and dataclasses.is_dataclass(plan):
        state["plan"] = dataclasses.replace(plan, profile=None)
    return _restore_planned, (type(self)._planned_original,), state


def _planned_deepcopy(self, memo):
    plan = self.__dict__.get("plan")
    if plan is not None:
        memo.setdefault(id(plan), plan)  # the plan is read-only data: the copy shares it, profile and all
    copied = object.__new__(type(self))
    memo[id(self)] = copied
    copied.__setstate__(copy.deepcopy(_copyable_state(self), memo))
    return copied


@functools.cache
def _planned_class(cls: type) -> type:
    """``Planned<Model>``: the model's class with the planned forward."""
    forward = torch._dynamo.disable(_planned_forward)  # torch.compile runs it as it is
    return type(
        f"Planned{cls.__name__}", (cls,),
        {"forward": forward, "__module__": cls.__module__, "_planned_original": cls,
         "__reduce_ex__": _planned_reduce_ex, "__deepcopy__": _planned_deepcopy},
    )


# The tables a copied module shares with its original: its parameters and buffers are the model's.
_SHARED_TABLES = frozenset({"_parameters", "_buffers", "_non_persistent_buffers_set"})


def copy_module_tree(model: torch.nn.Module) -> tuple[torch.nn.Module, dict[int, torch.nn.Module]]:
    """A copy of ``model``'s module tree sharing its tables of parameters and buffers (and every
    other attribute value) but no module: each module is a new object with its own ``training``
    flag, hook tables and table of children. Returns the copy and ``id(original module) -> its copy``.

    References to modules of the tree held outside the tables (a module stored as a plain attribute,
    a bound method or an instance-level ``forward`` wrapping one, e.g. the native executor's) are
    pointed at the copies, so that the copy never runs the original's modules."""
    memo: dict[int, torch.nn.Module] = {}

    def copy_one(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) in memo:  # a module reached twice (shared) stays one module
            return memo[id(module)]
        clone = object.__new__(type(module))
        memo[id(module)] = clone
        state = dict(module.__dict__)
        for key in (MODULE_TABLES - _SHARED_TABLES) & state.keys():
            state[key] = type(state[key])(state[key])  # its own table, the same entries
        state["_modules"] = {name: None if child is None else copy_one(child)
                             for name, child in module._modules.items()}
        clone.__dict__.update(state)
        return clone

    root = copy_one(model)
    for clone in memo.values():
        for name, value in list(clone.__dict__.items()):
            if name not in MODULE_TABLES:
                clone.__dict__[name] = _repointed(value, memo)
    return root, memo


def _repointed(value, memo: dict[int, torch.nn.Module]):
    """``value`` with references to the tree's original modules replaced by their copies (one level
    deep: a module, a bound method, a partial, a list or tuple of them, or a plain object holding one)."""
    if isinstance(value, torch.nn.Module):
        return memo.get(id(value), value)
    if isinstance(value, types.MethodType) and id(value.__self__) in memo:
        return types.MethodType(value.__func__, memo[id(value.__self__)])
    if isinstance(value, functools.partial):
        args = [memo.get(id(a), a) if isinstance(a, torch.nn.Module) else a for a in value.args]
        if any(a is not b for a, b in zip(args, value.args)):
            return functools.partial(value.func, *args, **value.keywords)
        return value
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        items = [memo.get(id(v), v) if isinstance(v, torch.nn.Module) else v for v in value]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    attributes = getattr(value, "__dict__", None)
    if (isinstance(attributes, dict) and not isinstance(value, (type, types.FunctionType, types.ModuleType, torch.Tensor))
            and any(isinstance(v, torch.nn.Module) and id(v) in memo for v in attributes.values())):
        clone = copy.copy(value)
        for name, item in attributes.items():
            if isinstance(item, torch.nn.Module) and id(item) in memo:
                setattr(clone, name, memo[id(item)])
        return clone
    return value


def apply(model: torch.nn.Module, plan, compile: bool = False) -> torch.nn.Module:
    """A module that shares ``model``'s parameters and runs ``plan``'s schedule in training.

    ``plan`` needs ``schedule``, ``fingerprint``, ``granularity``, ``tangent_outputs`` and
    ``tangent_specs``, and may carry the ``profile`` it was made from (planner.Plan has them).
    The returned module's ``plan`` attribute is ``plan``. What it shares with ``model`` and what it
    does not: the module docstring.

    ``compile=True`` runs the schedule's steps before the loss as one inductor-compiled graph and
    its steps after the loss as another (runtime/compiled.py): the same computes and frees, with
    inductor's fused kernels. The first training call compiles (tens of seconds on a CPU);
    gradients then equal the original model's to rounding rather than to the bit.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"apply() takes an nn.Module, got {type(model).__name__}")
    base = getattr(type(model), "_planned_original", type(model))  # re-planning a planned module
    planned, _ = copy_module_tree(model)
    for key in (*_UNCOPIED, "_planned_ops", "_planned_hooks"):
        planned.__dict__.pop(key, None)
    planned.__class__ = _planned_class(base)
    planned.__dict__["plan"] = plan
    planned.__dict__["_planned_compiled"] = bool(compile)
    profile = getattr(plan, "profile", None)
    if profile is not None:  # the plan's own trace: the model's must match it op for op
        planned.__dict__["_planned_ops"] = op_signature(profile.joint)
    planned.__dict__["_planned_hooks"] = hook_state(planned)
    return planned


__all__ = ["InputMismatch", "PlanMismatch", "apply", "copy_module_tree"]
