"""The native problem built from a profile and solved: the candidate regions (the modules the forward
calls, the runs of an ``nn.Sequential``'s children), the bytes held beside the activations
(parameters, buffers, inputs, the generator states each checkpoint saves, a wrapper's), the exact
search of solvers/native/, and the least whole-step budget a refusal names. Bytes throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx
import torch

import profiler
from profiler.state import cuda_devices, rng_state_bytes
from solvers import Infeasible
from solvers.native import solve_regions_exact
from solvers.regions import SAVE_POLICIES, RegionPlan, candidate_regions, plan_regions

METHOD = "regions"
# Seconds the exact search may take per solve when the caller gives no limit: past it, the plan is the
# best found (the heuristic's at worst) with its proven gap (solvers/native/method.py).
NATIVE_TIME_LIMIT = 30.0

# Bytes a distributed wrapper changes per device with the given regions checkpointed (may be
# negative): planner/native.py's ``wrapper_bytes`` bound to a model and its wrapper.
WrapperBytes = Callable[[Sequence[str]], int]


def no_wrapper(regions: Sequence[str]) -> int:
    """No distributed wrapper: it changes nothing."""
    return 0


def sequential_containers(model: torch.nn.Module) -> dict[str, int]:
    """Path -> number of children of each ``nn.Sequential`` whose children are named ``0..n-1``:
    the containers whose runs of children a native plan may checkpoint as one segment."""
    found = {}
    for path, module in model.named_modules():
        if type(module) is torch.nn.Sequential:
            names = [name for name, _ in module.named_children()]
            if names == [str(i) for i in range(len(names))] and len(names) > 2:
                found[path] = len(names)
    return found


def rng_bytes(regions, devices: list[int]) -> int:
    """torch.utils.checkpoint (``preserve_rng_state=True``) saves the CPU generator's state, and each
    CUDA device's the inputs live on, at every checkpointed call, random ops or not; and while it
    recomputes, ``fork_rng`` holds one more copy (the state to restore after the replay: 5,056 B
    measured beside a BERT layer's recomputation at the step's peak)."""
    regions = tuple(regions)
    return (len(regions) + 1) * rng_state_bytes(devices) if regions else 0


def fixed_bytes(graph: nx.DiGraph) -> int:
    """Parameters, buffers and inputs, and the caller's loss value with its backward's seed."""
    return int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))


def called_in_forward(model: torch.nn.Module, path: str) -> bool:
    """Whether the module at ``path`` is called in the forward: a ``ModuleList`` or ``ModuleDict``
    (GPT-2's ``transformer.h``) is a path prefix of the ops of its children but is never called
    itself, so wrapping its forward in a checkpoint would change nothing."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return True  # a path the trace names but the module tree does not: keep the search's view
    return not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))


def solve_native(profile: profiler.Profile, model: torch.nn.Module, budget_bytes: int,
                 time_limit: float | None = None, extra_bytes: int = 0,
                 wrapper: WrapperBytes = no_wrapper,
                 policies: Sequence[str] = tuple(SAVE_POLICIES)) -> tuple[RegionPlan, int]:
    """The regions for ``budget_bytes`` (whole step) and the bytes held besides their schedule
    (``extra_bytes``, and what a distributed ``wrapper`` changes with the regions chosen, included:
    planner/native.py's ``wrapper_bytes`` for the model and its wrapper). ``policies``:
    the save policies the search may give a region (solvers/regions/policies.py ``SAVE_POLICIES``)."""
    graph = profile.regroup("op").graph
    devices = cuda_devices([*model.parameters()])
    fixed = fixed_bytes(graph) + extra_bytes
    unwrapped = fixed
    fixed += wrapper(())
    sequentials = sequential_containers(model)
    candidates = [c for c in candidate_regions(graph) if called_in_forward(model, c)]
    activation_budget = budget_bytes - fixed
    def held_beside(regions) -> int:
        return unwrapped + wrapper(regions) + rng_bytes(regions, devices)

    for _ in range(3):  # the RNG states (and FSDP2's gathered units) depend on the regions: settle them
        if activation_budget < 0:  # below the held bytes: the refusal still names the least budget
            raise _least_below_fixed(graph, candidates, sequentials, time_limit, held_beside, policies)
        # The exact method (solvers/native), the heuristic search its start and its fallback at the time limit.
        try:
            plan = solve_regions_exact(graph, activation_budget, candidates, sequentials,
                                       time_limit=NATIVE_TIME_LIMIT if time_limit is None else time_limit,
                                       policies=policies)
        except Infeasible as error:
            raise _whole_step_least(error, graph, candidates, sequentials, time_limit, held_beside,
                                    policies) from None
        held = held_beside(plan.regions)
        if held + plan.outcome.peak_bytes <= budget_bytes:
            return plan, held
        activation_budget = budget_bytes - held
    raise Infeasible("no set of checkpointed modules fits with the generator states it saves", min_budget=None,
                     method=METHOD)


def _least_below_fixed(graph, candidates, sequentials, time_limit, held_beside, policies: Sequence[str]) -> Infeasible:
    """A budget below the parameters, buffers and inputs: the refusal still names the least budget,
    the least plan's whole step (what the search reaches when asked for no activations at all)."""
    try:
        least = plan_regions(graph, 0, candidates, sequentials, time_limit=time_limit, policies=policies)
    except Infeasible as error:
        return _whole_step_least(error, graph, candidates, sequentials, time_limit, held_beside, policies)
    return Infeasible("the parameters, buffers and inputs alone exceed the budget",
                      min_budget=held_beside(least.regions) + least.outcome.peak_bytes, method=METHOD)


def _whole_step_least(error: Infeasible, graph, candidates, sequentials, time_limit, held_beside,
                      policies: Sequence[str]) -> Infeasible:
    """``error`` (the search's least activation peak) with ``min_budget`` in whole-step bytes: the
    least plan's activations and what is held beside them (parameters, inputs, the generator state
    each of its checkpoints saves, a wrapper's buffers), so that asking for exactly that budget plans."""
    if error.min_budget is None:
        return error
    least = plan_regions(graph, error.min_budget, candidates, sequentials, time_limit=time_limit, policies=policies)
    return Infeasible(str(error), min_budget=held_beside(least.regions) + least.outcome.peak_bytes,
                      method=error.method or METHOD)
