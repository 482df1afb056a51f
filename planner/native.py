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

import time
import warnings
from dataclasses import dataclass, field, replace

import networkx as nx
import torch

import profiler
from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.inputs import normalise_inputs
from profiler.state import cuda_devices, rng_state_bytes
from runtime.chain import module_fingerprint
from runtime.native import apply_native, input_shapes, remove_native
from solvers import Infeasible
from solvers.regions import RegionPlan, candidate_regions, plan_regions, region_costs
from solvers.schedule import SolverInfo

from .budget import Budget, format_bytes
from .planfile import FORMAT as PLAN_FORMAT
from .planfile import Plan, PlanFileError, PlanWarning, _list, _text, _whole, profile_fields

NATIVE_FORMAT = "plan-checkpoints/native/1"
METHOD = "regions"
REPAIRS = 3  # re-solves after a measured peak over the budget


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

    @property
    def executor(self) -> str:
        return "native"

    def summary(self) -> str:
        saving = 1 - self.predicted_peak_bytes / self.unplanned_peak_bytes if self.unplanned_peak_bytes else 0.0
        shown = ", ".join(self.regions[:8]) + (f" and {len(self.regions) - 8} more" if len(self.regions) > 8 else "")
        lines = [
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            "Executor:          native (torch.utils.checkpoint on the model's own modules)",
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}) for the whole step; "
            f"parameters, buffers, inputs and saved RNG states take {format_bytes(self.fixed_bytes)}",
            f"Predicted peak:    {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)} ({saving:.1%} less)",
        ]
        if self.measured_peak_bytes is not None:
            lines.append(f"Measured peak:     {format_bytes(self.measured_peak_bytes)} (one step on the example inputs)")
        lines += [
            f"Predicted time:    {self.predicted_seconds * 1000:.1f} ms of compute per step, "
            f"{self.predicted_overhead:+.1%} over no checkpointing",
            f"Solver:            {self.method} ({self.status}) in {self.schedule.info.solve_seconds:.2f} s",
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
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> NativePlan:
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
        except (KeyError, TypeError, ValueError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {type(error).__name__}: {error}") from None
        plain = Plan.from_dict({**data, "format": PLAN_FORMAT}, source)
        fields_ = {name: getattr(plain, name) for name in Plan.__dataclass_fields__}
        return cls(**fields_, regions=regions, input_shapes=shapes, measured_peak_bytes=measured,
                   measured_seconds=None if seconds is None else float(seconds))


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
    CUDA device's the inputs live on, at every checkpointed call, random ops or not."""
    return len(tuple(regions)) * rng_state_bytes(devices)


def _fixed_bytes(graph: nx.DiGraph) -> int:
    """Parameters, buffers and inputs, and the caller's loss value with its backward's seed."""
    return int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))


DISTRIBUTED = ("ddp",)


def wrapper_bytes(model: torch.nn.Module, distributed: str | None) -> int:
    """Bytes a distributed wrapper holds on each device besides the step the profile traced.

    ``"ddp"``: DistributedDataParallel's gradient buckets, allocated when it wraps the model and
    held for good: one copy of the trainable parameters' gradients (its default,
    ``gradient_as_bucket_view=False``; with views the buckets are the gradients and this counts
    them twice, an over-estimate). None: nothing."""
    if distributed is None:
        return 0
    if distributed not in DISTRIBUTED:
        raise ValueError(f"distributed={distributed!r} is not accounted for; accepted: None, "
                         + ", ".join(repr(d) for d in DISTRIBUTED)
                         + " (FSDP2: plan one rank's step unsharded; see docs/runtime.md)")
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def solve_native(profile: profiler.Profile, model: torch.nn.Module, budget_bytes: int,
                 time_limit: float | None = None, extra_bytes: int = 0) -> tuple[RegionPlan, int]:
    """The regions for ``budget_bytes`` (whole step) and the bytes held besides their schedule
    (``extra_bytes``, a wrapper's, included)."""
    graph = profile.regroup("op").graph
    devices = cuda_devices([*model.parameters()])
    fixed = _fixed_bytes(graph) + extra_bytes
    sequentials = sequential_containers(model)
    candidates = candidate_regions(graph)
    activation_budget = budget_bytes - fixed
    for _ in range(3):  # the RNG states depend on how many regions: settle them
        if activation_budget < 0:
            raise Infeasible("the parameters, buffers and inputs alone exceed the budget", min_budget=None,
                             method=METHOD)
        plan = plan_regions(graph, activation_budget, candidates, sequentials, time_limit=time_limit)
        held = fixed + _rng_bytes(plan.regions, devices)
        if held + plan.outcome.peak_bytes <= budget_bytes:
            return plan, held
        activation_budget = budget_bytes - held
    raise Infeasible("no set of checkpointed modules fits with the generator states it saves", min_budget=None,
                     method=METHOD)


