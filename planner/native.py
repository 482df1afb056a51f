"""Native plans: which modules ``torch.utils.checkpoint`` wraps, chosen against the budget.

The default plan (``planner.plan(..., executor="native")``). The profiler's trace of the step is
regrouped to single ops; solvers/regions.py predicts the peak and time of checkpointing any set of
the model's submodules (and runs of an ``nn.Sequential``'s children) the way non-reentrant
``torch.utils.checkpoint`` does, and searches the set with the least recomputation that fits. The
plan is then **measured once** on the example inputs (runtime/native.py applied, one training step
under the allocator's events, removed again): a measured peak over the budget tightens the budget by
the excess and the search runs again (at most :data:`REPAIRS` times), so a plan this returns fits on
the example inputs by measurement, not only by prediction. Both figures are in the plan.

Why measure: the trace's backward reads what autograd saves, but not always in eager's exact form
(a dropout traced as ``rand < p`` and a multiply holds a float mask where eager holds a bool one), so
the prediction is an estimate of eager checkpointing, usually a little above it.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import networkx as nx
import torch

import profiler
from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.inputs import normalise_inputs
from profiler.oom import reported_out_of_memory
from profiler.state import cuda_devices, rng_state_bytes
from runtime.chain import module_fingerprint
from runtime.native import apply_native, input_shapes, remove_native
from runtime.hf_cache import cache_off_while_planning
from runtime.rnn import staged_for_trace
from solvers import Infeasible, simulate
from solvers.native import solve_regions_exact
from solvers.regions import SAVE_POLICIES, RegionPlan, candidate_regions, plan_regions, region_costs, twin
from solvers.schedule import SolverInfo

from . import checkpoint_clock
from .bounded import check_within_device, predicted_step_fits, profiling_bound
from .autocast import describe as describe_autocast
from .budget import Budget, format_bytes
from .optimizer import NO_OPTIMIZER, IterationMemory, held_at_the_end, iteration_memory, step_over_budget
from .paired_timing import SLOW_FAST, disagreement, time_paired
from .planfile import FORMAT as PLAN_FORMAT
from .planchecks import MODELLED_REGIONS, native_figures_problem, overlapping_regions
from .planfile import Plan, PlanFileError, PlanWarning, _list, _text, _whole, profile_fields
from .sharding import DISTRIBUTED, FSDP2, describe_distributed, fsdp2_bytes, refuse_wrapped, wrapper_bytes
from .sharding import distributed_problem  # noqa: F401  (planner/api.py imports it from here)

NATIVE_FORMAT = "plan-checkpoints/native/1"
METHOD = "regions"
REPAIRS = 3  # re-solves after a measured peak over the budget
# Seconds the exact search may take per solve when the caller gives no limit: past it, the plan is the
# best found (the heuristic's at worst) with its proven gap (solvers/native/method.py).
NATIVE_TIME_LIMIT = 30.0


@dataclass
class NativePlan(Plan):
    """A plan the native executor runs: ``regions`` checkpointed with torch.utils.checkpoint.

    ``graph`` and ``schedule`` are solvers/regions.py's model of that execution (the op-level graph
    with a twin node per recomputed op); ``predicted_*`` come from it. ``measured_peak_bytes`` and
    ``measured_seconds`` are one training step on the example inputs (None for a plan not measured).
    """

    regions: tuple[str, ...] = ()
    input_shapes: dict = field(default_factory=dict)  # input (pytree key) -> planned shape
    measured_peak_bytes: int | None = None
    measured_seconds: float | None = None
    distributed: str | None = None  # the wrapper counted (describe_distributed), None for none
    wrapper_bytes: int = 0  # what it changes per device against the unwrapped step (may be negative)
    optimizer: str | None = None  # the optimizer counted (planner/optimizer.py), None: the step alone
    optimizer_state_bytes: int = 0  # its state, held through forward and backward
    optimizer_step_peak_bytes: int = 0  # the most live while its step() runs (whole iteration)
    # The un-checkpointed step was not run (its predicted peak is above the device: planner/bounded.py),
    # so a "N%" budget is of its predicted peak, not of a measured one.
    unplanned_peak_predicted: bool = False

    @property
    def executor(self) -> str:
        return "native"

    def recomputed(self) -> dict[str, int]:
        """Op -> 1 for each op a checkpoint recomputes: the region graph holds a recomputation as a twin
        node of its own (solvers/regions.py, ``twin``), computed once, so the schedule's counts show none."""
        prefix = twin("")
        return {str(node)[len(prefix):]: 1 for node in self.graph.nodes if str(node).startswith(prefix)}

    def summary(self) -> str:
        saving = 1 - self.predicted_peak_bytes / self.unplanned_peak_bytes if self.unplanned_peak_bytes else 0.0
        shown = ", ".join(self.regions[:8]) + (f" and {len(self.regions) - 8} more" if len(self.regions) > 8 else "")
        of_predicted = (" of the predicted un-checkpointed peak: that step exceeds the device and was not run"
                        if self.unplanned_peak_predicted else "")
        lines = [
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            "Executor:          native (torch.utils.checkpoint on the model's own modules)",
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}{of_predicted}) for the whole "
            f"{'iteration' if self.optimizer else 'step'}; parameters, buffers, inputs and saved RNG states "
            f"{'and the optimizer state ' if self.optimizer else ''}take {format_bytes(self.fixed_bytes)}",
            f"Predicted peak:    {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)} ({saving:.1%} less)",
        ]
        if self.optimizer:
            lines.append(f"Optimizer:         {self.optimizer}: state {format_bytes(self.optimizer_state_bytes)} held "
                         f"all iteration, its step peaks at {format_bytes(self.optimizer_step_peak_bytes)}; budget, "
                         "peaks and a \"N%\" budget's base are of the iteration (zero_grad, forward, backward, step)")
        if self.distributed:
            sign = "+" if self.wrapper_bytes >= 0 else "-"
            lines.append(f"Distributed:       {self.distributed}: {sign}{format_bytes(abs(self.wrapper_bytes))} per device "
                         "against the unwrapped step, in the budget, the prediction and the measured peak")
        if self.measured_peak_bytes is not None:
            lines.append(f"Measured peak:     {format_bytes(self.measured_peak_bytes)} (one step on the example inputs)")
        lines.append(f"Autocast:          {describe_autocast(self.autocast)}")
        lines += [
            f"Predicted time:    {self.predicted_seconds * 1000:.1f} ms of compute per step, "
            f"{self.predicted_overhead:+.1%} over no checkpointing",
            f"Solver:            {self.method} ({_status_words(self.schedule.info)}) in {self.schedule.info.solve_seconds:.2f} s"
            + (f"; {self.schedule.info.message}" if self.schedule.info.message else ""),
            f"Checkpointed:      {shown or 'nothing (the step fits without checkpointing)'}",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = super().to_dict()
        data["format"] = NATIVE_FORMAT
        data["regions"] = list(self.regions)
        data["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        data["measured_peak_bytes"] = self.measured_peak_bytes
        data["measured_seconds"] = self.measured_seconds
        data["distributed"] = self.distributed
        data["wrapper_bytes"] = self.wrapper_bytes
        data["optimizer"] = self.optimizer
        data["optimizer_state_bytes"] = self.optimizer_state_bytes
        data["optimizer_step_peak_bytes"] = self.optimizer_step_peak_bytes
        data["unplanned_peak_predicted"] = self.unplanned_peak_predicted
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan", check_figures: bool = True) -> NativePlan:
        """The native plan ``data`` holds, checked as :meth:`Plan.from_dict` checks a plan, with its
        regions (none overlapping, each matching its graph's recomputations) and (``check_figures``;
        planner/compiled.py's are measured on the compiled step) its figures against its region
        schedule and its measurements (planner/planchecks.py). Raises :class:`PlanFileError`."""
        try:
            regions = tuple(_text(r) for r in _list(data["regions"]))
            shapes = data.get("input_shapes", {})
            if not isinstance(shapes, dict):
                raise TypeError(f"input_shapes is {type(shapes).__name__}, not an object")
            shapes = {_text(k): tuple(_whole(x) for x in _list(v)) for k, v in shapes.items()}
            measured = data.get("measured_peak_bytes")
            measured = None if measured is None else _whole(measured)
            seconds = data.get("measured_seconds")
            if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
                raise TypeError(f"measured_seconds is {type(seconds).__name__}, not a number")
            distributed = data.get("distributed")  # absent from plans made before it was recorded
            distributed = None if distributed is None else _text(distributed)
            wrapper = data.get("wrapper_bytes", 0)
            if isinstance(wrapper, bool) or not isinstance(wrapper, int):
                raise TypeError(f"wrapper_bytes is {type(wrapper).__name__}, not a whole number")
            optimizer = data.get("optimizer")  # absent from plans made before it was recorded
            optimizer = None if optimizer is None else _text(optimizer)
            state = _whole(data.get("optimizer_state_bytes", 0), "optimizer_state_bytes")
            stepping = _whole(data.get("optimizer_step_peak_bytes", 0), "optimizer_step_peak_bytes")
            predicted_only = data.get("unplanned_peak_predicted", False)  # absent from plans made before
            if not isinstance(predicted_only, bool):
                raise TypeError(f"unplanned_peak_predicted is {type(predicted_only).__name__}, not true or false")
        except (KeyError, TypeError, ValueError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {type(error).__name__}: {error}") from None
        plain = Plan.from_dict({**data, "format": PLAN_FORMAT}, source, check_figures=False)
        fields_ = {name: getattr(plain, name) for name in Plan.__dataclass_fields__}
        plan = cls(**fields_, regions=regions, input_shapes=shapes, measured_peak_bytes=measured,
                   measured_seconds=None if seconds is None else float(seconds), distributed=distributed,
                   wrapper_bytes=wrapper, optimizer=optimizer, optimizer_state_bytes=state,
                   optimizer_step_peak_bytes=stepping, unplanned_peak_predicted=predicted_only)
        problem = native_figures_problem(plan, simulate(plan.graph, plan.schedule)) if check_figures \
            else overlapping_regions(regions)
        if problem:
            raise PlanFileError(f"{source}: {problem} (the file was edited; plan again)")
        return plan


def _status_words(info: SolverInfo) -> str:
    """The search's status as the summary says it: optimal over the native plans, or the proven gap."""
    if info.status == "optimal":
        return "optimal: no set of regions and save policies is predicted faster within the budget"
    if info.gap is not None:
        return f"{info.status}, within {info.gap:.1%} of the fastest native plan (time limit)"
    return info.status


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


def _rng_bytes(regions, devices: list[int]) -> int:
    """torch.utils.checkpoint (``preserve_rng_state=True``) saves the CPU generator's state, and each
    CUDA device's the inputs live on, at every checkpointed call, random ops or not; and while it
    recomputes, ``fork_rng`` holds one more copy (the state to restore after the replay: 5,056 B
    measured beside a BERT layer's recomputation at the step's peak)."""
    regions = tuple(regions)
    return (len(regions) + 1) * rng_state_bytes(devices) if regions else 0


def _fixed_bytes(graph: nx.DiGraph) -> int:
    """Parameters, buffers and inputs, and the caller's loss value with its backward's seed."""
    return int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))


def _called(model: torch.nn.Module, path: str) -> bool:
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
                 distributed=None, policies: Sequence[str] = tuple(SAVE_POLICIES)) -> tuple[RegionPlan, int]:
    """The regions for ``budget_bytes`` (whole step) and the bytes held besides their schedule
    (``extra_bytes``, and ``distributed``'s wrapper's for the regions chosen, included). ``policies``:
    the save policies the search may give a region (solvers/regions.py ``SAVE_POLICIES``)."""
    graph = profile.regroup("op").graph
    devices = cuda_devices([*model.parameters()])
    fixed = _fixed_bytes(graph) + extra_bytes
    unwrapped = fixed
    fixed += wrapper_bytes(model, distributed)
    sequentials = sequential_containers(model)
    candidates = [c for c in candidate_regions(graph) if _called(model, c)]
    activation_budget = budget_bytes - fixed
    def held_beside(regions) -> int:
        return unwrapped + wrapper_bytes(model, distributed, regions) + _rng_bytes(regions, devices)

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


