"""The planned module: a drop-in replacement whose training step runs the plan's schedule.

``apply(model, plan)`` returns a shallow copy of ``model`` whose class derives from the model's own
class: the parameters, buffers and submodules are the same objects (shared, not copied), so
``state_dict`` keys, ``named_parameters``, optimizers, attribute access (``model.config``) and
``isinstance`` all behave as before. Only ``forward`` differs, and only while training with grad
enabled: it then runs the schedule's forward steps inside an ``autograd.Function`` whose backward
runs the rest. In ``eval()`` or under ``torch.no_grad()`` it runs the original forward.

Why an ``autograd.Function`` over the joint graph, rather than a rotor-style executor over stages:
any valid schedule of the profiled graph can run, not only segment checkpointing, because the
schedule itself decides what crosses from the forward to the backward. See docs/runtime.md.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.utils._pytree as pytree

from profiler.capture import JointGraph, LossInfo, autocast_disabled, autocast_state, capture
from profiler.costgraph import LOG_PROBS_RECOMPUTED, build_cost_graph
from profiler.fusions import recompute_log_probs
from profiler.inputs import InputMismatch, input_layout
from profiler.measure import OpTimes
from profiler.api import choose_grouping
from profiler.state import cuda_devices

from solvers import simulate

from .compiled import CompiledExecutor
from .executor import Executor, ScheduleError
from .programs import compile_programs


class PlanMismatch(ValueError):
    """The plan was made for a different model, input shapes or torch version."""


class _Step(torch.autograd.Function):
    """forward: the schedule's steps before the loss; backward: the steps after it."""

    @staticmethod
    def forward(ctx, bound: "_Bound", module: torch.nn.Module, *tensors):
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
        tangents = bound.tangents(grad_outputs)
        with autocast_disabled():  # a backward() called inside torch.autocast must not re-cast
            gradients = bound.executor.backward(ctx.state, tangents, ctx.fixed)
        ctx.state = ctx.fixed = None
        return (None, None, *bound.input_gradients(gradients))


class _Bound:
    """A plan bound to a model's traced graph: the executor and the mapping of tensors."""

    def __init__(self, model: torch.nn.Module, joint: JointGraph, executor: Executor):
        self.joint = joint
        self.executor = executor
        self.param_names = [p.key for p in joint.placeholders if p.role == "param"]
        self.frozen_names = [p.key for p in joint.placeholders if p.role == "frozen"]
        self.buffer_names = [p.key for p in joint.placeholders if p.role == "buffer"]
        self.placeholders = joint.placeholders
        self.grad_param_index = {name: i for i, (name, _) in enumerate(joint.grad_params)}
        self.grad_input_index = {index: len(joint.grad_params) + i for i, (index, _) in enumerate(joint.grad_inputs)}
        self.state_specs = _state_specs(joint)

    def function_inputs(self, model, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        self.check_state(params, dict(model.named_buffers()))
        return [params[name] for name in self.param_names] + list(inputs)

    def check_state(self, params: dict, buffers: dict) -> None:
        """The module holds the parameters and buffers the graph was traced with, every call: the plan
        may be applied to another model, and parameters may be frozen or unfrozen between steps."""
        held = {**{("param", n): p for n, p in params.items()}, **{("buffer", n): b for n, b in buffers.items()}}
        for key in held.keys() - self.state_specs.keys():
            raise PlanMismatch(f"this model has {key[0]} {key[1]!r}, which the plan's model did not; make a new plan")
        for key, (shape, dtype) in self.state_specs.items():
            tensor = held.get(key)
            if tensor is None:
                raise PlanMismatch(f"the plan's model has {key[0]} {key[1]!r}, which this model does not; make a new plan")
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise PlanMismatch(
                    f"{key[0]} {key[1]!r} is {_spec(tuple(tensor.shape), tensor.dtype)} here but "
                    f"{_spec(shape, dtype)} in the plan's model: this plan was made for a different model"
                )
        for name in self.frozen_names:
            if params[name].requires_grad:
                raise PlanMismatch(
                    f"parameter {name!r} was frozen (requires_grad=False) when the plan was made and requires grad "
                    "now; the plan computes no gradient for it: make a new plan"
                )

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


def _spec(shape: tuple, dtype: torch.dtype) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(shape)}"


