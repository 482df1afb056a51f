"""The whole training iteration in the budget: ``plan(..., optimizer=)`` (docs/native.md, "The whole iteration").

Without an optimizer a budget bounds one step's forward and backward. With one, it bounds the
iteration a training loop runs::

    optimizer.zero_grad(set_to_none=True)
    output = model(*inputs)
    loss = loss_fn(output)
    loss.backward()
    optimizer.step()              # output and loss still held, as a loop's variables are

From the second iteration on, the optimizer's state (AdamW: two copies of the parameters and a step
count each) is held through the forward and the backward; and ``step()`` runs while the gradients,
the outputs and the state are held, allocating its temporaries (a for-loop AdamW: twice its largest
parameter; a foreach one: a copy of each param group in turn). So the iteration's peak is the larger of

- the forward and backward's peak plus the state, and
- what is held when ``step()`` starts (parameters, buffers, inputs, gradients, outputs, loss) plus
  the most ``step()`` allocates above that, its first step (the state created) or a later one.

Sizes come from profiler/optimizer.py (the optimizer's step run on fake tensors, byte-equal to the
allocator's events) and from the traced step (what its backward leaves held).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from solvers.schedule import COMPUTE

from .budget import format_bytes

if TYPE_CHECKING:  # torch is imported where it is used: the command line checks --optimizer without it
    import torch

    from profiler.optimizer import OptimizerRecipe

# name -> (torch.optim class, constructor arguments, what it holds). lr is a placeholder: no size
# depends on it. Each uses torch's defaults otherwise (weight_decay, betas, foreach: None, which is
# the for-loop implementation on the CPU and foreach on CUDA).
OPTIMIZER_NAMES: dict[str, tuple[str, dict, str]] = {
    "adamw": ("AdamW", {}, "torch.optim.AdamW: two moments (one parameter's size each) and a step count per parameter"),
    "adam": ("Adam", {}, "torch.optim.Adam: two moments and a step count per parameter"),
    "sgd": ("SGD", {}, "torch.optim.SGD without momentum: no state"),
    "sgd-momentum": ("SGD", {"momentum": 0.9}, "torch.optim.SGD(momentum=0.9): one momentum buffer per parameter"),
    "adagrad": ("Adagrad", {}, "torch.optim.Adagrad: a sum of squares and a step count per parameter"),
    "rmsprop": ("RMSprop", {}, "torch.optim.RMSprop: a square average and a step count per parameter"),
    "adamax": ("Adamax", {}, "torch.optim.Adamax: two moments and a step count per parameter"),
    "nadam": ("NAdam", {}, "torch.optim.NAdam: two moments, a step count and a momentum product per parameter"),
    "radam": ("RAdam", {}, "torch.optim.RAdam: two moments and a step count per parameter"),
    "adadelta": ("Adadelta", {}, "torch.optim.Adadelta: two running averages and a step count per parameter"),
}
# NAME:IMPLEMENTATION picks the step's implementation, as the constructor's foreach/fused arguments do.
IMPLEMENTATIONS: dict[str, dict] = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
ACCEPTED_OPTIMIZERS = (
    "a torch.optim.Optimizer over the model's parameters (its class, hyper-parameters and param groups are "
    "counted), or a name: " + ", ".join(OPTIMIZER_NAMES) + ", optionally with :" + ", :".join(IMPLEMENTATIONS)
    + " (e.g. adamw:fused; default: torch's choice for the parameters' device)")


class OptimizerSpecError(ValueError):
    """``optimizer=`` (``--optimizer``) is not an optimizer or a known name; the message lists them."""


@dataclass(frozen=True)
class IterationMemory:
    """What the optimizer adds to a training iteration's memory, in bytes of the whole iteration.

    ``optimizer``: what was counted, in words (recorded in the plan). ``state_bytes``: the state,
    held through every forward and backward after the first step. ``step_peak_bytes``: the most
    live while ``step()`` runs (held when it starts, state included, plus its temporaries)."""

    optimizer: str
    state_bytes: int
    step_peak_bytes: int

    def peak(self, forward_backward_peak_bytes: int) -> int:
        """The iteration's peak, given the forward and backward's peak with the state held."""
        return max(forward_backward_peak_bytes, self.step_peak_bytes)


NO_OPTIMIZER = IterationMemory(optimizer="", state_bytes=0, step_peak_bytes=0)


def optimizer_problem(optimizer) -> str | None:
    """Why ``optimizer`` is not accepted (before any work), or None when it is."""
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        name, _, implementation = optimizer.strip().lower().partition(":")
        if name in OPTIMIZER_NAMES and (not implementation or implementation in IMPLEMENTATIONS):
            return None
        shown = optimizer if len(optimizer) <= 40 else optimizer[:37] + "..."
        return f"optimizer {shown!r} is not known; accepted: {ACCEPTED_OPTIMIZERS}"
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        return None
    return f"optimizer= takes {ACCEPTED_OPTIMIZERS}; got {type(optimizer).__name__}"


def check_optimizer(optimizer) -> None:
    """Raise :class:`OptimizerSpecError` for an optimizer that :func:`optimizer_problem` refuses."""
    problem = optimizer_problem(optimizer)
    if problem:
        raise OptimizerSpecError(problem)


def recipe_for(optimizer, model: torch.nn.Module) -> tuple[OptimizerRecipe, str]:
    """The optimizer to measure, over ``model``'s parameters, and its description for the plan.

    An instance is taken as it is: its parameters must be the model's (one that is not is refused:
    its gradients are not the step's). A name is its class over every trainable parameter, one group."""
    import torch

    from profiler.optimizer import OptimizerRecipe

    check_optimizer(optimizer)
    owned = {id(p) for p in model.parameters()}
    if isinstance(optimizer, torch.optim.Optimizer):
        recipe = OptimizerRecipe.of(optimizer)
        strangers = sum(1 for params, _ in recipe.groups for p in params if id(p) not in owned)
        if strangers:
            raise OptimizerSpecError(
                f"the {type(optimizer).__name__} given holds {strangers} tensor(s) that are not parameters of the model "
                f"({type(model).__name__}): build it over this model's parameters, e.g. "
                f"{type(optimizer).__name__}(model.parameters(), ...)")
        return recipe, describe_instance(optimizer)
    name, _, implementation = optimizer.strip().lower().partition(":")
    class_name, kwargs, _ = OPTIMIZER_NAMES[name]
    kwargs = {"lr": 1e-3, **kwargs, **IMPLEMENTATIONS.get(implementation, {})}
    trainable = tuple(p for p in model.parameters() if p.requires_grad)
    recipe = OptimizerRecipe(getattr(torch.optim, class_name), kwargs, ((trainable, {}),))
    return recipe, f"{name}{':' + implementation if implementation else ''} ({class_name}, 1 param group)"


