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
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import random
import sys
import types
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from profiler.capture import JointGraph, LossInfo, autocast_disabled, autocast_state, capture
from profiler.costgraph import LOG_PROBS_RECOMPUTED, build_cost_graph
from profiler.fusions import recompute_log_probs
from profiler.inputs import InputMismatch, input_layout
from profiler.measure import OpTimes
from profiler.api import choose_grouping
from profiler.state import cuda_devices, preserved_state

from solvers import simulate

from .compiled import CompiledExecutor
from .executor import Executor, ScheduleError, placeholder_labels
from .programs import compile_programs


class PlanMismatch(ValueError):
    """The plan was made for a different model, input shapes or torch version."""


def _keep_graph() -> bool:
    """Whether the running backward was asked to keep its graph (``retain_graph=True``)."""
    getter = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return bool(getter()) if getter is not None else False  # unknown: free, and refuse a second backward


class _Step(torch.autograd.Function):
    """forward: the schedule's steps before the loss; backward: the steps after it.

    Everything a call needs in its backward is on its own ``ctx`` (held values, RNG states, version
    counters), so several forwards may run before their backwards."""

    @staticmethod
    def forward(ctx, bound: _Bound, module: torch.nn.Module, *tensors):
        ctx.bound = bound
        ctx.set_materialize_grads(False)
        fixed = bound.fixed_values(module, tensors)
        with autocast_disabled():  # the graph holds autocast's casts already (docs/runtime.md)
            outputs, state = bound.executor.forward(fixed)
        ctx.state, ctx.fixed = state, fixed
        requires_grad = bound.joint.output_requires_grad
        ctx.mark_non_differentiable(*[o for o, r in zip(outputs, requires_grad) if not r or not o.is_floating_point()])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        bound: _Bound = ctx.bound
        if ctx.state is None:  # the first backward freed what the schedule held, as eager autograd frees
            raise RuntimeError(
                "Trying to backward through the graph a second time: the planned module's first backward freed "
                "what its schedule held for the backward. Specify retain_graph=True on the first backward() "
                "if you need to backward through it again."
            )
        if torch.is_grad_enabled():  # create_graph=True: the schedule's backward records no graph
            raise RuntimeError(
                "double backward (create_graph=True, or torch.autograd.grad(..., create_graph=True)) through a "
                "module planned with the traced executor is not supported: its backward runs the schedule "
                "without recording a graph, so gradients of these gradients would be missing. Use the default "
                "native executor (planner.plan(model, inputs, budget) without solver=/executor='traced')."
            )
        keep = _keep_graph()
        tangents = bound.tangents(grad_outputs)
        with autocast_disabled():  # a backward() called inside torch.autocast must not re-cast
            gradients = bound.executor.backward(ctx.state, tangents, ctx.fixed, keep=keep)
        if not keep:
            ctx.state = ctx.fixed = None
        return (None, None, *bound.input_gradients(gradients))