def measure_native(model: torch.nn.Module, regions, example_inputs, loss_fn, repeats: int = 1,
                   warm_up: bool = True):
    """One training step of ``model`` with ``regions`` checkpointed, measured, then undone. The
    parameters' ``.grad`` are left as they were: a planning step's gradients would otherwise be
    added to the user's first real step's (RNG and buffers are restored by measure_step).
    ``warm_up=False``: no warm-up step before the measured one on CPU (the model ran in this process
    already: planner/measured.py)."""
    from .measured import measure_planned_step  # measure_step, the parameters' .grad restored

    try:
        apply_native(model, regions)
        with reported_out_of_memory("measuring the planned step" if regions else "measuring the un-checkpointed step"):
            return measure_planned_step(model, example_inputs, loss_fn, repeats, warm_up=warm_up)
    finally:
        remove_native(model)


def native_profile(model: torch.nn.Module, example_inputs, loss_fn=None, granularity="op",
                   memory_bound: int | None = None) -> profiler.Profile:
    """The profile a native plan is made on: the step as eager autograd runs it (the cross-entropy
    backward unfused: two logits-sized ops), a stacked RNN's layers as modules the search can
    checkpoint (runtime/rnn.py), a Hugging Face decoder's cache off as the planned model trains
    (runtime/hf_cache.py). ``memory_bound``: bytes profiling may hold (planner/bounded.py)."""
    with staged_for_trace(model), cache_off_while_planning(model):
        return profiler.profile(model, example_inputs, loss_fn=loss_fn, granularity=granularity, fuse_loss=False,
                                memory_bound=memory_bound)


