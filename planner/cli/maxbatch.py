"""``--max-batch``: the largest batch size whose plan fits the budget within an overhead.

The batch size scales dimension 0 of every tensor in the example inputs (rows are repeated to grow
it, cut to shrink it). Profiling every candidate would be slow, so the model is profiled at two batch
sizes, every node's cost, result size and workspace (and the fixed bytes) is taken as linear in the
batch size through those points, and the search solves on the predicted graphs: doubling until a
batch does not fit, then bisecting. The batch it finds is then profiled and planned for real; if
that plan does not fit, the real profile joins the fit and the search runs again below it.

The search assumes that a larger batch never fits where a smaller one does not (memory and time
grow with the batch); a percentage budget is of the un-checkpointed peak at the example batch size.

Nothing it runs is larger than the budget (or the device's memory, when lower: planner/bounded.py):
every profile, at every batch size, is memory-bounded (profiler/rematerialize.py), and a batch
whose profile the device cannot hold even so (its largest op alone does not fit) counts as not
fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import networkx as nx
import torch
import torch.utils._pytree as pytree

from ..api import BudgetInfeasible, plan, plan_from_profile
from ..budget import Budget, format_bytes, parse_budget
from ..planfile import Plan
from ..unplannable import unplannable_reason
from .progress import Progress

MAX_GROWTH = 2**16  # give up doubling beyond this multiple of the example batch
MAX_VERIFICATIONS = 4


class MaxBatchError(ValueError):
    """No batch size fits, or the inputs or graph do not scale with a batch dimension."""


class SearchCeiling(MaxBatchError):
    """A plan still fits at :data:`MAX_GROWTH` times the example batch (``batch``): the search stops."""

    def __init__(self, message: str, batch: int):
        super().__init__(message)
        self.batch = batch


@dataclass
class MaxBatch:
    batch_size: int
    example_batch_size: int
    plan: Plan
    profiled: list[int] = field(default_factory=list)  # batch sizes profiled for real, in order
    solves: int = 0  # plans made on predicted graphs


# -- the batch dimension ---------------------------------------------------------------------------
def batch_size_of(inputs: Any) -> int:
    """Dimension 0 shared by every tensor input; an error when they disagree or one is a scalar."""
    sizes = {}
    for path, leaf in pytree.tree_flatten_with_path(inputs)[0]:
        if isinstance(leaf, torch.Tensor):
            name = pytree.keystr(path) or "the input"
            if leaf.dim() == 0:
                raise MaxBatchError(f"--max-batch scales dimension 0 of every tensor input, but input {name} is a scalar")
            sizes[name] = leaf.shape[0]
    if not sizes:
        raise MaxBatchError("--max-batch scales dimension 0 of the tensor inputs, but the example inputs have none")
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{name}: {size}" for name, size in sizes.items())
        raise MaxBatchError(f"--max-batch needs one batch size, dimension 0 of every tensor input; they differ ({shown})")
    return next(iter(sizes.values()))


def scale_inputs(inputs: Any, batch: int) -> Any:
    """The inputs with dimension 0 of every tensor made ``batch``: rows cut, or repeated in order."""
    def scale(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        copies = math.ceil(batch / leaf.shape[0])
        rows = torch.cat([leaf] * copies) if copies > 1 else leaf
        return rows[:batch].clone()  # its own storage: a view would count the bytes of all the rows

    return pytree.tree_map(scale, inputs)


# -- linear model of the cost graph in the batch size ----------------------------------------------
def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope through (batch, value) points."""
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (y - mean_y) for b, y in points) / spread if spread else 0.0
    return mean_y - slope * mean_b, slope


def check_same_structure(graphs: dict[int, nx.DiGraph]) -> None:
    (first_batch, first), *others = sorted(graphs.items())
    for batch, graph in others:
        if set(graph.nodes) != set(first.nodes) or set(graph.edges) != set(first.edges):
            raise MaxBatchError(
                f"the cost graph at batch {batch} has other nodes or edges than at batch {first_batch}: the model "
                "does not compute the same steps at every batch size, so its costs cannot be interpolated"
            )


def predict_graph(graphs: dict[int, nx.DiGraph], batch: int) -> nx.DiGraph:
    """The cost graph at ``batch``, each node's cost, mem and workspace linear in the batch size
    through the profiled graphs (least squares when there are more than two)."""
    if batch in graphs:
        return graphs[batch]
    base = graphs[min(graphs)]
    predicted = base.copy()
    for node, data in predicted.nodes(data=True):
        for attribute, whole in (("cost", False), ("mem", True), ("workspace", True)):
            a, c = _line([(b, float(g.nodes[node].get(attribute, 0))) for b, g in graphs.items()])
            value = max(0.0, a + c * batch)
            data[attribute] = int(round(value)) if whole else value
    a, c = _line([(b, float(g.graph["fixed_bytes"])) for b, g in graphs.items()])
    predicted.graph["fixed_bytes"] = max(0, int(round(a + c * batch)))
    return predicted


