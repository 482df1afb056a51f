"""Native plans for models the tracer cannot follow, from an eager step's measurements.

A model whose forward make_fx cannot trace (Python control flow on tensor values, data-dependent
shapes such as an MoE's top-k routing) still runs eagerly. profiler/eager.py records one eager
training step op by op (module hooks, autograd node hooks and a ``TorchDispatchMode``, as PyTorch's
SAC estimator measures per module: what each op makes, reads and keeps alive, its time and scratch
memory) into the same op-level cost graph a trace gives. planner/native.py then plans on it exactly
as for a traced model: the region search (solvers/regions/), the plan measured once on the example
inputs and repaired when it measures over the budget, the same :class:`planner.native_plan.NativePlan`,
summary and file format. The plan's solver message says the step was recorded eagerly, and why.

Save policies: ``@matmuls`` and ``@projections`` are priced on the eager graph as on a trace
(they match aten op names, which eager dispatch shows as a trace does): region sets under them were
predicted 0.07-0.19% above their measured peaks on the zoo's untraceable MoE and control-flow models
and on a 2-layer GPT-2 behind an ``if`` on its logits, as plain regions are. Their ``+draws``
variants are not searched: their model of a dropout's draw (solvers/regions/policies.py ``draw_chains``)
follows a trace's functional ops, where the draw and its scaling are results of their own; eager
draws in place (``bernoulli_`` and ``div_`` into an ``empty_like``, one storage, results of none),
and the GPT-2 MLP ending in a dropout under ``@projections+draws`` was predicted 65,536 B (one
mask) above its measured peak (+1.16%).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import profiler
from profiler.eager import EagerStep, eager_profile
from runtime.native import remove_native
from solvers.regions import SAVE_POLICIES
from solvers.schedule import SolverInfo

from .budget import Budget
from .native import plan_native
from .native_plan import NativePlan

# Save policies the search may give a region of an eagerly recorded step (the module docstring).
POLICIES: tuple[str, ...] = tuple(name for name, policy in SAVE_POLICIES.items() if not policy.draws)


def plan_untraced(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn: Callable | None = None,
                  time_limit: float | None = None, reason: str = "", distributed=None,
                  profile: profiler.Profile | None = None, device_memory: int | None = None,
                  optimizer=None) -> NativePlan:
    """A :class:`NativePlan` for ``budget`` from an eagerly recorded step (the module docstring).
    ``reason``: why the tracer could not follow the model, kept in the plan's solver message.
    ``profile``: an earlier :func:`profiler.eager.eager_profile` of the same model and inputs, to plan
    another budget without recording again. Raises :class:`solvers.Infeasible` (``min_budget`` in
    whole-step bytes) as plan_native does. ``device_memory`` (bytes, planner/bounded.py): the eager
    step cannot be recorded within a bound (nothing to evict: profiler/eager_bound.py), so it is
    refused with :class:`profiler.oom.OutOfMemory` before it would hold more than the device.
    ``optimizer`` (planner/optimizer.py): the whole iteration, its state counted for the parameters
    the recorded backward gave a gradient (``EagerStep.grad_params``)."""
    if profile is None:
        remove_native(model)  # re-planning a model planned before: record its own forward
        profile = eager_profile(model, example_inputs, loss_fn=loss_fn, reason=reason, memory_bound=device_memory)
    reason = reason or profile.joint.reason
    plan = plan_native(model, example_inputs, budget, loss_fn=loss_fn, time_limit=time_limit, profile=profile,
                       distributed=distributed, policies=POLICIES, device_memory=device_memory, optimizer=optimizer)
    info: SolverInfo = plan.schedule.info
    note = "profiled from an eager step: the tracer cannot follow the model" + (f" ({reason})" if reason else "")
    plan.schedule = plan.schedule.with_info(message=f"{info.message}; {note}" if info.message else note)
    return plan


def is_eager(profile: profiler.Profile | None) -> bool:
    """Whether ``profile`` was recorded eagerly (profiler/eager.py), not traced."""
    return profile is not None and isinstance(profile.joint, EagerStep)


__all__ = ["POLICIES", "is_eager", "plan_untraced"]
