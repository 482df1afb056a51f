"""Between schedules and model values: the compute order a solution encodes, the values a
schedule gives the model's variables (a warm start), and the orders the model can express."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..graph import NodeCosts, is_topological_order
from ..liveness import drop_redundant_computes, schedule_from_computes
from ..schedule import COMPUTE, Schedule
from .model import CheckmateModel


def compute_order(model: CheckmateModel, values: np.ndarray) -> list[int]:
    """The compute order (node positions) encoded by ``R``'s values: stage by stage, ascending
    within one."""
    on = np.asarray(values) > 0.5
    order = []
    for t, slot in enumerate(model.slots):
        columns = model.r_col[t, slot[:-1]]
        order.extend(np.asarray(slot[:-1])[on[columns]].tolist() if len(columns) else [])
        order.append(t)
    return order

def schedule_of_order(graph, costs: NodeCosts, order: Sequence[int]) -> Schedule:
    """The schedule with the fewest held bytes for this compute order (frees added by liveness)."""
    nodes = drop_redundant_computes(graph, [costs.order[i] for i in order])
    return schedule_from_computes(graph, nodes)

def stages_of_order(costs: NodeCosts, order: Sequence[int]) -> list[list[int]] | None:
    """Split a compute order into Checkmate's stages, or ``None`` when the model cannot express it:
    first computations out of the fixed order, or a stage that is not strictly ascending."""
    stages: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and i <= current[-1]:
            return None  # a recomputation out of ascending order (or twice) within one stage
        if i > len(stages):
            return None  # computed before the stages of the nodes before it: not the fixed order
        current.append(i)
        if i == len(stages):
            stages.append(current)
            current = []
    if current or len(stages) != costs.n:
        return None
    return stages


def _set_one(entry: tuple[int, int], values: np.ndarray) -> bool:
    """Set a warm-start entry to 1: a column gets the value, a fixed entry must already be 1
    (False: the schedule is not expressible in the model)."""
    column, fixed = entry
    if column < 0:
        return fixed == 1
    values[column] = 1.0
    return True


def _stage_values(model: CheckmateModel, steps, stages: list[list[int]]) -> np.ndarray | None:
    """R, S and FREE values for a schedule's steps split into ``stages``, every other column 0;
    ``None`` when a step needs an entry the model fixes to 0 (or has no column for)."""
    costs = model.costs
    values = np.zeros(model.num_cols, dtype=np.float64)
    held: set[int] = set()
    stage_of = [t for t, stage in enumerate(stages) for _ in stage]
    position = -1
    last: tuple[int, int] | None = None  # (stage, node) of the latest compute
    for kind, node in steps:
        i = costs.index[node]
        if kind == COMPUTE:
            position += 1
            t = stage_of[position]
            entering = last is None or last[0] != t  # what is held now is held entering stage t
            if entering and not all(_set_one(model.s(t, h), values) for h in held):
                return None
            if not _set_one(model.r(t, i), values):
                return None
            held.add(i)
            last = (t, i)
            continue
        t, k = last
        held.discard(i)
        if k == t:
            continue  # a free after the stage's last computation: not a model column
        column = model.free(t, i, k)
        if column < 0:
            return None
        values[column] = 1.0
    return values


def _memory_values(model: CheckmateModel, values: np.ndarray) -> None:
    """Fill in ``U`` (and the peak) from R, S and FREE: the recursion of :func:`build_model`."""
    costs = model.costs
    mem = [m / model.scales.mem_unit for m in costs.mem]
    peak = 0.0

    def value(entry: tuple[int, int]) -> float:
        column, fixed = entry
        return float(fixed) if column < 0 else float(values[column])

    for t in range(costs.n):
        previous = None
        for k in model.slots[t]:
            if previous is None:
                u = sum(mem[i] * value(model.s(t, i)) for i in range(t)) + mem[k] * value(model.r(t, k))
            else:
                u = values[model.u_col[t, previous]] + mem[k] * value(model.r(t, k))
                for i in (*costs.preds[previous], previous):
                    column = model.free(t, i, previous)
                    u -= mem[i] * values[column] if column >= 0 else 0.0
            values[model.u_col[t, k]] = u
            if value(model.r(t, k)) > 0.5:
                peak = max(peak, u + costs.workspace[k] / model.scales.mem_unit)
            previous = k
    if model.peak is not None:
        values[model.peak] = max(peak, model.col_lower[model.peak])


def model_values(model: CheckmateModel, graph, schedule: Schedule) -> np.ndarray | None:
    """Values of every model variable for ``schedule`` (a warm start), or ``None`` when the model
    cannot express its computations. (Whether they meet the model's budget is
    :func:`check_values`'s to say.)

    The schedule's computations are kept, less any whose result nobody reads, and its frees are
    replaced by the earliest ones (:func:`schedule_from_computes`), which never hold more.
    """
    costs = model.costs
    nodes = drop_redundant_computes(graph, schedule.computes())
    stages = stages_of_order(costs, [costs.index[v] for v in nodes])
    if stages is None:
        return None
    values = _stage_values(model, schedule_from_computes(graph, nodes).steps, stages)
    if values is not None:
        _memory_values(model, values)
    return values


def _check_values(model: CheckmateModel, values: np.ndarray, tolerance: float = 1e-6) -> bool:
    """Whether ``values`` satisfy every row and column bound of the model (a guard on the warm start)."""
    x = np.asarray(values, dtype=np.float64)
    if np.any(x < model.col_lower - tolerance) or np.any(x > model.col_upper + tolerance):
        return False
    rows = np.repeat(np.arange(model.num_rows), np.diff(model.row_start))
    activity = np.bincount(rows, weights=model.row_value * x[model.row_index], minlength=model.num_rows)
    return bool(np.all(activity >= model.row_lower - tolerance) and np.all(activity <= model.row_upper + tolerance))

def least_recomputation(costs: NodeCosts, held: Sequence[set[int]]) -> list[int] | None:
    """Given which results are held entering each stage (``held[t]``, t = 0..n, ``held[n]`` what
    must be held at the end), the fewest computations that make it a schedule, as a compute order.

    Stage t computes t, everything held entering stage t+1 that is not held entering t, and,
    closing over inputs, whatever those read that is not held. ``None`` when ``held`` asks for a
    result before it exists.
    """
    order = []
    for t in range(costs.n):
        need = {t} | (held[t + 1] - held[t])
        if max(need) > t:
            return None
        frontier = sorted(need)
        while frontier:
            k = frontier.pop()
            for i in costs.preds[k]:
                if i not in held[t] and i not in need:
                    need.add(i)
                    frontier.append(i)
        order.extend(sorted(need))
    return order

def expressible(graph, costs: NodeCosts, schedule: Schedule) -> bool:
    """Whether the model can express the schedule's computations (fixed first-computation order,
    each stage ascending): then its cost is bounded below by the model's bounds."""
    order = [costs.index[v] for v in drop_redundant_computes(graph, schedule.computes())]
    return stages_of_order(costs, order) is not None

def first_computation_order(graph, schedule: Schedule) -> list | None:
    """The nodes in the order ``schedule`` first computes them (its computations that something
    reads), or ``None`` when that is not a topological order of all of ``graph``."""
    order = list(dict.fromkeys(drop_redundant_computes(graph, schedule.computes())))
    return order if is_topological_order(graph, order) else None
