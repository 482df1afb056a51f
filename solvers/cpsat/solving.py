"""Hints from a compute order, CP-SAT's run (interruptible by Ctrl-C), and the compute order of
its solution."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from collections.abc import Callable, Sequence

from ..graph import NodeCosts
from .counts import Counts, counts_of
from .model import RetentionModel, cp_model
from .scales import MemoryScale

LOG = logging.getLogger(__name__)
# CP-SAT parameters on top of OR-tools' defaults (num_workers, time limit and seed are set per run).
# Probing at presolve costs more than it saves on these models (measured on the tests' graphs).
SOLVER_PARAMETERS: dict = {"cp_model_probing_level": 0, "max_presolve_iterations": 1}


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

def solve_interruptibly(solver: cp_model.CpSolver, model: cp_model.CpModel,
                        callback: cp_model.CpSolverSolutionCallback) -> int:
    """``solver.solve(model, callback)``, with Ctrl-C (SIGINT) raising ``KeyboardInterrupt`` here.

    By default CP-SAT catches SIGINT during a solve (``catch_sigint_signal``) and ends the search
    as if its time were up: a Ctrl-C came back as a cut-short result, planned and written as if
    nothing had happened. So the parameter is off, and the solve runs in a worker thread
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
