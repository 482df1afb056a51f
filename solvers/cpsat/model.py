"""The retention-interval model on CP-SAT, one function per constraint family
(:mod:`solvers.cpsat` has the formulation)."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

from ..bounds import relatives
from ..clock import Clock
from ..graph import NodeCosts
from .counts import Counts
from .scales import MemoryScale

try:  # OR-tools is a declared dependency, but `import solvers` must work without it
    from ortools.sat.python import cp_model
except ImportError:  # pragma: no cover
    cp_model = None

METHOD = "cpsat"


@dataclass
class Instance:
    present: cp_model.IntVar
    start: cp_model.IntVar
    stop: cp_model.IntVar  # exclusive: held during steps start .. stop-1
    size: cp_model.IntVar
    held: cp_model.IntervalVar  # [start, stop): the retention interval
    step: cp_model.IntervalVar  # [start, start+1): the computation

@dataclass
class RetentionModel:
    model: cp_model.CpModel
    instances: list[list[Instance]]
    cover: dict  # (u, i, v, j) -> literal: instance j of v reads instance i of u
    last: dict  # (u, i, v, j) -> literal: ... and is its last reader
    steps: cp_model.IntVar  # K, the number of computations
    capacity: cp_model.IntVar | int
    capacity_low: int
    horizon: int


def _instances(model: cp_model.CpModel, counts: Counts, ancestors: list[int], clock: Clock) -> list[list[Instance]]:
    """``C_v`` optional instances per node, each a compute step and a retention interval."""
    horizon = counts.horizon
    instances: list[list[Instance]] = []
    for v, count in enumerate(counts.counts):
        clock.check(METHOD, "building the CP-SAT model (its intervals)")
        row = []
        for k in range(count):
            earliest = ancestors[v] + k  # all ancestors come first; instance k is the (k+1)-th
            present = model.new_bool_var(f"present_{v}_{k}")
            start = model.new_int_var(earliest, horizon - 1, f"start_{v}_{k}")
            stop = model.new_int_var(earliest + 1, horizon, f"stop_{v}_{k}")
            size = model.new_int_var(1, horizon - earliest, f"size_{v}_{k}")
            held = model.new_optional_interval_var(start, size, stop, present, f"held_{v}_{k}")
            step = model.new_optional_fixed_size_interval_var(start, 1, present, f"step_{v}_{k}")
            row.append(Instance(present, start, stop, size, held, step))
        instances.append(row)
    return instances


def _presence(model: cp_model.CpModel, instances: list[list[Instance]], horizon: int) -> None:
    """Every node is computed at least once; instances are used in order (symmetry breaking); a
    node is not held when it is recomputed (present instances are disjoint, in time order); absent
    instances are parked at the end, so that the search never branches on them."""
    for row in instances:
        model.add(row[0].present == 1)
        for earlier, later in zip(row, row[1:]):
            model.add_implication(later.present, earlier.present)
    for row in instances:
        for earlier, later in zip(row, row[1:]):
            model.add(earlier.stop <= later.start).only_enforce_if(later.present)
    for row in instances:
        for inst in row[1:]:
            model.add(inst.start == horizon - 1).only_enforce_if(~inst.present)
            model.add(inst.stop == horizon).only_enforce_if(~inst.present)
    for row in instances:
        for inst in row:
            model.add(inst.start + inst.size == inst.stop)


def _one_computation_per_step(model: cp_model.CpModel, instances: list[list[Instance]], steps) -> None:
    """The compute intervals do not overlap, and the K computations fill steps 0..K-1 (no idle
    steps: one assignment per compute order)."""
    model.add_no_overlap([inst.step for row in instances for inst in row])
    model.add(steps == sum(inst.present for row in instances for inst in row))
    for row in instances:
        for inst in row:
            model.add(inst.stop <= steps).only_enforce_if(inst.present)


def _memory(model: cp_model.CpModel, instances: list[list[Instance]], memory: MemoryScale, cap) -> None:
    """One cumulative constraint within the capacity: results held (retention intervals) plus the
    workspace of the computation under way."""
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


def _reads(model: cp_model.CpModel, costs: NodeCosts, instances: list[list[Instance]], clock: Clock) -> dict:
    """Each present instance of v finds exactly one held instance of each input u: the literals
    ``cover[u, i, v, j]``."""
    cover: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for v in range(costs.n):
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
    return cover


def _read_order(model: cp_model.CpModel, cover: dict, clock: Clock) -> None:
    """Implied: later instances of v read the same or a later instance of u (both are in time
    order). The largest family: ~C_u clauses per cover literal."""
    for position, ((u, i, v, j), lit) in enumerate(cover.items()):
        if position % 4096 == 0:
            clock.check(METHOD, "building the CP-SAT model (its implied read order)")
        for earlier in range(i):
            if (u, earlier, v, j + 1) in cover:
                model.add_bool_or([~lit, ~cover[u, earlier, v, j + 1]])


def _frees(model: cp_model.CpModel, costs: NodeCosts, instances: list[list[Instance]], cover: dict, steps,
           clock: Clock) -> dict:
    """An instance is freed right after its last reader; an output's last instance is held to the
    end; a non-output sink is freed right after it is computed. Returns the literals
    ``last[u, i, v, j]`` (instance j of v is the last reader of instance i of u)."""
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
    return last


def _first_instances(model: cp_model.CpModel, costs: NodeCosts, instances: list[list[Instance]],
                     descendants: list[int], steps) -> None:
    """Redundant: a computation comes after the first instance of each input; a node's first
    instance leaves room for the first instances of its descendants."""
    for v in range(costs.n):
        for u in costs.preds[v]:
            for inst in instances[v]:
                model.add(inst.start >= instances[u][0].start + 1)
        model.add(instances[v][0].start + descendants[v] + 1 <= steps)


def _objective(model: cp_model.CpModel, instances: list[list[Instance]], cost_units: Sequence[int] | None,
               cost_floor: int, cap) -> None:
    """Total compute cost (phase 2), at least ``cost_floor`` (a bound valid for every schedule: it
    cuts none, and ends the search sooner), or the memory capacity (phase 1)."""
    if cost_units is None:
        model.minimize(cap)
        return
    total = sum(cost_units[v] * inst.present for v, row in enumerate(instances) for inst in row if cost_units[v])
    if cost_floor > 0:
        model.add(total >= cost_floor)
    model.minimize(total)


def build_model(costs: NodeCosts, counts: Counts, memory: MemoryScale, capacity: tuple[int, int],
                cost_units: Sequence[int] | None, max_steps: int | None = None,
                cost_floor: int = 0, clock: Clock | None = None) -> RetentionModel:
    """The retention-interval model (:mod:`solvers.cpsat`), one function per constraint family, in
    the order the variables and constraints are created. ``capacity`` is the (low, high) range of
    the memory capacity in units, one budget when equal. With ``cost_units`` the objective is the
    cost (at least ``cost_floor``, a proven lower bound), else the capacity.

    Building is Python work that grows with the product of the counts along each edge (on a
    250-node layered DAG, ~1.3M cover literals and ~13M implied clauses, minutes): with a
    ``clock`` it is checked once per node of each family (and every 4096 read literals), and
    :class:`SolverTimeout` raised when the limit passes."""
    clock = clock or Clock(None)
    horizon = counts.horizon
    ancestors, descendants = relatives(costs)
    model = cp_model.CpModel()
    instances = _instances(model, counts, ancestors, clock)
    steps = model.new_int_var(costs.n, max(costs.n, min(horizon, max_steps or horizon)), "steps")
    cap = capacity[0] if capacity[0] == capacity[1] else model.new_int_var(capacity[0], capacity[1], "capacity")
    _presence(model, instances, horizon)
    _one_computation_per_step(model, instances, steps)
    _memory(model, instances, memory, cap)
    cover = _reads(model, costs, instances, clock)
    _read_order(model, cover, clock)
    last = _frees(model, costs, instances, cover, steps, clock)
    _first_instances(model, costs, instances, descendants, steps)
    _objective(model, instances, cost_units, cost_floor, cap)
    return RetentionModel(model, instances, cover, last, steps, cap, capacity[0], horizon)