def plan_native(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None,
                time_limit: float | None = None, granularity="module",
                profile: profiler.Profile | None = None, measure: bool = True,
                distributed: str | None = None, policies: Sequence[str] = tuple(SAVE_POLICIES),
                optimizer=None, device_memory: int | None = None, clock: bool = True) -> NativePlan:
    """A :class:`NativePlan` for ``budget``: see the module docstring. Raises :class:`Infeasible`
    (``min_budget`` in whole-step bytes) when no set of regions fits.

    ``device_memory`` (bytes; planner/bounded.py): profiling holds at most the lower of it and a
    byte budget, the un-checkpointed step is run (for a ``"N%"`` budget) only when its predicted peak
    fits it, else N% is of the predicted peak; a budget above it is refused
    (:class:`planner.bounded.DeviceMemoryError`).

    ``distributed`` (``"ddp"``, ``"fsdp2"`` or an :class:`FSDP2`) counts what the wrapper changes on
    each device (:func:`wrapper_bytes`) in the predicted and in the measured peak (the measurement
    runs unwrapped, in this process, and adds those bytes), and in the base of a ``"N%"`` budget.
    ``policies`` restricts the save policies the search may use (benchmarks/policies.py compares).
    ``optimizer`` (an instance or a name, planner/optimizer.py): every figure is of the training
    iteration, its state held through forward and backward and its step after them.
    ``clock``: price what torch.utils.checkpoint itself costs per region and per op under a policy,
    measured on the model's device (planner/checkpoint_clock.py; fitted to one of the model's own
    regions when ``measure``); False prices the recomputed ops alone (benchmarks/clock.py compares)."""
    refuse_wrapped(model)
    check_within_device(budget, budget.bytes, device_memory)
    bound = profiling_bound(budget, device_memory)
    remove_native(model)  # re-planning a model planned before: trace its own forward
    # Profiling runs every op of the step: the measurements after it need no warm-up step (on CPU).
    warm = profile is None
    if profile is None:
        # Single ops, the grouping the region search reads (``granularity`` groups the traced executor's).
        profile = native_profile(model, example_inputs, loss_fn, granularity="op", memory_bound=bound)
    request = _understood(model, example_inputs, loss_fn, budget, profile, time_limit, measure, distributed,
                          policies, optimizer, device_memory, clock, warm)
    resolved = _resolved_budget(request, bound)
    solved, held, measured, solving = _search_measure_repair(request, resolved)
    plan = _built_plan(request, resolved, solved, held, measured, solving)
    _warn_if_above_bound(profile, bound, device_memory)  # of a plan made: a refusal says what it needs itself
    # The pairing runs the un-checkpointed step: only where it fits the device.
    if measure and predicted_step_fits(resolved.unplanned_peak, device_memory):
        _check_times(plan, model, example_inputs, loss_fn)
    plan.input_shapes = input_shapes(*normalise_inputs(example_inputs))
    return plan