# The hyper-parameters that change what a torch optimizer holds or allocates, shown in its description.
_SHOWN = ("momentum", "nesterov", "weight_decay", "amsgrad", "centered", "foreach", "fused", "maximize")


def describe_instance(optimizer: torch.optim.Optimizer) -> str:
    """``AdamW, 2 param groups (weight_decay 0.1 / 0.0), foreach None``: the class and what differs."""
    groups = optimizer.param_groups
    parts = [type(optimizer).__name__, f"{len(groups)} param group{'s' if len(groups) != 1 else ''}"]
    for key in _SHOWN:
        values = [g[key] for g in groups if key in g]
        if not values or (key not in ("foreach", "fused") and not any(values)):
            continue
        shown = " / ".join(str(v) for v in values) if len(set(map(str, values))) > 1 else str(values[0])
        parts.append(f"{key} {shown}")
    return ", ".join(parts)


def held_at_the_end(graph, schedule: Iterable) -> int:
    """Bytes of the results ``schedule`` holds when it ends (the gradients and the model's outputs),
    by its compute and free steps."""
    held: set = set()
    for kind, node in schedule:
        if kind == COMPUTE:
            held.add(node)
        else:
            held.discard(node)
    return sum(int(graph.nodes[node]["mem"]) for node in held)


def iteration_memory(optimizer, model: torch.nn.Module, profile, held_after_backward_bytes: int) -> IterationMemory:
    """What ``optimizer`` (None, an instance or a name: :data:`ACCEPTED_OPTIMIZERS`) adds to the
    iteration of ``model`` traced in ``profile``, when ``held_after_backward_bytes`` (whole step:
    parameters, buffers, inputs, loss, gradients, outputs, a wrapper's buffers) are live as its
    ``step()`` starts. Only the parameters the traced backward gives a gradient get one; an optimizer
    skips the others. Raises :class:`OptimizerSpecError` (a bad spec) or
    :class:`profiler.optimizer.OptimizerError` (it cannot be measured)."""
    if optimizer is None:
        return NO_OPTIMIZER
    from profiler.optimizer import measure_optimizer

    recipe, described = recipe_for(optimizer, model)
    names = {id(p): name for name, p in model.named_parameters()}
    with_gradient = {name for name, _ in profile.joint.grad_params}
    measured = measure_optimizer(recipe, lambda p: names.get(id(p)) in with_gradient)
    return IterationMemory(optimizer=described, state_bytes=measured.state_bytes,
                           step_peak_bytes=measured.step_peak_bytes(held_after_backward_bytes))


def step_over_budget(iteration: IterationMemory, budget_text: str, budget_bytes: int) -> str | None:
    """The message when the optimizer's step alone exceeds the budget (no checkpointing lowers it:
    it runs after the backward), else None."""
    if iteration.step_peak_bytes <= budget_bytes:
        return None
    return (f"budget {budget_text} ({format_bytes(budget_bytes)}) is below what the optimizer's step needs: "
            f"{format_bytes(iteration.step_peak_bytes)} ({iteration.step_peak_bytes} bytes: parameters, gradients, "
            f"outputs and its state of {format_bytes(iteration.state_bytes)}, plus its temporaries; {iteration.optimizer}); "
            "checkpointing does not lower it: give a larger budget, or an optimizer step that allocates less (a fused "
            "one allocates no temporaries)")


__all__ = ["ACCEPTED_OPTIMIZERS", "IMPLEMENTATIONS", "IterationMemory", "NO_OPTIMIZER", "OPTIMIZER_NAMES",
           "OptimizerSpecError", "check_optimizer", "describe_instance", "held_at_the_end",
           "iteration_memory", "optimizer_problem", "recipe_for", "step_over_budget"]