class _Bound:
    """A plan bound to a model's traced graph: the executor and the mapping of tensors."""

    def __init__(self, model: torch.nn.Module, joint: JointGraph, executor: Executor):
        self.snapshot = python_state(model)  # what the trace saw; every training call compares
        self.joint = joint
        self.executor = executor
        self.param_names = [p.key for p in joint.placeholders if p.role == "param"]
        self.frozen_names = [p.key for p in joint.placeholders if p.role == "frozen"]
        self.buffer_names = [p.key for p in joint.placeholders if p.role == "buffer"]
        self.placeholders = joint.placeholders
        self.grad_param_index = {name: i for i, (name, _) in enumerate(joint.grad_params)}
        self.grad_input_index = {index: len(joint.grad_params) + i for i, (index, _) in enumerate(joint.grad_inputs)}
        self.state_specs = _state_specs(joint)

    def check_call(self, model: torch.nn.Module, inputs: list[torch.Tensor]) -> None:
        """Refuse a call the traced step would not compute faithfully: an input that requires grad
        where the trace's did not, or Python state that drifted since the trace."""
        check_requires_grad(inputs, self.joint.layout)
        check_drift(self.snapshot, python_state(model))

    def function_inputs(self, model, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        self.check_state(params, dict(model.named_buffers()))
        return [params[name] for name in self.param_names] + list(inputs)

    def check_state(self, params: dict, buffers: dict) -> None:
        """The module holds the parameters and buffers the graph was traced with, every call: the plan
        may be applied to another model, and parameters may be frozen or unfrozen between steps."""
        check_state(self.state_specs, self.frozen_names, params, buffers)

    def fixed_values(self, model: torch.nn.Module, tensors) -> dict[str, torch.Tensor]:
        """Placeholder name -> tensor; ``tensors`` are the Function's inputs (params, then inputs)."""
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        trainable = dict(zip(self.param_names, tensors[: len(self.param_names)]))
        inputs = tensors[len(self.param_names) :]
        fixed = {}
        for p in self.placeholders:
            if p.role == "param":
                fixed[p.name] = trainable[p.key]
            elif p.role == "frozen":
                fixed[p.name] = params[p.key]
            elif p.role == "buffer":
                fixed[p.name] = buffers[p.key]
            elif p.role == "input":
                fixed[p.name] = inputs[p.key]
        return fixed

    def tangents(self, grad_outputs) -> list[torch.Tensor]:
        """The gradients the plan's graph expects, from those autograd passes in."""
        expected = set(self.joint.loss.tangent_outputs)
        for index, grad in enumerate(grad_outputs):
            if grad is not None and index not in expected:
                raise RuntimeError(
                    f"the loss depends on model output #{index}, but the plan was made for a loss that does "
                    "not; re-plan with a loss_fn that computes your loss"
                )
        result = []
        for index, spec in zip(self.joint.loss.tangent_outputs, self.joint.loss.tangent_specs):
            grad = grad_outputs[index]
            result.append(grad if grad is not None else torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device))
        return result

    def input_gradients(self, gradients: list[torch.Tensor]) -> list:
        """Gradients in the Function's input order: parameters, then input tensors."""
        result = []
        for name in self.param_names:
            index = self.grad_param_index.get(name)
            result.append(gradients[index] if index is not None else None)
        for i in range(len(self.joint.layout.tensor_positions)):
            index = self.grad_input_index.get(i)
            result.append(gradients[index] if index is not None else None)
        return result

    def assemble(self, outputs: tuple) -> Any:
        leaves: list[Any] = [None] * (len(self.joint.tensor_output_positions) + len(self.joint.output_constants))
        for position, tensor in zip(self.joint.tensor_output_positions, outputs):
            leaves[position] = tensor
        for position, value in self.joint.output_constants.items():
            leaves[position] = value
        return pytree.tree_unflatten(leaves, self.joint.output_spec)


def _state_specs(joint: JointGraph) -> dict[tuple[str, str], tuple[tuple[int, ...], torch.dtype]]:
    """("param" | "buffer", name) -> (shape, dtype) of the graph's parameter and buffer placeholders."""
    nodes = {n.name: n for n in joint.graph_module.graph.nodes if n.op == "placeholder"}
    specs = {}
    for p in joint.placeholders:
        if p.role in ("param", "frozen", "buffer"):
            value = nodes[p.name].meta["val"]
            specs[("buffer" if p.role == "buffer" else "param", p.key)] = (tuple(value.shape), value.dtype)
    return specs


def check_state(specs: dict, frozen_names: list[str], params: dict, buffers: dict) -> None:
    """Refuse parameters and buffers other than ``specs`` (names, shapes, dtypes), and a parameter
    of ``frozen_names`` that requires grad now."""
    held = {**{("param", n): p for n, p in params.items()}, **{("buffer", n): b for n, b in buffers.items()}}
    for key in held.keys() - specs.keys():
        raise PlanMismatch(f"this model has {key[0]} {key[1]!r}, which the plan's model did not; make a new plan")
    for key, (shape, dtype) in specs.items():
        tensor = held.get(key)
        if tensor is None:
            raise PlanMismatch(f"the plan's model has {key[0]} {key[1]!r}, which this model does not; make a new plan")
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise PlanMismatch(
                f"{key[0]} {key[1]!r} is {_spec(tuple(tensor.shape), tensor.dtype)} here but "
                f"{_spec(shape, dtype)} in the plan's model: this plan was made for a different model"
            )
    for name in frozen_names:
        if params[name].requires_grad:
            raise PlanMismatch(
                f"parameter {name!r} was frozen (requires_grad=False) when the plan was made and requires grad "
                "now; the plan computes no gradient for it: make a new plan"
            )