@dataclass(frozen=True)
class _NativeRequest:
    """One :func:`plan_native` call understood once: the model, its profile priced by the clock, the
    un-checkpointed step's evaluation and the bytes held beside any plan's activations."""

    model: torch.nn.Module
    example_inputs: object
    loss_fn: object
    budget: Budget
    profile: profiler.Profile
    op_graph: nx.DiGraph
    time_limit: float | None
    measure: bool
    distributed: object
    policies: Sequence[str]
    device_memory: int | None
    warm: bool  # profiled in this process just now: the measurements need no warm-up step (on CPU)
    iteration: IterationMemory
    unplanned: RegionPlan  # the un-checkpointed step, evaluated
    extra_bytes: int  # the wrapper's bytes (no regions) and the optimizer's state
    fixed_bytes: int  # parameters, buffers, inputs, plus ``extra_bytes``


@dataclass(frozen=True)
class _ResolvedBudget:
    """The budget in bytes, and the un-checkpointed step it was resolved against (bytes)."""

    budget_bytes: int
    unplanned_peak: int
    eager: object  # the eager step measured (its peak with the wrapper and the iteration), or None
    predicted_only: bool  # "N%" taken of the predicted un-checkpointed peak (it does not fit the device)


def _understood(model, example_inputs, loss_fn, budget: Budget, profile: profiler.Profile, time_limit, measure: bool,
                distributed, policies: Sequence[str], optimizer, device_memory: int | None, clock: bool,
                warm: bool) -> _NativeRequest:
    """The request with the profile's op graph priced (or not) by the checkpoint clock, and the bytes
    held besides the activations: the wrapper's and the optimizer's state (planner/optimizer.py)."""
    from solvers.regions import evaluate

    extra = wrapper_bytes(model, distributed)
    op_graph = profile.regroup("op").graph
    if not clock:
        op_graph.graph.pop(checkpoint_clock.KEY, None)
    else:
        checkpoint_clock.price(op_graph, model, example_inputs, policies, fit=measure)
    fixed = _fixed_bytes(op_graph) + extra
    unplanned = evaluate(op_graph, ())
    # The optimizer's state is held like the parameters; its step's peak bounds every plan's from below.
    iteration = iteration_memory(optimizer, model, profile, fixed + held_at_the_end(unplanned.graph, unplanned.schedule))
    return _NativeRequest(model, example_inputs, loss_fn, budget, profile, op_graph, time_limit, measure, distributed,
                          policies, device_memory, warm, iteration, unplanned,
                          extra_bytes=extra + iteration.state_bytes, fixed_bytes=fixed + iteration.state_bytes)