def measure_native(model: torch.nn.Module, regions, example_inputs, loss_fn, repeats: int = 1):
    """One training step of ``model`` with ``regions`` checkpointed, measured, then undone. The
    parameters' ``.grad`` are left as they were: a planning step's gradients would otherwise be
    added to the user's first real step's (RNG and buffers are restored by measure_step)."""
    from .fallback import measure_planned_step  # measure_step, the parameters' .grad restored

    try:
        apply_native(model, regions)
        return measure_planned_step(model, example_inputs, loss_fn, repeats)
    finally:
        remove_native(model)


def plan_native(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None,
                time_limit: float | None = None, granularity="module",
                profile: profiler.Profile | None = None, measure: bool = True,
                distributed: str | None = None) -> NativePlan:
    """A :class:`NativePlan` for ``budget``: see the module docstring. Raises :class:`Infeasible`
    (``min_budget`` in whole-step bytes) when no set of regions fits.

    ``distributed`` (``"ddp"``) counts what the wrapper holds on each device (:func:`wrapper_bytes`)
    in the predicted and in the measured peak (the measurement runs unwrapped, in this process, and
    adds those bytes), and in the base of a ``"N%"`` budget."""
    extra = wrapper_bytes(model, distributed)
    remove_native(model)  # re-planning a model planned before: trace its own forward
    if profile is None:
        # Unfused: eager autograd runs the cross-entropy backward as two logits-sized ops.
        profile = profiler.profile(model, example_inputs, loss_fn=loss_fn, granularity=granularity, fuse_loss=False)
    op_graph = profile.regroup("op").graph
    fixed = _fixed_bytes(op_graph) + extra
    from solvers.regions import evaluate

    unplanned = evaluate(op_graph, ())
    unplanned_peak = fixed + unplanned.outcome.peak_bytes
    eager = None
    if measure and budget.percent is not None:
        # "N%" is of the eager step's measured peak (docs/native.md, "Which step '100%' is").
        eager = measure_native(model, (), example_inputs, loss_fn)
        eager = replace(eager, peak_bytes=eager.peak_bytes + extra)
        unplanned_peak = eager.peak_bytes
    budget_bytes = budget.resolve(unplanned_peak)
    target = budget_bytes
    measured = None
    solving = 0.0  # seconds in the search, the measurements apart
    # The un-checkpointed step measured within the budget needs nothing, whatever the prediction says
    # (a few bytes above the measurement on a tiny model made "100%" infeasible).
    attempts = 0 if eager is not None and eager.peak_bytes <= budget_bytes else REPAIRS + 1
    if attempts == 0:
        solved, held, measured = evaluate(op_graph, ()), fixed, eager
    for _ in range(attempts):
        try:
            search_started = time.perf_counter()
            solved, held = solve_native(profile, model, target, time_limit, extra)
            solving += time.perf_counter() - search_started
        except Infeasible as error:
            minimum = None if error.min_budget is None else error.min_budget + fixed
            least = _least_if_it_measures_within(profile, model, example_inputs, loss_fn, extra, budget_bytes,
                                                 minimum, measure, time_limit)
            if least is not None:
                solved, held, measured = least
                break
            raise Infeasible(
                f"budget {budget} ({format_bytes(budget_bytes)}) is below the least that checkpointing the model's "
                f"modules reaches" + (f": {format_bytes(minimum)} ({minimum} bytes)" if minimum else ""),
                min_budget=minimum, method=METHOD) from None
        if not measure:
            break
        measured = measure_native(model, solved.regions, example_inputs, loss_fn)
        measured = replace(measured, peak_bytes=measured.peak_bytes + extra)
        if measured.peak_bytes <= budget_bytes:
            break
        target -= measured.peak_bytes - budget_bytes  # the prediction missed by this much: ask for less
    if attempts and measured is not None and measured.peak_bytes > budget_bytes:
        raise Infeasible(
            f"budget {budget} ({format_bytes(budget_bytes)}): the native plan measured "
            f"{format_bytes(measured.peak_bytes)} after {REPAIRS} tightenings; try a larger budget or "
            "executor='traced'", min_budget=measured.peak_bytes, method=METHOD)
    plan = _native_plan(model, profile, solved, held, budget, budget_bytes, unplanned_peak,
                        unplanned.outcome.compute_cost, measured, solving)
    _check_times(plan)
    plan.input_shapes = input_shapes(*normalise_inputs(example_inputs))
    return plan


