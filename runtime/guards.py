"""The traced executor's checks of a call against its plan, tensors and ops (runtime/module.py).

A planned module refuses (:class:`PlanMismatch`, :class:`profiler.inputs.InputMismatch`) rather than
run a step that is not the one planned: parameters and buffers other than the traced ones (names,
shapes, dtypes, a frozen parameter unfrozen), inputs of other shapes or that newly require grad, a
model whose traced ops differ from the plan's (:func:`op_signature`), another autocast state, or
submodules sharded by FSDP2 on their own. The Python state a trace depends on is checked by
runtime/drift.py. Why: docs/runtime.md.
"""

from __future__ import annotations

import re

import torch
import torch.fx as fx

from profiler.capture import JointGraph, autocast_state
from profiler.inputs import InputMismatch


class PlanMismatch(ValueError):
    """The plan was made for a different model, input shapes or torch version."""


def state_specs(joint: JointGraph) -> dict[tuple[str, str], tuple[tuple[int, ...], torch.dtype]]:
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


NATIVE_HINT = ("or use the default native executor (planner.plan(model, inputs, budget) without solver= or "
                "executor='traced'), which runs the model's own forward at every call")


def flatten_call(layout, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The call's tensors, checked against the traced ones; a refusal says what serves other shapes."""
    try:
        return layout.flatten(args, kwargs)
    except InputMismatch as error:
        raise InputMismatch(
            f"{error} The traced executor runs the one input signature it traced: for other batch sizes or "
            f"sequence lengths (a smaller last batch), make a plan for them, drop the last batch "
            f"(DataLoader(drop_last=True)), {NATIVE_HINT}: its plans serve every shape up to the planned one."
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
                f"{NATIVE_HINT}."
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
        f"model, {NATIVE_HINT}."
    )


def _describe_autocast(state: str) -> str:
    return f"torch.autocast ({state})" if state else "no autocast"


def check_autocast(planned: str) -> None:
    """The graph was traced under the plan's autocast state and contains its casts: run under
    another state, the step would silently compute in other dtypes than the caller asked for."""
    current = autocast_state()
    if current != planned:
        raise PlanMismatch(
            f"this plan was made under {_describe_autocast(planned)} but is called under "
            f"{_describe_autocast(current)}; call the module under the same autocast as at planning time, "
            "or make a plan under this one"
        )


def fsdp2_sharded(module: torch.nn.Module) -> list[str]:
    """Paths of ``module``'s modules (itself: ``""``) that FSDP2's ``fully_shard`` has wrapped."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return []
    return [name for name, m in module.named_modules() if isinstance(m, FSDPModule)]


def check_no_sharded_submodules(module: torch.nn.Module) -> None:
    """FSDP2 works through forward hooks on each module it shards; the plan runs the traced step,
    never the submodules' forward, so those hooks would never gather their parameters."""
    inner = [name for name in fsdp2_sharded(module) if name]
    if inner:
        raise PlanMismatch(
            f"submodule {inner[0]!r} is sharded by fully_shard on its own; a planned module runs its whole "
            "step as one graph, so apply fully_shard to the planned module as a whole (plan, apply, then wrap)"
        )