def _resolved_budget(request: _NativeRequest, bound: int | None) -> _ResolvedBudget:
    """The budget in bytes: ``"N%"`` of the eager step's measured peak where it is measured, else of
    the predicted one; refused when below the optimizer's step or above the device."""
    budget, iteration = request.budget, request.iteration
    unplanned_peak = iteration.peak(request.fixed_bytes + request.unplanned.outcome.peak_bytes)
    eager = None
    predicted_only = budget.percent is not None and not predicted_step_fits(unplanned_peak, bound)
    if request.measure and budget.percent is not None and not predicted_only:
        # "N%" is of the eager step's measured peak (docs/native.md, "Which step '100%' is").
        # Its peak alone (its time is not used: the plan's own step is timed) where profiling warmed up.
        eager = measure_native(request.model, (), request.example_inputs, request.loss_fn,
                               repeats=0 if request.warm else 1, warm_up=not request.warm)
        eager = replace(eager, peak_bytes=iteration.peak(eager.peak_bytes + request.extra_bytes))
        unplanned_peak = eager.peak_bytes
    budget_bytes = budget.resolve(unplanned_peak)
    if step_over_budget(iteration, str(budget), budget_bytes):
        raise Infeasible(step_over_budget(iteration, str(budget), budget_bytes), min_budget=iteration.step_peak_bytes,
                         method=METHOD)
    check_within_device(budget, budget_bytes, request.device_memory)
    return _ResolvedBudget(budget_bytes, unplanned_peak, eager, predicted_only)


def _measured_regions(request: _NativeRequest, regions):
    """The step with ``regions`` checkpointed, measured, its peak with the wrapper and the iteration."""
    measured = measure_native(request.model, regions, request.example_inputs, request.loss_fn,
                              warm_up=not request.warm)
    return replace(measured, peak_bytes=request.iteration.peak(
        measured.peak_bytes + wrapper_bytes(request.model, request.distributed, regions)
        + request.iteration.state_bytes))