NEAR_MISS = 0.02  # a least predicted peak this close above the budget is measured before refusing


def _least_if_it_measures_within(profile, model, example_inputs, loss_fn, extra: int, budget_bytes: int,
                                 minimum: int | None, measure: bool, time_limit):
    """The least-peak plan, when its predicted peak is within :data:`NEAR_MISS` above the budget and
    its measured peak is within it: the prediction is an estimate of eager checkpointing (it
    over-predicts by up to a few tenths of a percent: docs/native.md), the measurement decides."""
    if not measure or minimum is None or minimum > budget_bytes * (1 + NEAR_MISS):
        return None
    try:
        solved, held = solve_native(profile, model, minimum, time_limit, extra)
    except Infeasible:
        return None
    measured = measure_native(model, solved.regions, example_inputs, loss_fn)
    measured = replace(measured, peak_bytes=measured.peak_bytes + extra)
    return (solved, held, measured) if measured.peak_bytes <= budget_bytes else None


SLOW_FAST = 0.2  # a measured step this far from the predicted one is worth a warning


def _check_times(plan: NativePlan) -> None:
    """Warn when the measured step and the predicted one disagree by more than :data:`SLOW_FAST`:
    the op times were measured under a different load (or the model does more than its trace),
    so the plan's choice between equally small plans may not be the fastest."""
    if plan.measured_seconds is None or plan.predicted_seconds <= 0:
        return
    ratio = plan.measured_seconds / plan.predicted_seconds
    if abs(ratio - 1) > SLOW_FAST:
        warnings.warn(
            f"the measured step took {plan.measured_seconds * 1000:.0f} ms against {plan.predicted_seconds * 1000:.0f} ms "
            f"predicted from the profiled op times ({ratio - 1:+.0%}): the machine's load changed between profiling "
            "and measuring, or the step runs more than its trace; the plan fits its budget either way (its peak was "
            "measured), but its time figures are unreliable", PlanWarning, stacklevel=3)


def _native_plan(model, profile, solved: RegionPlan, held: int, budget: Budget, budget_bytes: int,
                 unplanned_peak: int, unplanned_seconds: float, measured, seconds: float) -> NativePlan:
    graph = solved.graph.copy()
    graph.graph["fingerprint"] = graph_fingerprint(graph)
    recomputed = sum(len(region_costs(profile.regroup("op").graph, r).recomputed) for r in solved.regions)
    info = SolverInfo(
        method=METHOD, status="heuristic", solve_seconds=seconds, budget_bytes=budget_bytes - held,
        predicted_peak_bytes=solved.outcome.peak_bytes, compute_cost=solved.outcome.compute_cost,
        message=(f"checkpoint {len(solved.regions)} module(s) with torch.utils.checkpoint, recomputing "
                 f"{recomputed} op(s)") if solved.regions else "nothing to checkpoint: the step fits as it is",
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


__all__ = ["NATIVE_FORMAT", "NativePlan", "measure_native", "plan_native", "sequential_containers", "solve_native"]
