"""``cpsat``: the optimal schedule over all computation orders, on OR-tools CP-SAT.

The formulation is Moccasin's retention intervals (Bartan et al., "Moccasin: Efficient Tensor
Rematerialization for Neural Networks", ICML 2023), written for this project's memory model
(docs/schedule.md, docs/costgraph.md) and strengthened with dominance constraints and with
combinatorial lower bounds.

The model (:func:`build_model`)
-------------------------------
Time is a sequence of compute steps ``0 .. K-1``, one computation per step. Node ``v`` gets ``C_v``
optional *instances* ``k = 0 .. C_v-1``: instance ``k`` is computed at step ``start[v,k]`` and its
result is held during the steps ``start .. stop-1`` (its *retention interval*, ``stop`` exclusive).

- *presence*: instance 0 is present (every node is computed at least once); the presence literals
  are ordered, ``present[v,k] >= present[v,k+1]``, and present instances are disjoint and in time
  order (a node is never held when it is recomputed). Instances are numbered by time: no symmetry.
- *one computation per step*: the compute intervals ``[start, start+1)`` do not overlap, and the
  ``K = sum(present)`` computations fill the steps ``0 .. K-1`` (no idle steps: one assignment per
  compute order, not one per placement of idle steps).
- *memory*: one cumulative constraint, capacity = the budget, over the retention intervals (demand
  ``mem[v]``) and the compute intervals (demand ``workspace[v]``). Memory during step ``t`` is then
  ``held + mem[v] + workspace[v]``, what ``simulate`` measures: a result read for the last time at
  ``t`` is freed after step ``t``, so it still counts during it.
- *reads*: for every edge ``u -> v`` and present instance ``j`` of ``v``, exactly one literal
  ``cover[u,i,v,j]`` holds, placing ``start[u,i] < start[v,j] < stop[u,i]``: an instance of ``u``
  is held when ``v`` is computed.
- *frees*: exactly one reader of an instance is its *last* reader, and the instance is freed right
  after it (``stop = start[last reader] + 1``); the last instance of an output is held to the end
  (``stop = K``); a non-output sink is freed at once. These are the frees of
  ``schedule_from_computes``, the least memory for a compute order; they leave the search no slack
  in ``stop`` and imply "every instance is read, but an output's last".
- objective: the total cost of the present instances (phase 2), or the capacity (phase 1).

Redundant constraints, for propagation only: an instance starts after the first instance of each
input; a node's first instance comes after its ancestors' and leaves room for its descendants';
the covering instance of ``u`` is monotone in ``v``'s instance number; the number of computations
is at most what the best known cost allows; the cost is at least the backward bound (below).

How many intervals per node
---------------------------
Among the optimal schedules take one, ``Y``, with the fewest computations, with the frees of
``schedule_from_computes`` (no more memory at any step, so still within the budget). In ``Y``

1. every instance of ``v`` is read by some computation, except possibly the last instance of an
   output: an unread instance that is not the node's only one could be dropped, which keeps the
   schedule valid, raises memory at no step and the cost not at all (costs are >= 0), and removes
   a computation;
2. a computation reads one instance of each input, so distinct instances of ``v`` are read by
   distinct computations of its successors:
   ``count(v) <= max(1, sum over successors w of count(w) + [v is an output])``; a sink, and a
   pinned node, is computed once;
3. each recomputation of ``v`` costs ``cost[v]`` on top of the un-checkpointed cost ``T``, so, with
   ``U`` the cost of any known schedule: ``count(v) <= 1 + (U - T) / cost[v]``.

``C_v = min(rule 2 over the successors' C_w, rule 3)``, in reverse topological order, gives by
induction ``count_Y(v) <= C_v`` for every ``v``: the model contains ``Y`` (it meets every
constraint above), so its optimum is the true optimum. The same holds for the minimum peak (rules
1-2, ``Y`` a minimum-peak schedule with the fewest computations).

Rule 2 grows with depth (a forward node ``d`` steps before the loss of a training graph gets about
``d``), so on large graphs some ``C_v`` are *capped* below it. A weaker argument then still bounds
the optimum: if ``Y`` does not fit the capped counts, take the last node ``v`` in topological order
with ``count_Y(v) > C_v``; its successors fit, so its cap is below its rule 2-3 value (else
``count_Y(v) <= C_v``), and ``cost(Y) >= T + C_v * cost[v]``. Hence the true optimum is at least
``min(bound of the capped model, min over capped v of T + C_v * cost[v])``, part of
``info.lower_bound``; the status is ``optimal`` when the lower bound meets the schedule's cost.
While time allows, the caps whose term is below the best cost are raised and the model solved
again, hinted with the best schedule. Where that does not close, ``info.message`` says "optimal
with up to C intervals per node" (or "searched with ...") and the status is ``feasible``.

Lower bounds (:class:`Backward`)
--------------------------------
The first moment a schedule holds all of a set ``S`` of results follows the computation of some
``x`` in ``S``, during which ``S - {x}``, ``x`` and its inputs are held, and before which
``S - {x} + inputs(x)`` was held. Unrolled over ``x``, this bounds the peak of every schedule, and
the cost of every schedule within a budget (reaching the outputs, or a node with its inputs, plus
one computation of every node outside their ancestry). Read backwards, such an unrolling *is* a
schedule, so on small graphs both bounds are usually exact: phase 1 then proves the minimum budget
as soon as it meets the peak bound, and phase 2 stops as soon as CP-SAT meets the cost bound. On
large graphs the recursion is cut off (each set then gets a trivial bound) and CP-SAT's own bound
does the work.

Phases
------
Store-all, when it fits, is optimal. Otherwise the quick methods (store-all, chen-greedy, dp) and two
heuristics of this module give hints within the budget (``hints=True``). Phase 1 (only when none
fits) minimises the peak, floored at the budget: it finds a first schedule, or proves the budget
infeasible and gives ``Infeasible.min_budget`` (proven when it meets the peak bound; the message
says when not). Phase 2 minimises the cost, restarting with smaller counts when a better schedule
shrinks them (rule 3).

Numbers
-------
Memory is divided by the gcd of all sizes (exact; coarser, rounded up, only against int64
overflow, and then only the trivial cost bound is claimed). Costs become integers: by a power of
ten when that makes every cost whole (within 1e-9), otherwise rounded *down* at a scale where the
largest objective is ~1e12; the model's bound then still bounds every schedule's true cost from
below, so ``lower_bound`` stays honest and ``gap`` covers the rounding (``optimal`` needs a
relative gap <= 1e-9).
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from functools import reduce
from typing import Callable, Sequence

from . import exhaustive
from .bounds import BOUND_SECONDS, Backward, relatives
from .clock import Clock
from .errors import Infeasible, SolverTimeout, SolverUnavailable
from .graph import NodeCosts, node_costs, total_cost
from .liveness import schedule_from_computes
from .options import schedule_from, time_limit_or_default
from .schedule import Schedule
from .simulate import Simulation, simulate

try:  # OR-tools is a declared dependency, but `import solvers` must work without it
    from ortools.sat.python import cp_model
except ImportError:  # pragma: no cover
    cp_model = None

LOG = logging.getLogger(__name__)
METHOD = "cpsat"
HEURISTIC_METHODS = ("store-all", "chen-greedy", "dp")
# A schedule is reported optimal when the proven relative gap is at most this (float rounding).
OPTIMALITY_TOLERANCE = 1e-9
# Rule 2 grows fast with depth; keep the arithmetic small.
COUNT_CEILING = 1_000_000
# Inexact cost scaling: the largest possible objective, in model units.
COST_UNITS_TARGET = 1e12
# Model size is the horizon (sum of interval counts). The first model is capped at
# max(FIRST_HORIZON_PER_NODE * n, FIRST_HORIZON_MIN); raising caps stops at MAX_HORIZON_PER_NODE * n.
FIRST_HORIZON_PER_NODE = 2
FIRST_HORIZON_MIN = 150
MAX_HORIZON_PER_NODE = 12
# Phase 2 restarts with smaller counts when a new best schedule shrinks the horizon this much.
RESTART_SHRINK = 0.75
# Share of the remaining time phase 1 may use before phase 2 gets the rest.
PHASE1_TIME_SHARE = 0.5
# CP-SAT parameters on top of OR-tools' defaults (num_workers, time limit and seed are set per run).
# Probing at presolve costs more than it saves on these models (measured on the tests' graphs).
SOLVER_PARAMETERS: dict = {"cp_model_probing_level": 0, "max_presolve_iterations": 1}
# Phase 1 on graphs this small first tries the exact bit-mask search of solvers/exhaustive.py, with
# this share of the time: measured, CP-SAT did not reach the minimum peak of a 20-node training
# graph (a 4-layer MLP by op) in 60 s, which the search proves in ~2 s.
EXACT_PEAK_MAX_NODES = 20
EXACT_PEAK_TIME_SHARE = 0.3


# -- numbers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryScale:
    """Sizes in model units of ``unit`` bytes; ``exact`` when no size was rounded."""

    unit: int
    mem: tuple[int, ...]
    workspace: tuple[int, ...]
    exact: bool

    def capacity(self, budget_bytes: int) -> int:
        # Rounding down is exact when every size is a multiple of the unit, and safe (never admits
        # a schedule over the budget) when sizes were rounded up.
        return budget_bytes // self.unit

    def units_at_least(self, lower_bytes: int) -> int:
        """A lower bound in bytes as one in model units (sizes are never rounded down)."""
        return -(-lower_bytes // self.unit)


def scale_memory(costs: NodeCosts, horizon: int) -> MemoryScale:
    """Divide sizes by their gcd; coarser (rounded up) only if the cumulative could overflow."""
    sizes = [s for s in (*costs.mem, *costs.workspace) if s > 0]
    unit = reduce(math.gcd, sizes, 0) or 1
    exact = True
    worst = sum(costs.mem) + sum(costs.workspace)
    while (worst // unit + costs.n) * max(horizon, 1) * 4 > 2**60:  # CP-SAT checks sums against int64
        unit *= 2
        exact = False
    return MemoryScale(unit, tuple(-(-m // unit) for m in costs.mem),
                       tuple(-(-w // unit) for w in costs.workspace), exact)


@dataclass(frozen=True)
class CostScale:
    """``units[v] = floor(cost[v] * factor)``; ``exact`` when that lost nothing (within 1e-9)."""

    factor: float
    units: tuple[int, ...]
    exact: bool

    def seconds(self, units: float) -> float:
        return units / self.factor


def scale_costs(cost: Sequence[float], max_instances: int) -> CostScale:
    largest = max(cost, default=0.0)
    if largest <= 0:
        return CostScale(1.0, tuple(0 for _ in cost), True)
    for digits in range(10):  # a power of ten that makes every cost whole, if one does
        factor = 10.0**digits
        if largest * factor * max_instances > COST_UNITS_TARGET:
            break
        units = [round(c * factor) for c in cost]
        if all(abs(c * factor - u) <= 1e-9 * max(1.0, c * factor) for c, u in zip(cost, units)):
            return CostScale(factor, tuple(units), True)
    factor = COST_UNITS_TARGET / (largest * max(max_instances, 1))
    return CostScale(factor, tuple(math.floor(c * factor) for c in cost), False)


# -- interval counts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Counts:
    """Instances per node, and which nodes got fewer than rules 2-3 (module doc) allow."""

    counts: tuple[int, ...]
    capped: tuple[bool, ...]

    @property
    def horizon(self) -> int:
        return sum(self.counts)

    @property
    def largest(self) -> int:
        return max(self.counts, default=0)


def recompute_limit(cost: float, spare: float | None) -> int:
    """Rule 3: a schedule at most ``spare`` seconds dearer than computing every node once computes
    a node of cost ``cost`` at most ``1 + spare / cost`` times (rounded up against float error)."""
    if spare is None or cost <= 0:
        return COUNT_CEILING
    extra = max(spare, 0.0) / cost * (1 + 1e-9) + 1e-9  # inf for a denormal cost: no limit
    return COUNT_CEILING if extra >= COUNT_CEILING else 1 + int(extra)


def interval_counts(costs: NodeCosts, caps: Sequence[int], spare: float | None,
                    at_least: Sequence[int] = ()) -> Counts:
    """``C_v = min(rule 2, rule 3, caps[v])``, raised to ``at_least[v]`` (a hint's counts), in reverse
    topological order so that rule 2 sees the successors' final counts."""
    counts = [0] * costs.n
    capped = [False] * costs.n
    for v in reversed(range(costs.n)):
        if costs.pinned[v] or not costs.succs[v]:
            natural = 1
        else:
            reads = sum(counts[w] for w in costs.succs[v]) + (1 if costs.output[v] else 0)
            natural = min(COUNT_CEILING, max(1, reads), recompute_limit(costs.cost[v], spare))
        count = min(natural, caps[v])
        if at_least:
            count = max(count, at_least[v])
        counts[v] = count
        capped[v] = count < natural
    return Counts(tuple(counts), tuple(capped))


def uniform_cap(costs: NodeCosts, spare: float | None, horizon_limit: int, at_least: Sequence[int]) -> int:
    """The largest cap for every node whose counts fit ``horizon_limit`` (1 if none does)."""
    def horizon(cap: int) -> int:
        return interval_counts(costs, [cap] * costs.n, spare, at_least).horizon

    low, high = 1, COUNT_CEILING
    if horizon(high) <= horizon_limit:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if horizon(middle) <= horizon_limit:
            low = middle
        else:
            high = middle - 1
    return low


def capped_lower_bound(costs: NodeCosts, counts: Counts, base: float) -> float:
    """The module doc's bound on a schedule that needs more instances than ``counts`` allows."""
    return min((base + counts.counts[v] * costs.cost[v] for v in range(costs.n) if counts.capped[v]),
               default=math.inf)


def counts_of(n: int, computes: Sequence[int]) -> list[int]:
    used = [0] * n
    for v in computes:
        used[v] += 1
    return used


def max_computations(costs: NodeCosts, spare: float | None) -> int | None:
    """At most this many computations in a schedule within ``spare`` of the un-checkpointed cost."""
    if spare is None or not costs.n or min(costs.cost) <= 0:
        return None
    extra = max(spare, 0.0) / min(costs.cost) * (1 + 1e-9) + 1e-9
    return None if extra >= COUNT_CEILING * costs.n else costs.n + int(extra)


# -- the CP-SAT model ---------------------------------------------------------------------------
@dataclass
class Instance:
    present: "cp_model.IntVar"
    start: "cp_model.IntVar"
    stop: "cp_model.IntVar"  # exclusive: held during steps start .. stop-1
    size: "cp_model.IntVar"
    held: "cp_model.IntervalVar"  # [start, stop): the retention interval
    step: "cp_model.IntervalVar"  # [start, start+1): the computation


@dataclass
class RetentionModel:
    model: "cp_model.CpModel"
    instances: list[list[Instance]]
    cover: dict  # (u, i, v, j) -> literal: instance j of v reads instance i of u
    last: dict  # (u, i, v, j) -> literal: ... and is its last reader
    steps: "cp_model.IntVar"  # K, the number of computations
    capacity: "cp_model.IntVar | int"
    capacity_low: int
    horizon: int


def build_model(costs: NodeCosts, counts: Counts, memory: MemoryScale, capacity: tuple[int, int],
                cost_units: Sequence[int] | None, max_steps: int | None = None,
                cost_floor: int = 0, clock: Clock | None = None) -> RetentionModel:
    """The retention-interval model (module doc). ``capacity`` is the (low, high) range of the
    memory capacity in units, one budget when equal. With ``cost_units`` the objective is the cost
    (at least ``cost_floor``, a proven lower bound), else the capacity.

    Building is Python work that grows with the product of the counts along each edge (on a
    250-node layered DAG, ~1.3M cover literals and ~13M implied clauses, minutes): with a
    ``clock`` it is checked once per node of each family (and every 4096 implied clauses), and
    :class:`SolverTimeout` raised when the limit passes."""
    clock = clock or Clock(None)
    n, horizon = costs.n, counts.horizon
    ancestors, descendants = relatives(costs)
    model = cp_model.CpModel()

    # Variables: C_v optional instances per node, each a compute step and a retention interval.
    instances: list[list[Instance]] = []
    for v in range(n):
        clock.check(METHOD, "building the CP-SAT model (its intervals)")
        row = []
        for k in range(counts.counts[v]):
            earliest = ancestors[v] + k  # all ancestors come first; instance k is the (k+1)-th
            present = model.new_bool_var(f"present_{v}_{k}")
            start = model.new_int_var(earliest, horizon - 1, f"start_{v}_{k}")
            stop = model.new_int_var(earliest + 1, horizon, f"stop_{v}_{k}")
            size = model.new_int_var(1, horizon - earliest, f"size_{v}_{k}")
            held = model.new_optional_interval_var(start, size, stop, present, f"held_{v}_{k}")
            step = model.new_optional_fixed_size_interval_var(start, 1, present, f"step_{v}_{k}")
            row.append(Instance(present, start, stop, size, held, step))
        instances.append(row)
    steps = model.new_int_var(n, max(n, min(horizon, max_steps or horizon)), "steps")
    cap = capacity[0] if capacity[0] == capacity[1] else model.new_int_var(capacity[0], capacity[1], "capacity")

    # Every node is computed at least once; instances are used in order (symmetry breaking).
    for row in instances:
        model.add(row[0].present == 1)
        for earlier, later in zip(row, row[1:]):
            model.add_implication(later.present, earlier.present)

    # A node is not held when it is recomputed: present instances are disjoint, in time order.
    for row in instances:
        for earlier, later in zip(row, row[1:]):
            model.add(earlier.stop <= later.start).only_enforce_if(later.present)

    # Absent instances are parked at the end, so that the search never branches on them.
    for row in instances:
        for inst in row[1:]:
            model.add(inst.start == horizon - 1).only_enforce_if(~inst.present)
            model.add(inst.stop == horizon).only_enforce_if(~inst.present)
    for row in instances:
        for inst in row:
            model.add(inst.start + inst.size == inst.stop)

    # One computation per step, and the K computations fill steps 0..K-1 (no idle steps).
    model.add_no_overlap([inst.step for row in instances for inst in row])
    model.add(steps == sum(inst.present for row in instances for inst in row))
    for row in instances:
        for inst in row:
            model.add(inst.stop <= steps).only_enforce_if(inst.present)

    # Memory: results held (retention intervals) plus the workspace of the computation under way.
    intervals, demands = [], []
    for v, row in enumerate(instances):
        for inst in row:
            if memory.mem[v] > 0:
                intervals.append(inst.held)
                demands.append(memory.mem[v])
            if memory.workspace[v] > 0:
                intervals.append(inst.step)
                demands.append(memory.workspace[v])
    if intervals:
        model.add_cumulative(intervals, demands, cap)

    # Reads: each present instance of v finds exactly one held instance of each input u.
    cover: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for v in range(n):
        clock.check(METHOD, "building the CP-SAT model (its read literals)")
        for u in costs.preds[v]:
            for j, reader in enumerate(instances[v]):
                choices = []
                for i, source in enumerate(instances[u]):
                    lit = model.new_bool_var(f"cover_{u}_{i}_{v}_{j}")
                    model.add_implication(lit, source.present)
                    model.add(source.start + 1 <= reader.start).only_enforce_if(lit)
                    model.add(reader.start + 1 <= source.stop).only_enforce_if(lit)
                    cover[u, i, v, j] = lit
                    choices.append(lit)
                model.add(sum(choices) == reader.present)

    # Implied: later instances of v read the same or a later instance of u (both are in time order).
    for position, ((u, i, v, j), lit) in enumerate(cover.items()):
        if position % 4096 == 0:
            clock.check(METHOD, "building the CP-SAT model (its implied read order)")
        for earlier in range(i):
            if (u, earlier, v, j + 1) in cover:
                model.add_bool_or([~lit, ~cover[u, earlier, v, j + 1]])

    # Frees: an instance is freed right after its last reader; an output's last instance is held
    # to the end; a non-output sink is freed right after it is computed.
    last: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    readers: dict[tuple[int, int], list] = {}
    for position, ((u, i, v, j), lit) in enumerate(cover.items()):
        if position % 4096 == 0:
            clock.check(METHOD, "building the CP-SAT model (its last readers)")
        final = model.new_bool_var(f"last_{u}_{i}_{v}_{j}")
        model.add_implication(final, lit)
        model.add(instances[u][i].stop == instances[v][j].start + 1).only_enforce_if(final)
        last[u, i, v, j] = final
        readers.setdefault((u, i), []).append(final)
    for u, row in enumerate(instances):
        for i, inst in enumerate(row):
            finals = readers.get((u, i), [])
            if costs.output[u]:
                # the last present instance is held to the end; the others end at a last reader
                following = [row[i + 1].present] if i + 1 < len(row) else []
                model.add(inst.stop == steps).only_enforce_if([inst.present] + [~f for f in following])
                if finals:
                    model.add(sum(finals) == sum(following))
            elif finals:
                model.add(sum(finals) == inst.present)
            else:
                model.add(inst.stop == inst.start + 1)

    # Redundant: a computation comes after the first instance of each input; a node's first
    # instance leaves room for the first instances of its descendants.
    for v in range(n):
        for u in costs.preds[v]:
            for inst in instances[v]:
                model.add(inst.start >= instances[u][0].start + 1)
        model.add(instances[v][0].start + descendants[v] + 1 <= steps)

    # Objective: total compute cost (phase 2) or the memory capacity (phase 1).
    if cost_units is not None:
        total = sum(cost_units[v] * inst.present for v, row in enumerate(instances) for inst in row if cost_units[v])
        if cost_floor > 0:  # a bound valid for every schedule: it cuts none, and ends the search sooner
            model.add(total >= cost_floor)
        model.minimize(total)
    else:
        model.minimize(cap)
    return RetentionModel(model, instances, cover, last, steps, cap, capacity[0], horizon)


# -- hints and solutions ------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """A compute order as the model's values: instance numbers, stops, covers, last readers."""

    starts: dict  # (node, instance) -> step
    stops: dict  # (node, instance) -> stop
    covers: frozenset  # (u, i, v, j)
    lasts: frozenset  # (u, i, v, j)
    peak_units: int


def place(costs: NodeCosts, memory: MemoryScale, computes: Sequence[int]) -> Placement:
    seen = [0] * costs.n
    live: dict[int, int] = {}
    starts: dict[tuple[int, int], int] = {}
    stops: dict[tuple[int, int], int] = {}
    last_reader: dict[tuple[int, int], tuple[int, int]] = {}
    covers = set()
    for t, v in enumerate(computes):
        j = seen[v]
        seen[v] += 1
        for u in costs.preds[v]:
            covers.add((u, live[u], v, j))
            last_reader[u, live[u]] = (v, j)
            stops[u, live[u]] = t + 1
        live[v] = j
        starts[v, j] = t
        stops[v, j] = t + 1
    for v, j in live.items():
        if costs.output[v]:
            stops[v, j] = len(computes)
            last_reader.pop((v, j), None)
    lasts = frozenset((u, i, v, j) for (u, i), (v, j) in last_reader.items())
    usage = [0] * len(computes)
    for (v, j), t in starts.items():
        for s in range(t, stops[v, j]):
            usage[s] += memory.mem[v]
        usage[t] += memory.workspace[v]
    return Placement(starts, stops, frozenset(covers), lasts, max(usage, default=0))


def add_hint(rm: RetentionModel, costs: NodeCosts, memory: MemoryScale, computes: Sequence[int]) -> None:
    """Hint every variable: a complete, feasible hint lets CP-SAT start from this schedule."""
    p = place(costs, memory, computes)
    model = rm.model
    for v, row in enumerate(rm.instances):
        for k, inst in enumerate(row):
            start, stop = (p.starts[v, k], p.stops[v, k]) if (v, k) in p.starts else (rm.horizon - 1, rm.horizon)
            model.add_hint(inst.present, (v, k) in p.starts)
            model.add_hint(inst.start, start)
            model.add_hint(inst.stop, stop)
            model.add_hint(inst.size, stop - start)
    for key, lit in rm.cover.items():
        model.add_hint(lit, key in p.covers)
    for key, lit in rm.last.items():
        model.add_hint(lit, key in p.lasts)
    model.add_hint(rm.steps, len(computes))
    if not isinstance(rm.capacity, int):
        model.add_hint(rm.capacity, max(p.peak_units, rm.capacity_low))


def fits(counts: Counts, computes: Sequence[int]) -> bool:
    return all(c <= limit for c, limit in zip(counts_of(len(counts.counts), computes), counts.counts))


def read_computes(values, rm: RetentionModel) -> list[int]:
    """The compute order of a solution (``values``: the solver or a solution callback)."""
    events = [(values.value(inst.start), v) for v, row in enumerate(rm.instances) for inst in row
              if values.boolean_value(inst.present)]
    return [v for _, v in sorted(events)]


@dataclass
class Outcome:
    status: str  # CP-SAT's status name, or "RESTART" when stopped to rebuild smaller
    computes: list[int] | None
    bound: float | None  # proven lower bound on the objective (model units)


class _Watcher(cp_model.CpSolverSolutionCallback if cp_model else object):
    """Keeps the last solution and stops the search when ``restart(objective, computes)`` says so."""

    def __init__(self, rm: RetentionModel, restart: Callable[[float, list[int]], bool] | None):
        super().__init__()
        self.rm, self.restart = rm, restart
        self.computes: list[int] | None = None
        self.stopped = False

    def on_solution_callback(self) -> None:
        self.computes = read_computes(self, self.rm)
        if self.restart is not None and self.restart(self.objective_value, self.computes):
            self.stopped = True
            self.stop_search()


def solve_interruptibly(solver: "cp_model.CpSolver", model: "cp_model.CpModel",
                        callback: "cp_model.CpSolverSolutionCallback") -> int:
    """``solver.solve(model, callback)``, with Ctrl-C (SIGINT) raising ``KeyboardInterrupt`` here.

    By default CP-SAT catches SIGINT during a solve (``catch_sigint_signal``) and ends the search
    as if its time were up: a Ctrl-C came back as a cut-short result, planned and written as if
    nothing had happened (issue 17). So the parameter is off, and the solve runs in a worker thread
    while the calling thread waits on it in short joins: a signal then reaches Python's own handler,
    whose ``KeyboardInterrupt`` stops the search (``stop_search`` is thread-safe), waits for the
    worker, and propagates.
    """
    solver.parameters.catch_sigint_signal = False
    result: dict = {}

    def work() -> None:
        try:
            result["code"] = solver.solve(model, callback)
        except BaseException as error:  # noqa: BLE001 - handed to the calling thread below
            result["error"] = error

    worker = threading.Thread(target=work, name="cpsat-solve", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)  # short joins: a pending signal is handled between them
    except KeyboardInterrupt:
        solver.stop_search()
        worker.join()
        raise
    if "error" in result:
        raise result["error"]
    return result["code"]


def run_solver(rm: RetentionModel, time_limit: float | None, workers: int,
               restart: Callable[[float, list[int]], bool] | None = None) -> Outcome:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    for name, value in SOLVER_PARAMETERS.items():
        setattr(solver.parameters, name, value)
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    watcher = _Watcher(rm, restart)
    code = solve_interruptibly(solver, rm.model, watcher)
    name = "RESTART" if watcher.stopped else solver.status_name(code)
    found = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    LOG.debug("cp-sat: horizon %d, %s after %.2f s, objective %s, bound %s", rm.horizon, name,
              solver.wall_time, solver.objective_value if found else None,
              solver.best_objective_bound if found else None)
    if code == cp_model.MODEL_INVALID:  # a bug in build_model, never a user's error
        raise AssertionError(f"cpsat: CP-SAT rejected the model: {rm.model.validate()}")
    if not found:
        return Outcome(name, None, None)
    return Outcome(name, read_computes(solver, rm) if not watcher.stopped else watcher.computes,
                   solver.best_objective_bound)


# -- the method ---------------------------------------------------------------------------------
@dataclass
class Known:
    """The best schedule known so far."""

    best: Checked | None = None

    @property
    def cost(self) -> float:
        return math.inf if self.best is None else self.best.simulation.compute_cost

    @property
    def computes(self) -> list[int] | None:
        return None if self.best is None else self.best.computes

    def offer(self, candidate: Checked) -> None:
        if self.best is None or candidate.simulation.compute_cost < self.cost - 1e-12 * max(1.0, self.cost):
            self.best = candidate


def bound_seconds(clock: Clock) -> float:
    """Seconds for one backward bound or heuristic: at most BOUND_SECONDS, a tenth of what is left."""
    left = clock.left()
    return BOUND_SECONDS if left is None else max(0.01, min(BOUND_SECONDS, 0.1 * left))


@dataclass(frozen=True)
class Checked:
    """A compute order (node positions, unread recomputations dropped), its schedule with the
    frees of ``schedule_from_computes``, and what ``simulate`` says of it."""

    computes: list[int]
    schedule: Schedule
    simulation: Simulation


def essential_computes(costs: NodeCosts, computes: Sequence[int]) -> list[int]:
    """Drop the computations nobody reads (rule 1 of the module doc), the first one of a node
    included, as long as another computation of the node remains, and keeping the last computation
    of an output. Cost and memory only go down; the model's dominance constraints need this form."""
    computes = list(computes)
    while True:
        read = [False] * len(computes)
        live: dict[int, int] = {}
        last: dict[int, int] = {}
        total = counts_of(costs.n, computes)
        for position, v in enumerate(computes):
            for u in costs.preds[v]:
                read[live[u]] = True
            live[v] = last[v] = position
        drop = set()
        for position, v in enumerate(computes):
            final = last[v] == position
            if not read[position] and not (final and costs.output[v]) and total[v] > 1:
                drop.add(position)
                total[v] -= 1
        if not drop:
            return computes
        computes = [v for position, v in enumerate(computes) if position not in drop]


def checked(graph, costs: NodeCosts, computes: Sequence[int], budget: int | None) -> Checked:
    """Anything ``simulate`` rejects (or finds over the budget) is a bug in this module: raise."""
    order = [costs.order[v] for v in essential_computes(costs, computes)]
    schedule = schedule_from_computes(graph, order)
    outcome = simulate(graph, schedule)
    if not outcome.valid or (budget is not None and outcome.peak_bytes > budget):
        problem = outcome.error if not outcome.valid else f"peak {outcome.peak_bytes} > budget {budget}"
        raise AssertionError(f"cpsat: a model solution fails the simulator ({problem}); this is a bug")
    return Checked([costs.index[v] for v in order], schedule, outcome)


def heuristic_schedules(graph, budget: int, clock: Clock) -> list[Schedule]:
    """Schedules of the quick methods within the budget (hints). A method that is infeasible, out
    of time or unavailable gives none (:func:`solvers.options.schedule_from`); any other failure
    is a bug in it and propagates."""
    found = []
    for method in HEURISTIC_METHODS:
        if clock.expired():
            break
        schedule = schedule_from(graph, budget, method, clock.share(0.1))
        if schedule is not None:
            found.append(schedule)
    return found


class _Evicting:
    """State of :func:`evicting_order`: held results, their bytes, and results that must stay."""

    def __init__(self, costs: NodeCosts, budget: int):
        self.costs, self.budget = costs, budget
        self.held: set[int] = set()
        self.bytes = 0
        self.protected: dict[int, int] = {}  # inputs of computations waiting for other inputs
        self.order: list[int] = []
        self.position = 0  # the node of the topological order being computed

    def next_use(self, u: int) -> int:
        """When ``u`` is read next: its next successor in topological order (they are sorted); the
        end for an output; never (2n) otherwise."""
        readers = self.costs.succs[u]
        at = bisect.bisect_left(readers, self.position)
        if at < len(readers):
            return readers[at]
        return self.costs.n if self.costs.output[u] else 2 * self.costs.n

    def compute(self, x: int) -> bool:
        """Compute ``x`` (its inputs are held), first evicting the results read furthest ahead."""
        costs = self.costs
        if self.bytes + costs.mem[x] + costs.workspace[x] > self.budget:
            victims = sorted((u for u in self.held if not self.protected.get(u) and not costs.pinned[u]
                              and u not in costs.preds[x]),
                             key=lambda u: (self.next_use(u), costs.mem[u]))
            while self.bytes + costs.mem[x] + costs.workspace[x] > self.budget:
                if not victims:
                    return False
                victim = victims.pop()  # read furthest ahead (the largest on ties)
                self.held.discard(victim)
                self.bytes -= costs.mem[victim]
        self.order.append(x)
        self.held.add(x)
        self.bytes += costs.mem[x]
        return True

    def ensure(self, target: int) -> bool:
        """Hold ``target``, recomputing its missing inputs recursively."""
        stack = [(target, False)]
        while stack:
            x, ready = stack.pop()
            if ready:
                for u in self.costs.preds[x]:
                    self.protected[u] -= 1
                if x not in self.held and not self.compute(x):
                    return False
                continue
            if x in self.held:
                continue
            stack.append((x, True))
            for u in self.costs.preds[x]:
                self.protected[u] = self.protected.get(u, 0) + 1
            stack.extend((u, False) for u in self.costs.preds[x] if u not in self.held)
        return True


def evicting_order(costs: NodeCosts, budget: int) -> list[int] | None:
    """A compute order within ``budget`` (a hint): the nodes in topological order, a missing input
    recomputed when needed, and, when memory runs out, the result read furthest ahead evicted
    (Belady's rule). ``None`` when it gets stuck."""
    state = _Evicting(costs, budget)
    for target in range(costs.n):
        state.position = target
        if not state.ensure(target):
            return None
    state.position = costs.n
    for v in range(costs.n):  # outputs evicted on the way are computed again, then kept
        if costs.output[v]:
            if not state.ensure(v):
                return None
            state.protected[v] = state.protected.get(v, 0) + 1
    return state.order


def demand_order(costs: NodeCosts, keep: Sequence[bool]) -> list[int]:
    """A compute order: the nodes in topological order, a missing input recomputed (recursively)
    when needed; after each node, the results not in ``keep`` are dropped."""
    held: set[int] = set()
    order: list[int] = []
    for target in range(costs.n):
        stack = [(target, False)]
        while stack:  # post-order: the inputs of x, then x
            x, ready = stack.pop()
            if x in held:
                continue
            if ready:
                order.append(x)
                held.add(x)
                continue
            stack.append((x, True))
            stack.extend((u, False) for u in costs.preds[x] if u not in held)
        held = {x for x in held if keep[x] or x == target}
    return order


def recompute_seconds(costs: NodeCosts, keep: Sequence[bool], v: int) -> float:
    """Seconds to recompute ``v`` from kept results: it and its ancestors up to kept ones."""
    seen, stack, total = {v}, [v], 0.0
    while stack:
        x = stack.pop()
        total += costs.cost[x]
        for u in costs.preds[x]:
            if not keep[u] and u not in seen:
                seen.add(u)
                stack.append(u)
    return total


def keeping_order(graph, costs: NodeCosts, budget: int, seconds: float = 2.0) -> list[int] | None:
    """A compute order within ``budget`` (a hint): from keeping every result, stop keeping the
    results held at the peak with the most bytes per second of recomputation, until it fits."""
    keep = [True] * costs.n
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        order = demand_order(costs, keep)
        schedule = schedule_from_computes(graph, [costs.order[v] for v in order])
        outcome = simulate(graph, schedule)
        if outcome.peak_bytes <= budget:
            return order
        held: set = set()
        for kind, node in schedule.steps[: outcome.peak_step]:
            (held.add if kind == "compute" else held.discard)(node)
        candidates = [costs.index[x] for x in held]
        candidates = [v for v in candidates if keep[v] and not costs.output[v] and costs.mem[v] > 0]
        if not candidates:
            return None
        candidates.sort(key=lambda v: costs.mem[v] / (recompute_seconds(costs, keep, v) + 1e-12), reverse=True)
        for v in candidates[: max(1, len(candidates) // 4)]:
            keep[v] = False
    return None


def greedy_schedules(graph, costs: NodeCosts, budget: int, seconds: float) -> list[Checked]:
    """The schedules of the two heuristics above that fit (hints; none is needed)."""
    found = []
    for order in (evicting_order(costs, budget), keeping_order(graph, costs, budget, seconds)):
        if order is None:
            continue
        try:
            found.append(checked(graph, costs, order, budget))
        except (AssertionError, ValueError) as error:  # a hint only: never fail the solver for it
            LOG.debug("cpsat: a heuristic order is unusable: %s", error)
    return found


@dataclass(frozen=True)
class PeakResult:
    computes: list[int]
    peak: int  # bytes, simulated
    lower: int  # bytes: no schedule peaks lower
    finished: bool  # CP-SAT finished (not stopped by the time limit)
    counts: Counts


def low_peak_schedule(graph, costs: NodeCosts, low: int, high: int, seconds: float = 2.0) -> Checked | None:
    """The lowest-peak schedule :func:`evicting_order` finds, by bisection of its budget."""
    best = None
    deadline = time.perf_counter() + seconds
    while low <= high and time.perf_counter() < deadline:
        middle = (low + high) // 2
        order = evicting_order(costs, middle)
        if order is None:
            low = middle + 1
            continue
        found = checked(graph, costs, order, middle)
        if best is None or found.simulation.peak_bytes < best.simulation.peak_bytes:
            best = found
        high = found.simulation.peak_bytes - 1
    return best


def exact_min_peak(graph, costs: NodeCosts, clock: Clock) -> Checked | None:
    """A minimum-peak schedule by exhaustive search on small graphs (its peak is proven minimal), or
    None when the graph is too large or the search runs out of its share of the time."""
    if costs.n > EXACT_PEAK_MAX_NODES:
        return None
    try:
        schedule = exhaustive.min_peak_schedule(graph, clock.share(EXACT_PEAK_TIME_SHARE))
    except TimeoutError:
        return None
    return checked(graph, costs, [costs.index[v] for v in schedule.computes()], None)


def min_peak_phase(graph, costs: NodeCosts, memory: MemoryScale, budget: int, lower: int,
                   store_all: Checked, shortcut: Checked | None, clock: Clock, workers: int, hard_cap: int,
                   horizon_limit: int) -> PeakResult:
    """Phase 1: the least peak, floored at the budget (it stops once the budget is met), from the
    store-all schedule. No schedule peaks below ``lower`` bytes; a ``shortcut`` schedule (of a
    heuristic) that peaks at most at the budget or at ``lower`` makes the search unnecessary. (As
    a hint it is worse than store-all: measured, it leads CP-SAT's search astray.)"""
    target = max(budget, lower)
    caps = [min(hard_cap, uniform_cap(costs, None, horizon_limit, []))] * costs.n
    counts = interval_counts(costs, caps, None)
    if shortcut is not None and shortcut.simulation.peak_bytes <= target:
        return PeakResult(shortcut.computes, shortcut.simulation.peak_bytes, lower, True, counts)
    low = max(memory.capacity(budget), memory.units_at_least(lower))
    high = max(low, memory.units_at_least(store_all.simulation.peak_bytes))
    try:
        rm = build_model(costs, counts, memory, (low, high), None, clock=clock)
    except SolverTimeout:  # no search: what the heuristics found stands, unproven
        outcome = Outcome("BUILD_TIMEOUT", None, None)
    else:
        add_hint(rm, costs, memory, store_all.computes)
        outcome = run_solver(rm, clock.share(PHASE1_TIME_SHARE), workers)
    found = checked(graph, costs, outcome.computes, None) if outcome.computes is not None else store_all
    if shortcut is not None and shortcut.simulation.peak_bytes < found.simulation.peak_bytes:
        found = shortcut
    peak = found.simulation.peak_bytes
    # Optimal over uncapped, exact counts: no schedule peaks below min(peak, budget + 1).
    exact = outcome.status == "OPTIMAL" and not any(counts.capped) and memory.exact
    proven = peak if exact and peak > budget else lower
    return PeakResult(found.computes, peak, min(proven, peak), outcome.status == "OPTIMAL", counts)


def raise_infeasible(budget: int, result: PeakResult, clock: Clock) -> None:
    """Phase 1 did not reach the budget: :class:`Infeasible` with the least budget when it is
    proven (over every schedule, or over the model's capped counts), else :class:`SolverTimeout`:
    an unproven minimum must not be reported as the least budget (issue 17)."""
    peak, lower = result.peak, result.lower
    if peak <= lower:
        detail = f"the smallest peak of any schedule is {peak} bytes"
    elif not result.finished:
        out_of_reach = (f"every schedule peaks at {lower} bytes or more, so {budget} bytes is out of reach, but "
                        if lower > budget else f"no schedule within {budget} bytes was found and ")
        raise SolverTimeout(
            f"cpsat: {out_of_reach}the least budget was not proven within the time limit of {clock.limit:g} s "
            f"(the smallest peak found is {peak} bytes; every schedule needs at least {lower} bytes)", method=METHOD)
    else:
        detail = (f"with up to {result.counts.largest} intervals per node the smallest peak is {peak} bytes "
                  f"(not proven minimal over all schedules; every schedule needs at least {lower} bytes)")
    raise Infeasible(f"no schedule fits in {budget} bytes: {detail}", min_budget=peak, method=METHOD)


def solve_cpsat(graph, budget: int, time_limit: float | None = None, *, workers: int | None = None,
                hints: bool = True, max_intervals: int | None = None) -> Schedule:
    """The cheapest schedule of ``graph`` whose peak fits ``budget`` bytes, over all orders.

    ``time_limit`` (seconds; default :data:`solvers.options.DEFAULT_TIME_LIMIT`) bounds the whole
    call, building the models included; ``workers`` is CP-SAT's thread count (default:
    every core); ``hints`` seeds CP-SAT with the best schedule of the quick methods (``store-all``,
    ``chen-greedy``, ``dp``, whichever exist); ``max_intervals`` caps the instances of a node (the
    status is then ``optimal`` only if the module doc's argument shows the cap excludes nothing).
    Raises :class:`Infeasible` (with the minimum budget) when no schedule fits and that minimum is
    proven (over every schedule, or over the capped counts, as the message says), and
    :class:`SolverTimeout` when the time limit passes before a schedule within the budget or the
    minimum is found. Ctrl-C during a CP-SAT search raises ``KeyboardInterrupt``
    (:func:`solve_interruptibly`).
    """
    if cp_model is None:
        raise SolverUnavailable("the cpsat method needs OR-tools: pip install ortools")
    if max_intervals is not None and max_intervals < 1:
        raise ValueError(f"max_intervals must be at least 1, got {max_intervals!r}")
    clock = Clock(time_limit_or_default(time_limit))
    workers = workers or os.cpu_count() or 1
    costs = node_costs(graph)
    base = total_cost(graph)
    n = costs.n
    hard_cap = max_intervals or COUNT_CEILING

    def finish(schedule: Schedule, sim: Simulation, status: str, lower: float, message: str) -> Schedule:
        cost = sim.compute_cost
        lower = min(lower, cost)
        gap = 0.0 if cost <= 0 else max(0.0, (cost - lower) / cost)
        if status == "optimal" or gap <= OPTIMALITY_TOLERANCE:
            status = "optimal"
        return schedule.with_info(method=METHOD, status=status, gap=gap, lower_bound=lower,
                                  solve_seconds=time.perf_counter() - clock.started, budget_bytes=budget,
                                  predicted_peak_bytes=sim.peak_bytes, compute_cost=cost, message=message)

    # Store-all fits: nothing is recomputed, which no schedule beats.
    store_all = checked(graph, costs, range(n), None)
    if store_all.simulation.peak_bytes <= budget:
        return finish(store_all.schedule, store_all.simulation, "optimal", base, "store-all fits the budget")

    horizon_limit = max(FIRST_HORIZON_PER_NODE * n, FIRST_HORIZON_MIN)
    memory = scale_memory(costs, MAX_HORIZON_PER_NODE * max(n, 1))
    lower_peak = Backward(costs, seconds=bound_seconds(clock)).peak()
    known = Known()
    if hints and lower_peak <= budget:
        for schedule in heuristic_schedules(graph, budget, clock):
            known.offer(checked(graph, costs, [costs.index[v] for v in schedule.computes()], budget))
        for candidate in greedy_schedules(graph, costs, budget, bound_seconds(clock)):
            known.offer(candidate)

    # Phase 1 when nothing known fits: it proves the budget infeasible or finds a first schedule.
    if known.computes is None:
        shortcut = None
        if hints:
            exact = exact_min_peak(graph, costs, clock)
            if exact is not None:  # the true minimum peak, and a schedule that meets it
                lower_peak = max(lower_peak, exact.simulation.peak_bytes)
                shortcut = exact
            else:
                shortcut = low_peak_schedule(graph, costs, max(budget, lower_peak), store_all.simulation.peak_bytes,
                                             bound_seconds(clock))
        result = min_peak_phase(graph, costs, memory, budget, lower_peak, store_all, shortcut, clock, workers,
                                hard_cap, horizon_limit)
        if result.peak > budget:
            raise_infeasible(budget, result, clock)
        known.offer(checked(graph, costs, result.computes, budget))

    return finish(*cost_phase(graph, costs, memory, budget, known, clock, workers, hard_cap, horizon_limit))


def cost_phase(graph, costs: NodeCosts, memory: MemoryScale, budget: int, known: Known, clock: Clock,
               workers: int, hard_cap: int, horizon_limit: int) -> tuple[Schedule, Simulation, str, float, str]:
    """Phase 2: the least cost within the budget. Raises capped counts while they may hide a better
    schedule, and restarts smaller when a better schedule shrinks the counts (rule 3)."""
    n, base = costs.n, float(sum(costs.cost))
    cost_scale = scale_costs(costs.cost, MAX_HORIZON_PER_NODE * max(n, 1))
    floor_units = Backward(costs, seconds=bound_seconds(clock)).cost(budget, cost_scale.units)
    if math.isinf(floor_units):  # no schedule fits, yet one is known: a bug in the bound
        raise AssertionError("cpsat: the backward cost bound says no schedule fits the budget")
    floor = max(base, cost_scale.seconds(floor_units))  # units are rounded down: a valid bound
    def hinted() -> list[int]:  # the best schedule's counts, which the model must admit if allowed
        return [min(c, hard_cap) for c in counts_of(n, known.computes)]

    caps = [min(hard_cap, uniform_cap(costs, known.cost - base, horizon_limit, hinted()))] * n
    lower, counts, status = floor, None, "UNSOLVED"

    def proven(bound: float) -> bool:
        return bound >= known.cost * (1 - OPTIMALITY_TOLERANCE)

    for _ in range(64):  # a guard: each round raises caps or shrinks the model
        if proven(lower) or clock.expired():
            break
        spare = known.cost - base
        counts = interval_counts(costs, caps, spare, hinted())
        try:
            rm = build_model(costs, counts, memory, (memory.capacity(budget),) * 2, cost_scale.units,
                             max_computations(costs, spare), int(floor_units), clock=clock)
        except SolverTimeout:
            status = "BUILD_TIMEOUT"  # the best schedule known stands, with the bound so far
            break
        if fits(counts, known.computes):
            add_hint(rm, costs, memory, known.computes)

        def restart(objective: float, computes: list[int], horizon: int = counts.horizon,
                    best: float = known.cost) -> bool:
            # only a trigger: the next round recomputes the counts from the simulated cost
            spare = cost_scale.seconds(objective) - base
            if spare >= best - base - 1e-9 * max(1.0, best):
                return False
            return interval_counts(costs, caps, spare, counts_of(n, computes)).horizon <= RESTART_SHRINK * horizon

        outcome = run_solver(rm, clock.left(), workers, restart)
        status = outcome.status
        if outcome.computes is not None:
            known.offer(checked(graph, costs, outcome.computes, budget))
        if status == "RESTART":
            continue
        # the model's bound holds for all schedules only if no size was rounded up
        model_bound = cost_scale.seconds(outcome.bound) if outcome.bound is not None and memory.exact else base
        lower = max(floor, min(model_bound, capped_lower_bound(costs, counts, base)))
        binding = [v for v in range(n) if counts.capped[v] and not proven(base + counts.counts[v] * costs.cost[v])]
        if status != "OPTIMAL" or not binding:
            break
        raised = list(caps)
        for v in binding:
            raised[v] = min(hard_cap, counts.counts[v] + 1)
        trial = interval_counts(costs, raised, spare, hinted())
        if trial.counts == counts.counts or trial.horizon > MAX_HORIZON_PER_NODE * n:
            break
        caps = raised

    notes = []
    if not proven(lower):
        if counts is not None and any(counts.capped):
            notes.append(f"optimal with up to {counts.largest} intervals per node" if status == "OPTIMAL"
                         else f"searched with up to {counts.largest} intervals per node")
        if status == "BUILD_TIMEOUT":
            notes.append("the time limit passed while building the CP-SAT model: the best schedule known stands")
        elif status not in ("OPTIMAL", "INFEASIBLE"):
            notes.append("time limit reached before optimality was proven")
        if not memory.exact:
            notes.append("sizes were rounded up to fit CP-SAT's integers, so only the trivial bound holds")
        if not cost_scale.exact:
            notes.append("costs were rounded down to integers for CP-SAT; the gap includes the rounding")
    return known.best.schedule, known.best.simulation, "feasible", lower, "; ".join(notes)