def _search_measure_repair(request: _NativeRequest, resolved: _ResolvedBudget):
    """``(solved, held, measured, solving seconds)``: the search's plan for the budget, measured, and
    searched again for less by what the measurement missed (at most :data:`REPAIRS` times)."""
    from solvers.regions import evaluate

    budget_bytes, eager = resolved.budget_bytes, resolved.eager
    # The un-checkpointed step measured within the budget needs nothing, whatever the prediction says
    # (a few bytes above the measurement on a tiny model made "100%" infeasible).
    if eager is not None and eager.peak_bytes <= budget_bytes:
        if eager.runs == 0:  # the plan is the eager step: time it
            eager = replace(measure_native(request.model, (), request.example_inputs, request.loss_fn, warm_up=False),
                            peak_bytes=eager.peak_bytes)
        return evaluate(request.op_graph, ()), request.fixed_bytes, eager, 0.0
    target = budget_bytes
    measured = None
    solving = 0.0  # seconds in the search, the measurements apart
    for _ in range(REPAIRS + 1):
        try:
            search_started = time.perf_counter()
            solved, held = solve_native(request.profile, request.model, target, request.time_limit,
                                        extra_bytes=request.iteration.state_bytes, distributed=request.distributed,
                                        policies=request.policies)
            solving += time.perf_counter() - search_started
        except Infeasible as error:
            return (*_least_or_refusal(request, error, budget_bytes, eager, measured, target), solving)
        if not request.measure:
            return solved, held, None, solving
        measured = _measured_regions(request, solved.regions)
        if measured.peak_bytes <= budget_bytes:
            return solved, held, measured, solving
        target -= measured.peak_bytes - budget_bytes  # the prediction missed by this much: ask for less
    raise Infeasible(_measured_over(request.budget, budget_bytes, measured.peak_bytes, target),
                     min_budget=measured.peak_bytes, method=METHOD)


def _least_or_refusal(request: _NativeRequest, error: Infeasible, budget_bytes: int, eager, measured, target: int):
    """``(solved, held, measured)`` where the search found nothing for ``target``: the least plan when
    it measures within the budget, else the eager step when it does; otherwise the refusal, naming
    the least budget in whole-step bytes."""
    from solvers.regions import evaluate

    model, iteration = request.model, request.iteration
    minimum = error.min_budget  # whole-step bytes (solve_native)
    minimum = None if minimum is None else iteration.peak(minimum)
    # Measured only where the least plan's predicted peak is within the device too.
    near_miss = request.measure and (request.device_memory is None or (minimum or 0) <= request.device_memory)
    least = _least_if_it_measures_within(request.profile, model, request.example_inputs, request.loss_fn,
                                         request.distributed, request.policies, budget_bytes, minimum, near_miss,
                                         request.time_limit, warm_up=not request.warm, iteration=iteration)
    if least is not None:
        return least
    if request.measure and measured is None:
        # The least plan can be predicted above the eager step as it measures (a stacked LSTM
        # without inter-layer dropout: least 5,851,200 B, eager 5,785,664 B): the eager step
        # is a plan too, and the least budget is never above it.
        eager = _eager_timed(model, request.example_inputs, request.loss_fn, request.extra_bytes, eager,
                             warm_up=not request.warm)
        if eager.peak_bytes <= budget_bytes:
            return evaluate(request.op_graph, ()), request.fixed_bytes, eager
        minimum = eager.peak_bytes if minimum is None else min(minimum, eager.peak_bytes)
    if measured is not None:  # a repair asked for less than the budget: the least is not the user's
        raise Infeasible(_measured_over(request.budget, budget_bytes, measured.peak_bytes, target),
                         min_budget=measured.peak_bytes, method=METHOD) from None
    raise Infeasible(
        f"budget {request.budget} ({format_bytes(budget_bytes)}) is below the least that checkpointing the model's "
        f"modules reaches" + (f": {format_bytes(minimum)} ({minimum} bytes; parameters, buffers and inputs take "
                              f"{format_bytes(request.fixed_bytes)} of it)" if minimum else "")
        + _cache_hint(model, request.profile), min_budget=minimum, method=METHOD) from None


