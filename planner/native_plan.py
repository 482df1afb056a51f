"""The native plan format: which modules ``torch.utils.checkpoint`` wraps, with the region schedule
that predicts them and the measured step, saved as ``plan-checkpoints/native/1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solvers import simulate
from solvers.regions import twin
from solvers.schedule import SolverInfo

from .autocast import describe as describe_autocast
from .budget import format_bytes
from .planchecks import native_figures_problem, overlapping_regions
from .planfile import FORMAT as PLAN_FORMAT
from .planfile import Plan, PlanFileError, _list, _text, _whole, held_throughout
from .unrestricted import class_cost_words

NATIVE_FORMAT = "plan-checkpoints/native/1"


@dataclass
class NativePlan(Plan):
    """A plan the native executor runs: ``regions`` checkpointed with torch.utils.checkpoint.

    ``graph`` and ``schedule`` are the model of solvers/regions/ of that execution (the op-level graph
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
        node of its own (solvers/regions/names.py, ``twin``), computed once, so the schedule's counts show none."""
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
            f"{'iteration' if self.optimizer else 'step'}; {held_throughout(self.graph)} "
            f"{'and the optimizer state ' if self.optimizer else ''}take {format_bytes(self.fixed_bytes)}",
            f"Predicted peak:    {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)}" + (f" ({saving:.1%} less)" if saving > 0 else ""),
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
            f"{self.predicted_overhead:+.1%} over no checkpointing{class_cost_words(self)}",
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