# -- the search --------------------------------------------------------------------------------------
def largest_fitting(fits: Callable[[int], bool], start: int, below: int | None = None) -> int:
    """The largest batch ``b < below`` with ``fits(b)``, assuming fits is monotone; 0 if none.
    Doubles from ``start`` until a batch does not fit, then bisects."""
    upper = below if below is not None else None
    if upper is not None and start >= upper:
        start = max(1, upper - 1)
    if fits(start):
        low, candidate = start, start * 2
        while upper is None or candidate < upper:
            if candidate > start * MAX_GROWTH:
                raise SearchCeiling(f"a plan still fits at batch {low} ({MAX_GROWTH}x the example's): the step's memory "
                                    "does not seem to grow with dimension 0 of the inputs", low)
            if not fits(candidate):
                upper = candidate
                break
            low, candidate = candidate, candidate * 2
    else:
        low, upper = 0, start
    while upper - low > 1:
        middle = (low + upper) // 2
        if fits(middle):
            low = middle
        else:
            upper = middle
    return low


def _within(made: Plan, max_overhead: float | None) -> bool:
    return max_overhead is None or made.predicted_overhead <= max_overhead + 1e-12


def find_max_batch(model: torch.nn.Module, example_inputs: Any, budget, solver: str = "auto",
                   max_overhead: float | None = None, loss_fn=None, time_limit: float | None = None,
                   granularity="module", progress: Progress | None = None,
                   inputs_at: Callable[[int], Any] | None = None, device_memory=None) -> MaxBatch:
    """The largest batch size whose plan fits ``budget`` with overhead at most ``max_overhead``
    (a fraction: 0.3 is +30%; None: any), and that plan, made from a real profile at that batch.

    ``inputs_at(batch)`` builds the inputs at a batch size (a model file's ``inputs_at``); without
    it, dimension 0 of every tensor input is scaled. Plans are traced plans (``executor="traced"``),
    the class the predictions at other batch sizes are made for. ``device_memory``: as
    :func:`planner.plan`'s; profiling holds at most the lower of it and a byte budget."""
    import profiler
    from profiler.oom import OutOfMemory

    from ..bounded import check_within_device, device_memory_of, profiling_bound

    from ..sweep.tasks import Profiled

    progress = progress or Progress(enabled=False)
    parsed: Budget = parse_budget(budget)
    if solver == "regions":
        raise MaxBatchError("--max-batch plans traced plans only (the costs it predicts at other batch sizes are the "
                            "traced graph's): use --solver auto or a method of the traced executor (dp, cpsat...), or "
                            "plan native regions without --max-batch at the batch size you choose")
    unplannable = unplannable_reason(model, example_inputs)
    if unplannable:
        raise MaxBatchError(unplannable)
    example = batch_size_of(example_inputs)
    device_memory = device_memory_of(model, example_inputs, device_memory)
    check_within_device(parsed, parsed.bytes, device_memory)
    bound = profiling_bound(parsed, device_memory)

    def inputs_for(batch: int):
        if batch == example:
            return example_inputs
        return inputs_at(batch) if inputs_at is not None else scale_inputs(example_inputs, batch)

    def profile_at(batch: int):
        with progress.task(f"Profiling at batch size {batch}"):
            try:
                return profiler.profile(model, inputs_for(batch), loss_fn=loss_fn, granularity=granularity,
                                        memory_bound=bound)
            except profiler.CaptureError as error:
                if batch == example:
                    raise
                how = "inputs_at(batch)" if inputs_at is not None else \
                    f"dimension 0 of every tensor input scaled from {example} to {batch}"
                raise MaxBatchError(
                    f"at batch size {batch} ({how}) the step failed: {str(error).rstrip('.')}. --max-batch needs inputs and a loss "
                    "that follow the batch size: a loss_fn whose targets are sized from the output, and, where "
                    "scaling dimension 0 is not how the batch grows, inputs_at(batch) in the model file") from None

    base = profile_at(example)
    budget_bytes = parsed.resolve(_unplanned_peak(base.graph))  # a percentage: of the example batch's peak
    check_within_device(parsed, budget_bytes, device_memory)
    second = example // 2 if example >= 4 else example * 2
    graphs = {example: base.graph, second: profile_at(second).graph}
    profiled = [example, second]
    check_same_structure(graphs)
    result = MaxBatch(0, example, None, profiled)  # type: ignore[arg-type]

    def predicted_fits(batch: int) -> bool:
        graph = predict_graph(graphs, batch)
        stand_in = Profiled(type(model).__name__, graph, tuple(base.joint.loss.tangent_outputs),
                            tuple(base.joint.loss.tangent_specs), tuple(base.joint.layout.signature),
                            base.granularity, base.device, 0.0, False)
        result.solves += 1
        try:
            # The stand-in holds no finer groupings: finer=True only lets auto try store-all first.
            made = plan_from_profile(stand_in.as_profile(), budget_bytes, solver=solver, time_limit=time_limit,
                                     model_name=type(model).__name__)
        except BudgetInfeasible:
            fits = False
        else:
            fits = _within(made, max_overhead)
        progress.note(f"  batch {batch}: {'fits' if fits else 'does not fit'} (predicted)")
        return fits

    below = None
    for _ in range(MAX_VERIFICATIONS):
        try:
            batch = largest_fitting(predicted_fits, example, below)
        except SearchCeiling as ceiling:
            raise _ceiling_error(ceiling, parsed, budget_bytes, graphs) from None
        if batch == 0:
            raise MaxBatchError(_nothing_fits(parsed, budget_bytes, max_overhead))
        inputs = inputs_for(batch)
        try:
            real = base if batch == example else profile_at(batch)
        except OutOfMemory as error:  # even bounded, one op of this batch is more than the device holds
            progress.note(f"  batch {batch}: does not fit ({error.device} ran out of memory profiling it)")
            below = batch
            continue
        if batch not in profiled:
            profiled.append(batch)
        try:
            with progress.task(f"Planning at batch size {batch}"):
                # loss_fn too: on CUDA the plan is measured (planner.api.repaired_on_measurement), and
                # without it the measured step's loss would be the default one over every output.
                made = plan(model, inputs, budget_bytes, solver=solver, time_limit=time_limit, profile=real,
                            executor="traced", device_memory=device_memory, loss_fn=loss_fn)
        except BudgetInfeasible:
            made = None
        if made is not None and _within(made, max_overhead):
            made.budget_text = f"{parsed} of batch {example}'s peak" if parsed.percent is not None else str(parsed)
            result.batch_size, result.plan = batch, made
            return result
        graphs[batch] = real.graph  # the prediction was too optimistic here: learn from it, look below
        check_same_structure(graphs)
        below = batch
    raise MaxBatchError(f"the predicted largest batch size did not fit when profiled, {MAX_VERIFICATIONS} times "
                        f"(last tried: {below}); the costs do not grow linearly with the batch size")