def _built_plan(request: _NativeRequest, resolved: _ResolvedBudget, solved: RegionPlan, held: int, measured,
                solving: float) -> NativePlan:
    """The :class:`NativePlan` for the solved regions, with the wrapper's and the iteration's figures."""
    model, distributed, iteration = request.model, request.distributed, request.iteration
    plan = _native_plan(model, request.profile, solved, held, request.budget, resolved.budget_bytes,
                        resolved.unplanned_peak, request.unplanned.outcome.compute_cost, measured, solving)
    plan.distributed = describe_distributed(model, distributed)
    plan.wrapper_bytes = wrapper_bytes(model, distributed, solved.regions)
    plan.predicted_peak_bytes = iteration.peak(plan.predicted_peak_bytes)
    plan.optimizer = iteration.optimizer or None
    plan.optimizer_state_bytes, plan.optimizer_step_peak_bytes = iteration.state_bytes, iteration.step_peak_bytes
    plan.unplanned_peak_predicted = resolved.predicted_only
    return plan


def _warn_if_above_bound(profile: profiler.Profile, bound: int | None, device_memory: int | None) -> None:
    """Say so when the bounded profile held more than its bound: what one op needs at once (its
    inputs, outputs and scratch, with the parameters and inputs) is above it, and above the device
    when that is the bound."""
    held = profile.times.held_peak_bytes if profile.times is not None else 0
    if bound is None or held <= bound:
        return
    where = "the device's memory" if device_memory is not None and bound == device_memory else "the budget"
    warnings.warn(f"profiling held {format_bytes(held)}, above {where} ({format_bytes(bound)}): one op of the step, "
                  "with the parameters and inputs, needs that much at once; the plan's step needs it too",
                  PlanWarning, stacklevel=3)


def _eager_timed(model, example_inputs, loss_fn, extra: int, eager, warm_up: bool):
    """The un-checkpointed step measured and timed (``eager`` again when it was timed already), its
    peak with the wrapper's ``extra`` bytes."""
    if eager is not None and eager.runs > 0:
        return eager
    timed = measure_native(model, (), example_inputs, loss_fn, warm_up=warm_up)
    return replace(timed, peak_bytes=timed.peak_bytes + extra)


def _measured_over(budget: Budget, budget_bytes: int, measured_bytes: int, target: int) -> str:
    return (f"budget {budget} ({format_bytes(budget_bytes)}): the native plans predicted within it measured over it "
            f"(the last {format_bytes(measured_bytes)}; asking the search for as little as {format_bytes(target)} did "
            "not bring the measurement under the budget: the prediction misses on this model); try a larger budget "
            "or executor='traced'")


def _cache_hint(model: torch.nn.Module, profile: profiler.Profile) -> str:
    """Why a Hugging Face decoder with its cache on cannot go lower, and what to do. Only when the
    traced step returns a cache: encoders' configs say use_cache=True too (BERT's), and return none."""
    config = getattr(model, "config", None)
    if not getattr(config, "use_cache", False) or not _returns_a_cache(profile.joint.output_spec):
        return ""
    return ("; the model's config has use_cache=True: its attention blocks return their key/value cache as model "
            "outputs, which no checkpoint can free; set model.config.use_cache = False for training (as "
            "gradient_checkpointing_enable() does) and plan again")


def _returns_a_cache(spec) -> bool:
    """Whether a model output's pytree spec holds a key/value cache (a ``...Cache`` object, or a
    ``past_key_values`` / ``cache`` field of a Hugging Face ModelOutput)."""
    if spec.type is not None and spec.type.__name__.endswith("Cache"):
        return True
    keys = spec.context if isinstance(spec.context, (list, tuple)) else ()
    if any(key in ("past_key_values", "cache") for key in keys if isinstance(key, str)):
        return True
    return any(_returns_a_cache(child) for child in spec.children())


NEAR_MISS = 0.02  # a least predicted peak this close above the budget is measured before refusing