def _bind(model: torch.nn.Module, plan, args: tuple, kwargs: dict, compiled: bool = False) -> _Bound:
    """Trace ``model`` (or reuse the plan's own profile) and check that it is the planned graph."""
    profile = getattr(plan, "profile", None)
    if profile is not None and profile.graph.graph.get("fingerprint") == plan.fingerprint:
        joint, grouping, graph = profile.joint, profile.grouping, profile.graph
    else:
        expected, got = list(getattr(plan, "inputs", None) or []), input_layout(args, kwargs).signature
        if expected and got != expected:  # before tracing: the trace would fail on the plan's output shapes
            raise InputMismatch(
                f"the inputs are {', '.join(got) or 'no tensors'}; the plan was made for {', '.join(expected)}. "
                "Plans are made for fixed shapes: re-plan for these inputs."
            )
        loss = LossInfo(0.0, tuple(plan.tangent_outputs), tuple(plan.tangent_specs))
        joint, _ = capture(model, args, kwargs, loss=loss)
        planned_graph = getattr(plan, "graph", None)
        if planned_graph is not None and planned_graph.graph.get(LOG_PROBS_RECOMPUTED):
            # Without such a loss the rewrite finds nothing and the fingerprints below disagree.
            joint = recompute_log_probs(joint) or joint
        grouping, _ = choose_grouping(joint, plan.granularity)
        graph = build_cost_graph(joint, grouping, OpTimes({}, 0, 0.0))
        if graph.graph["fingerprint"] != plan.fingerprint:
            raise PlanMismatch(
                "this plan was made for a different model or different input shapes, or by an earlier "
                f"plan-checkpoints that traced the step differently (graph fingerprint {plan.fingerprint}, "
                f"this model gives {graph.graph['fingerprint']}); make a new plan for it"
            )
    outcome = simulate(graph, plan.schedule)
    if not outcome.valid:  # a plan file whose schedule was edited: refuse before running any of it
        raise ScheduleError(f"the plan's schedule is not valid for this model's graph: {outcome.error}")
    devices = cuda_devices([*model.parameters()])
    executor = Executor(compile_programs(joint, grouping, graph), plan.schedule, graph, devices)
    if compiled:
        executor = CompiledExecutor(executor, joint)
    bound = _Bound(model, joint, executor)
    return bound


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
        self.__dict__["_planned_tracing"] = True  # tracing this module traces the original forward
        try:
            bound = _bind(self, self.plan, args, kwargs, self.__dict__.get("_planned_compiled", False))
        finally:
            del self.__dict__["_planned_tracing"]
        self.__dict__["_planned_bound"] = bound
    inputs = bound.joint.layout.flatten(args, kwargs)
    tensors = bound.function_inputs(self, inputs)
    outputs = _Step.apply(bound, self, *tensors)
    return bound.assemble(outputs)


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


@functools.lru_cache(maxsize=None)
def _planned_class(cls: type) -> type:
    """``Planned<Model>``: the model's class with the planned forward."""
    forward = torch._dynamo.disable(_planned_forward)  # torch.compile runs it as it is
    return type(
        f"Planned{cls.__name__}", (cls,), {"forward": forward, "__module__": cls.__module__, "_planned_original": cls}
    )


def apply(model: torch.nn.Module, plan, compile: bool = False) -> torch.nn.Module:
    """A module that shares ``model``'s parameters and runs ``plan``'s schedule in training.

    ``plan`` needs ``schedule``, ``fingerprint``, ``granularity``, ``tangent_outputs`` and
    ``tangent_specs``, and may carry the ``profile`` it was made from (planner.Plan has them).
    The returned module's ``plan`` attribute is ``plan``.

    ``compile=True`` runs the schedule's steps before the loss as one inductor-compiled graph and
    its steps after the loss as another (runtime/compiled.py): the same computes and frees, with
    inductor's fused kernels. The first training call compiles (tens of seconds on a CPU);
    gradients then equal the original model's to rounding rather than to the bit.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"apply() takes an nn.Module, got {type(model).__name__}")
    base = getattr(type(model), "_planned_original", type(model))  # re-planning a planned module
    planned = copy.copy(model)
    planned.__dict__.pop("_planned_bound", None)
    planned.__class__ = _planned_class(base)
    planned.__dict__["plan"] = plan
    planned.__dict__["_planned_compiled"] = bool(compile)
    return planned


__all__ = ["InputMismatch", "PlanMismatch", "apply"]