def _spec(shape: tuple, dtype: torch.dtype) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(shape)}"


_NATIVE_HINT = ("or use the default native executor (planner.plan(model, inputs, budget) without solver= or "
                "executor='traced'), which runs the model's own forward at every call")


def _flatten(layout, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The call's tensors, checked against the traced ones; a refusal says what serves other shapes."""
    try:
        return layout.flatten(args, kwargs)
    except InputMismatch as error:
        raise InputMismatch(
            f"{error} The traced executor runs the one input signature it traced: for other batch sizes or "
            f"sequence lengths (a smaller last batch), make a plan for them, drop the last batch "
            f"(DataLoader(drop_last=True)), {_NATIVE_HINT}: its plans serve every shape up to the planned one."
        ) from None


def check_requires_grad(inputs: list[torch.Tensor], layout) -> None:
    """An input that requires grad where the traced one did not would never get a gradient: the
    traced step computes none for it. (The reverse is fine: the gradient is computed and dropped.)"""
    for index, (tensor, spec) in enumerate(zip(inputs, layout.tensor_specs)):
        if tensor.requires_grad and not spec.requires_grad:
            raise InputMismatch(
                f"input #{index} requires grad, but the plan's step was traced with an input #{index} that does "
                "not: it computes no gradient for it, and its .grad would stay empty. Make a plan with an example "
                f"input that requires grad (x.requires_grad_()), pass it detached if you need no gradient, "
                f"{_NATIVE_HINT}."
            )


def _trace_inputs(layout, inputs: list[torch.Tensor]) -> tuple[tuple, dict]:
    """The call's inputs with ``requires_grad`` as in ``layout``: traced otherwise, the step would
    differ from the planned one by the inputs' gradients alone."""
    tensors = []
    for tensor, spec in zip(inputs, layout.tensor_specs):
        if tensor.requires_grad != spec.requires_grad:
            tensor = tensor.detach().requires_grad_(spec.requires_grad)
        tensors.append(tensor)
    return layout.unflatten(tensors)


def _bind(model: torch.nn.Module, plan, args: tuple, kwargs: dict, compiled: bool = False,
          planned_ops: list[str] | None = None) -> _Bound:
    """Trace ``model`` and check that it is the planned graph: the same fingerprint (structure and
    sizes) and, where ``planned_ops`` (the plan's own trace, :func:`op_signature`) is known, the same
    ops with the same constants. The model's own trace is what runs, never the plan's: a plan whose
    checks pass on another model's trace still computes that model's step."""
    profile = getattr(plan, "profile", None)
    if profile is not None:
        # Before tracing, what the plan's own trace says of the parameters and inputs: the messages
        # name the parameter or input that differs, where a fingerprint could only say "different".
        frozen = [p.key for p in profile.joint.placeholders if p.role == "frozen"]
        check_state(_state_specs(profile.joint), frozen, dict(model.named_parameters()), dict(model.named_buffers()))
        layout = profile.joint.layout
        inputs = _flatten(layout, args, kwargs)
        check_requires_grad(inputs, layout)
        args, kwargs = _trace_inputs(layout, inputs)
    else:
        expected, got = list(getattr(plan, "inputs", None) or []), input_layout(args, kwargs).signature
        if expected and got != expected:  # before tracing: the trace would fail on the plan's output shapes
            raise InputMismatch(
                f"the inputs are {', '.join(got) or 'no tensors'}; the plan was made for {', '.join(expected)}. "
                "Plans are made for fixed shapes: re-plan for these inputs, " + _NATIVE_HINT + "."
            )
    loss = LossInfo(0.0, tuple(plan.tangent_outputs), tuple(plan.tangent_specs))
    random_before, state_before = _python_rng_states(), python_state(model)
    joint, _ = capture(model, args, kwargs, loss=loss)
    _check_python_effects(model, args, kwargs, random_before, state_before)
    planned_graph = getattr(plan, "graph", None)
    if planned_graph is not None and planned_graph.graph.get(LOG_PROBS_RECOMPUTED):
        # Without such a loss the rewrite finds nothing and the fingerprints below disagree.
        joint = recompute_log_probs(joint) or joint
    grouping, _ = choose_grouping(joint, plan.granularity)
    graph = build_cost_graph(joint, grouping, OpTimes({}, 0, 0.0))
    if graph.graph["fingerprint"] != plan.fingerprint:
        grads = [i for i, spec in enumerate(joint.layout.tensor_specs) if spec.requires_grad]
        note = (f" Input #{grads[0]} requires grad here: a plan made for inputs that do not has no gradients for "
                "them (pass them detached, or plan with inputs that require grad)." if grads and profile is None else "")
        raise PlanMismatch(
            "this plan was made for a different model or different input shapes, or by an earlier "
            f"plan-checkpoints that traced the step differently (graph fingerprint {plan.fingerprint}, "
            f"this model gives {graph.graph['fingerprint']}); make a new plan for it, {_NATIVE_HINT}.{note}"
        )
    if planned_ops is not None:
        compare_ops(planned_ops, op_signature(joint))
    outcome = simulate(graph, plan.schedule)
    if not outcome.valid:  # a plan file whose schedule was edited: refuse before running any of it
        raise ScheduleError(f"the plan's schedule is not valid for this model's graph: {outcome.error}")
    devices = cuda_devices([*model.parameters()])
    executor = Executor(compile_programs(joint, grouping, graph), plan.schedule, graph, devices,
                        placeholder_labels(joint))
    if compiled:
        executor = CompiledExecutor(executor, joint)
    return _Bound(model, joint, executor)


def _python_rng_states() -> tuple:
    """Python's and (where imported) NumPy's global generator states, comparable with ==."""
    states = [random.getstate()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        states.append((kind, keys.tobytes(), position, has_gauss, gauss))
    return tuple(states)


def _check_python_effects(model: torch.nn.Module, args: tuple, kwargs: dict, random_before: tuple,
                          state_before: dict) -> None:
    """Refuse a forward whose Python code does something at every call that a replayed trace cannot:
    draw from Python's or NumPy's generator (a layer drop on ``random.random()``: the trace took one
    path and would take it at every step), or change a plain attribute (a step counter a schedule
    reads). A change made once, by a first call (a lazily set flag), is told from one made at every
    call by a second, eager forward without grad, its effects on the RNG and buffers undone."""
    if _python_rng_states() != random_before:
        raise PlanMismatch(
            "the model's forward draws from Python's random module or NumPy's global generator (a layer drop, a "
            "random depth): the traced step would take the path of the one call it traced at every step. "
            f"Plan it {_NATIVE_HINT.removeprefix('or ')}."
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
            f"value. Plan it {_NATIVE_HINT.removeprefix('or ')}."
        )


class _Ref:
    """An fx node as :func:`op_signature` writes it: by its position in the graph."""

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"%{self.index}"


def op_signature(joint: JointGraph) -> list[str]:
    """One line per node of the traced step: its op, its arguments (other nodes by position, Python
    constants by value: a float attribute the forward multiplies by appears here) and its result's
    dtype and shape. Two traces of the same model and inputs give the same lines."""
    index: dict[fx.Node, int] = {}
    lines = []
    for position, node in enumerate(joint.graph_module.graph.nodes):
        index[node] = position
        arguments = fx.node.map_arg((node.args, node.kwargs), lambda n: _Ref(index[n]))
        value = node.meta.get("val")
        result = f" -> {_spec(tuple(value.shape), value.dtype)}" if isinstance(value, torch.Tensor) else ""
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        if isinstance(node.target, torch._ops.OpOverload):
            target = str(node.target)
        lines.append(_without_addresses(f"{node.op} {target}{arguments!r}{result}"))
    return lines


def _without_addresses(text: str) -> str:
    import re

    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def compare_ops(planned: list[str], traced: list[str]) -> None:
    """Refuse a model whose traced step is not the plan's, naming the first op that differs."""
    if planned == traced:
        return
    position = next((i for i, (a, b) in enumerate(zip(planned, traced)) if a != b), min(len(planned), len(traced)))

    def line(ops: list[str]) -> str:
        text = ops[position] if position < len(ops) else "(the step ends here)"
        return text if len(text) <= 160 else text[:157] + "..."

    raise PlanMismatch(
        f"this plan was made for a different model: its traced step differs from this model's at op #{position} "
        f"(the plan's: {line(planned)}; this model's: {line(traced)}). The architecture, or a Python attribute its "
        f"forward reads (a float, a flag), is not what it was when the plan was made. Make a new plan for this "
        f"model, {_NATIVE_HINT}."
    )


# -- the Python state a trace depends on ---------------------------------------------------------
_MODULE_TABLES = frozenset(k for k, v in torch.nn.Module().__dict__.items() if isinstance(v, (dict, set)))
_INTERNAL = _MODULE_TABLES | {"training", "_is_full_backward_hook", "_compiled_call_impl"}
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
            f"it is now (planner.plan, then planner.apply), {_NATIVE_HINT}."
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


def _planned_forward(self, *args, **kwargs):
    # Not super(type(self), self): wrappers that swap the class (FSDP2's fully_shard makes
    # FSDP<Planned...>) would make that name this very function again.
    original = functools.partial(type(self)._planned_original.forward, self)
    if not self.training or not torch.is_grad_enabled() or self.__dict__.get("_planned_tracing"):
        return original(*args, **kwargs)
    _check_autocast(getattr(self.plan, "autocast", ""))
    bound = self.__dict__.get("_planned_bound")
    if bound is None:
        _check_no_sharded_submodules(self)
        hooks = self.__dict__.get("_planned_hooks")
        if hooks is not None:  # a hook added between apply() and this first call would run once, when traced
            check_drift(hooks, _hook_state(self))
        self.__dict__["_planned_tracing"] = True  # tracing this module traces the original forward
        try:
            bound = _bind(self, self.plan, args, kwargs, self.__dict__.get("_planned_compiled", False),
                          self.__dict__.get("_planned_ops"))
        finally:
            del self.__dict__["_planned_tracing"]
        self.__dict__["_planned_bound"] = bound
    inputs = _flatten(bound.joint.layout, args, kwargs)
    bound.check_call(self, inputs)
    tensors = bound.function_inputs(self, inputs)
    outputs = _Step.apply(bound, self, *tensors)
    return bound.assemble(outputs)


def _hook_state(module: torch.nn.Module) -> dict[tuple, Any]:
    """The hook entries of :func:`python_state`: what apply() saw, compared at the first call."""
    return {key: value for key, value in python_state(module).items() if key[0] in ("hooks", "global hooks")}


def _describe_autocast(state: str) -> str:
    return f"torch.autocast ({state})" if state else "no autocast"


def _check_autocast(planned: str) -> None:
    """The graph was traced under the plan's autocast state and contains its casts: run under
    another state, the step would silently compute in other dtypes than the caller asked for."""
    current = autocast_state()
    if current != planned:
        raise PlanMismatch(
            f"this plan was made under {_describe_autocast(planned)} but is called under "
            f"{_describe_autocast(current)}; call the module under the same autocast as at planning time, "
            "or make a plan under this one"
        )


def _check_no_sharded_submodules(module: torch.nn.Module) -> None:
    """FSDP2 works through forward hooks on each module it shards; the plan runs the traced step,
    never the submodules' forward, so those hooks would never gather their parameters."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return
    inner = [name for name, m in module.named_modules() if m is not module and isinstance(m, FSDPModule)]
    if inner:
        raise PlanMismatch(
            f"submodule {inner[0]!r} is sharded by fully_shard on its own; a planned module runs its whole "
            "step as one graph, so apply fully_shard to the planned module as a whole (plan, apply, then wrap)"
        )


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
        for key in (_MODULE_TABLES - _SHARED_TABLES) & state.keys():
            state[key] = type(state[key])(state[key])  # its own table, the same entries
        state["_modules"] = {name: None if child is None else copy_one(child)
                             for name, child in module._modules.items()}
        clone.__dict__.update(state)
        return clone

    root = copy_one(model)
    for clone in memo.values():
        for name, value in list(clone.__dict__.items()):
            if name not in _MODULE_TABLES:
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
    planned.__dict__["_planned_hooks"] = _hook_state(planned)
    return planned


__all__ = ["InputMismatch", "PlanMismatch", "apply", "copy_module_tree"]