def _least_if_it_measures_within(profile, model, example_inputs, loss_fn, distributed, policies, budget_bytes: int,
                                 minimum: int | None, measure: bool, time_limit, warm_up: bool = True,
                                 iteration: IterationMemory = NO_OPTIMIZER):
    """The least-peak plan, when its predicted peak is within :data:`NEAR_MISS` above the budget and
    its measured peak is within it: the prediction is an estimate of eager checkpointing (it
    over-predicts by up to a few tenths of a percent: docs/native.md), the measurement decides.
    When the least plan under ``policies`` measures over, the least plan without save policies is
    measured too: a policy holds what it saves, and where the prediction ties the two the plain
    regions can hold less (the benchmark U-Net at its per-block baseline's 117,385,672 B: its last
    decoder block under ``@matmuls`` measured 118,389,832 B, plain 117,385,672 B, both predicted
    118,445,048 B)."""
    if not measure or minimum is None or minimum > budget_bytes * (1 + NEAR_MISS):
        return None
    for allowed in dict.fromkeys((tuple(policies), ())):
        try:
            solved, held = solve_native(profile, model, minimum, time_limit, extra_bytes=iteration.state_bytes,
                                        distributed=distributed, policies=allowed)
        except Infeasible:
            continue
        measured = measure_native(model, solved.regions, example_inputs, loss_fn, warm_up=warm_up)
        measured = replace(measured, peak_bytes=iteration.peak(
            measured.peak_bytes + wrapper_bytes(model, distributed, solved.regions) + iteration.state_bytes))
        if measured.peak_bytes <= budget_bytes:
            return solved, held, measured
    return None


def _check_times(plan: NativePlan, model, example_inputs, loss_fn) -> None:
    """Warn (:class:`PlanWarning`) when the plan's step, timed beside the un-checkpointed one, is
    slower or faster against it than predicted by more than :data:`SLOW_FAST`, on a pairing that
    can be trusted (planner/paired_timing.py). The pairing (three more steps) is timed only when the
    plan's one measured step is that far from its predicted time: comparing those two alone cried
    wolf whenever the machine's load changed between profiling and measuring."""
    if not plan.regions or plan.measured_seconds is None or plan.predicted_seconds <= 0:
        return
    if abs(plan.measured_seconds / plan.predicted_seconds - 1) <= SLOW_FAST:
        return

    def step(regions):
        return lambda: measure_native(model, regions, example_inputs, loss_fn, warm_up=False).seconds

    message = disagreement(time_paired(step(()), step(plan.regions)), plan.predicted_seconds,
                           plan.unplanned_seconds)
    if message is not None:
        warnings.warn(message, PlanWarning, stacklevel=5)  # the caller of planner.plan


def _native_plan(model, profile, solved: RegionPlan, held: int, budget: Budget, budget_bytes: int,
                 unplanned_peak: int, unplanned_seconds: float, measured, seconds: float) -> NativePlan:
    graph = solved.graph.copy()
    graph.graph["fingerprint"] = graph_fingerprint(graph)
    graph.graph[MODELLED_REGIONS] = json.dumps(list(solved.regions))  # what load checks the plan's regions against
    recomputed = sum(len(region_costs(profile.regroup("op").graph, r).recomputed) for r in solved.regions)
    found = solved.schedule.info  # the search's status (optimal, or feasible with its gap) and how it got there
    info = SolverInfo(
        method=METHOD, status=found.status, gap=found.gap, solve_seconds=seconds, budget_bytes=budget_bytes - held,
        predicted_peak_bytes=solved.outcome.peak_bytes, compute_cost=solved.outcome.compute_cost,
        message=((f"checkpoint {len(solved.regions)} module(s) with torch.utils.checkpoint, recomputing "
                  f"{recomputed} op(s)") if solved.regions else "nothing to checkpoint: the step fits as it is")
        + (f"; {found.message}" if found.message else ""),
    )
    return NativePlan(
        schedule=solved.schedule.with_info(**info.__dict__),
        graph=graph,
        budget_bytes=budget_bytes,
        budget_text=str(budget),
        fixed_bytes=held,
        predicted_peak_bytes=held + solved.outcome.peak_bytes,
        unplanned_peak_bytes=unplanned_peak,
        predicted_seconds=solved.outcome.compute_cost,
        unplanned_seconds=unplanned_seconds,
        fingerprint=module_fingerprint(model, solved.regions),
        granularity="op",
        **profile_fields(profile, model),
        regions=tuple(solved.regions),
        measured_peak_bytes=None if measured is None else int(measured.peak_bytes),
        measured_seconds=None if measured is None else float(measured.seconds),
    )


__all__ = ["DISTRIBUTED", "FSDP2", "NATIVE_FORMAT", "NativePlan", "fsdp2_bytes", "measure_native", "plan_native", "sequential_containers", "solve_native"]
