"""A plan bound to a model's traced step, and the ``autograd.Function`` that runs it (runtime/module.py).

:func:`bind` traces the model once, checks the trace is the planned graph (fingerprint, and op by op
where the plan carries its profile) and builds the schedule's executor (runtime/executor.py, or
runtime/compiled.py's inductor graphs). :class:`ScheduleStep` runs the schedule's steps before the
loss as its forward and the rest as its backward, so any valid schedule runs, not only segment
checkpointing: the schedule itself decides what crosses from the forward to the backward
(docs/runtime.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from profiler.api import choose_grouping
from profiler.capture import JointGraph, LossInfo, autocast_disabled, capture
from profiler.costgraph import LOG_PROBS_RECOMPUTED, build_cost_graph
from profiler.fusions import recompute_log_probs
from profiler.inputs import InputMismatch, input_layout
from profiler.measure import OpTimes
from profiler.state import cuda_devices
from solvers import simulate

from .compiled import CompiledExecutor
from .drift import check_drift, check_python_effects, python_rng_states, python_state
from .executor import Executor, ScheduleError, placeholder_labels
from .guards import (NATIVE_HINT, PlanMismatch, check_requires_grad, check_state, compare_ops, flatten_call,
                     op_signature, state_specs)
from .programs import compile_programs


def _keep_graph() -> bool:
    """Whether the running backward was asked to keep its graph (``retain_graph=True``)."""
    getter = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return bool(getter()) if getter is not None else False  # unknown: free, and refuse a second backward


class ScheduleStep(torch.autograd.Function):
    """forward: the schedule's steps before the loss; backward: the steps after it.

    Everything a call needs in its backward is on its own ``ctx`` (held values, RNG states, version
    counters), so several forwards may run before their backwards."""

    @staticmethod
    def forward(ctx, bound: BoundPlan, module: torch.nn.Module, *tensors):
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
        bound: BoundPlan = ctx.bound
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


class BoundPlan:
    """A plan bound to a model's traced graph: the executor and the mapping of tensors."""

    def __init__(self, model: torch.nn.Module, joint: JointGraph, executor: Executor):
        self.snapshot = python_state(model)  # what the trace saw; every training call compares
        self.joint = joint
        self.executor = executor
        self.param_names = [p.key for p in joint.placeholders if p.role == "param"]
        self.frozen_names = [p.key for p in joint.placeholders if p.role == "frozen"]
        self.placeholders = joint.placeholders
        self.grad_param_index = {name: i for i, (name, _) in enumerate(joint.grad_params)}
        self.grad_input_index = {index: len(joint.grad_params) + i for i, (index, _) in enumerate(joint.grad_inputs)}
        self.state_specs = state_specs(joint)

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


def _trace_inputs(layout, inputs: list[torch.Tensor]) -> tuple[tuple, dict]:
    """The call's inputs with ``requires_grad`` as in ``layout``: traced otherwise, the step would
    differ from the planned one by the inputs' gradients alone."""
    tensors = []
    for tensor, spec in zip(inputs, layout.tensor_specs):
        if tensor.requires_grad != spec.requires_grad:
            tensor = tensor.detach().requires_grad_(spec.requires_grad)
        tensors.append(tensor)
    return layout.unflatten(tensors)


def bind(model: torch.nn.Module, plan, args: tuple, kwargs: dict, compiled: bool = False,
         planned_ops: list[str] | None = None) -> BoundPlan:
    """Trace ``model`` and check that it is the planned graph: the same fingerprint (structure and
    sizes) and, where ``planned_ops`` (the plan's own trace, :func:`op_signature`) is known, the same
    ops with the same constants. The model's own trace is what runs, never the plan's: a plan whose
    checks pass on another model's trace still computes that model's step."""
    profile = getattr(plan, "profile", None)
    if profile is not None:
        # Before tracing, what the plan's own trace says of the parameters and inputs: the messages
        # name the parameter or input that differs, where a fingerprint could only say "different".
        frozen = [p.key for p in profile.joint.placeholders if p.role == "frozen"]
        check_state(state_specs(profile.joint), frozen, dict(model.named_parameters()), dict(model.named_buffers()))
        layout = profile.joint.layout
        inputs = flatten_call(layout, args, kwargs)
        check_requires_grad(inputs, layout)
        args, kwargs = _trace_inputs(layout, inputs)
    else:
        expected, got = list(getattr(plan, "inputs", None) or []), input_layout(args, kwargs).signature
        if expected and got != expected:  # before tracing: the trace would fail on the plan's output shapes
            raise InputMismatch(
                f"the inputs are {', '.join(got) or 'no tensors'}; the plan was made for {', '.join(expected)}. "
                "Plans are made for fixed shapes: re-plan for these inputs, " + NATIVE_HINT + "."
            )
    loss = LossInfo(0.0, tuple(plan.tangent_outputs), tuple(plan.tangent_specs))
    random_before, state_before = python_rng_states(), python_state(model)
    joint, _ = capture(model, args, kwargs, loss=loss)
    check_python_effects(model, args, kwargs, random_before, state_before)
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
            f"this model gives {graph.graph['fingerprint']}); make a new plan for it, {NATIVE_HINT}.{note}"
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
    return BoundPlan(model, joint, executor)