def _ceiling_error(ceiling: SearchCeiling, budget: Budget, budget_bytes: int,
                   graphs: dict[int, nx.DiGraph]) -> MaxBatchError:
    """What to say when a plan still fits at the search's ceiling: the budget is simply large for
    this model where the un-checkpointed peak grows with the batch (the two profiled batches say by
    how much a sample), else the memory does not follow dimension 0 (``ceiling``'s own words)."""
    (small, first), (large, second) = sorted(graphs.items())[:2]
    per_sample = (_unplanned_peak(second) - _unplanned_peak(first)) / (large - small)
    if per_sample <= 0:
        return ceiling
    fixed = _unplanned_peak(first) - per_sample * small
    stored = int((budget_bytes - fixed) // per_sample)  # every sample's activations held, nothing recomputed
    return MaxBatchError(
        f"budget {budget} ({format_bytes(budget_bytes)}) is simply large for this model: a plan still fits at batch "
        f"{ceiling.batch} ({MAX_GROWTH}x the example's, where --max-batch stops searching); its step grows by "
        f"{format_bytes(per_sample)} a sample, so even without checkpointing about {stored:,} samples fit; give the "
        "budget of the device you train on, or a larger example batch")


def _unplanned_peak(graph: nx.DiGraph) -> int:
    from solvers import simulate
    from solvers.store_all import store_all_schedule

    return int(graph.graph["fixed_bytes"]) + simulate(graph, store_all_schedule(graph)).peak_bytes


def _nothing_fits(budget: Budget, budget_bytes: int, max_overhead: float | None) -> str:
    within = f" within {max_overhead:+.0%} overhead" if max_overhead is not None else ""
    return f"no batch size fits budget {budget} ({format_bytes(budget_bytes)}){within}, not even 1"
