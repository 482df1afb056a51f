"""Solving a :class:`~solvers.ilp.model.CheckmateModel` with HiGHS (through highspy, loaded in bulk)
or CBC: the outcome in the model's units, with the time limit charged for loading and read-back."""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from ..errors import SolverTimeout, SolverUnavailable
from .model import CheckmateModel

LOG = logging.getLogger(__name__)

BACKENDS = ("highs", "cbc")
# HiGHS stops some time after its time_limit (an LP of 106,652 columns and 180,145 rows, the
# 201-node training graph with 10 skips: 2.0 s run against a 0.9 s limit), and PuLP then reads
# the solution back (0.6 s there): ~1.7 s for 286,797 entries, so this many seconds per column
# and row are taken off the limit HiGHS is given (at most half of what is left).
HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY = 6e-6


@dataclass
class Outcome:
    """What a backend run says, in the model's normalised objective units (constant included)."""

    has_solution: bool
    optimal: bool
    infeasible: bool
    stopped: bool = False  # a time (or other) limit ended the search before it concluded
    objective: float | None = None
    bound: float | None = None
    values: dict = field(default_factory=dict)

def _cbc(**options):
    """PuLP's bundled CBC (``PULP_CBC_CMD``), or ``COIN_CMD`` (a ``cbc`` on the PATH) where PuLP
    no longer bundles it. PuLP 3.3 marks ``PULP_CBC_CMD`` deprecated: the warning is silenced,
    since the bundled binary is what works here."""
    import warnings

    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(pulp, "PULP_CBC_CMD"):
            return pulp.PULP_CBC_CMD(**options)
        return pulp.COIN_CMD(**options)

def check_backend(backend: str) -> None:
    """ValueError for an unknown backend, SolverUnavailable for a missing one."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown ILP backend {backend!r}; accepted: {', '.join(BACKENDS)}")
    import importlib
    import importlib.util

    if importlib.util.find_spec("pulp") is None:
        raise SolverUnavailable("the ilp method needs PuLP (pip install pulp)")
    if backend == "highs":
        try:
            if importlib.util.find_spec("highspy") is None:
                raise ImportError("No module named 'highspy'")
            importlib.import_module("highspy")
        except ImportError as error:
            raise SolverUnavailable(f"the 'highs' backend needs highspy (pip install highspy; {error}); "
                                    "or use backend='cbc'") from error
    elif not _cbc(msg=False).available():
        raise SolverUnavailable("the 'cbc' backend needs PuLP's bundled CBC, which is not available here; "
                                "or use backend='highs'")

def run_interruptibly(highs) -> None:
    """``highs.run()``, with Ctrl-C (SIGINT) raising ``KeyboardInterrupt`` here within a tenth of
    a second, the solve stopped first.

    HiGHS's own run holds the calling thread until it ends: a Ctrl-C waited for the end of the run
    (the time limit of a MILP: minutes). highspy's ``HandleKeyboardInterrupt`` stops it, but
    swallows the interrupt (it prints and returns the cut-short result, and exits the process at
    the fifth). So the solve runs in highspy's worker thread with its user-interrupt callbacks on
    (measured: no change in CPU time on a 81-node MILP, 13.0 s either way), this thread waits in
    short steps, and on ``KeyboardInterrupt`` cancels the solve, waits for it, and re-raises.
    """
    highs.HandleUserInterrupt = True
    worker = highs.startSolve()
    try:
        finished = False
        while not finished:
            finished, _status = highs.wait(0.1)
    except KeyboardInterrupt:
        highs.cancelSolve()
        worker.join()
        raise


def _highs_solver(ends_at: float | None, threads, warm: dict | None, relax: bool, gap_abs: float | None,
                  target: float | None, rows: list):
    """PuLP's HiGHS solver for one run: ``ends_at`` (a ``time.perf_counter`` reading) ends it,
    loading included; ``rows`` are the problem's constraints in the order they were added (the
    model keeps them, so PuLP's private ``_constraints`` is not needed)."""
    import highspy
    import numpy as np
    import pulp

    class FastHighs(pulp.HiGHS):
        """PuLP's HiGHS (through highspy), loading the model in bulk and with a MIP start.

        PuLP's own loader adds one column, one integrality change and one row per call (seconds on
        a 45-node graph's 10^4 rows); here the columns, rows and integrality go in three calls.

        PuLP's ``HiGHS`` class has no ``warmStart`` option (only ``HiGHS_CMD`` does, and it needs
        the ``highs`` executable), so the start goes to highspy's ``setSolution`` between loading
        the model and running it. HiGHS checks it ("MIP start solution is feasible, objective value
        is ..." in its log) and takes it as the first incumbent: with a time limit too short to
        find anything else, the start comes back as the solution (tests/test_ilp.py checks this).
        An infeasible start is silently dropped, which is why :func:`_check_values` guards it.
        """

        def buildSolverModel(self, lp):
            # Loading a model of 10^5-10^6 rows takes seconds: it is charged to the time limit.
            def check(doing: str) -> None:
                if ends_at is not None and time.perf_counter() > ends_at:
                    raise SolverTimeout(f"ilp: the time limit passed while {doing}", method="ilp")

            solver = lp.solverModel
            variables = lp.variables()
            for position, var in enumerate(variables):
                var.index = position
            objective = lp.objective
            infinity = highspy.kHighsInf
            solver.addCols(
                len(variables),
                np.array([objective.get(var, 0.0) for var in variables], dtype=np.float64),
                np.array([-infinity if var.lowBound is None else var.lowBound for var in variables], dtype=np.float64),
                np.array([infinity if var.upBound is None else var.upBound for var in variables], dtype=np.float64),
                0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64))
            starts, indices, values, lower, upper = [], [], [], [], []
            for position, row in enumerate(rows):  # the problem's own constraints, in its order
                if position % 4096 == 0:
                    check("loading the model into HiGHS")
                row.index = position
                starts.append(len(indices))
                for var, coefficient in row.items():
                    indices.append(var.index)
                    values.append(coefficient)
                low, high = row.getLb(), row.getUb()
                lower.append(-infinity if low is None else low)
                upper.append(infinity if high is None else high)
            solver.addRows(len(starts), np.array(lower, dtype=np.float64), np.array(upper, dtype=np.float64),
                           len(indices), np.array(starts, dtype=np.int32), np.array(indices, dtype=np.int32),
                           np.array(values, dtype=np.float64))
            integers = [var.index for var in variables if var.cat == pulp.LpInteger]
            if self.mip and integers:
                solver.changeColsIntegrality(len(integers), np.array(integers, dtype=np.int32),
                                             np.full(len(integers), int(highspy.HighsVarType.kInteger), dtype=np.uint8))

        def callSolver(self, lp):
            if warm:
                variables = lp.variables()
                index = np.array([var.index for var in variables], dtype=np.int32)
                value = np.array([warm.get(var, 0.0) for var in variables], dtype=np.float64)
                lp.solverModel.setSolution(len(index), index, value)
            if threads is not None:
                # HiGHS keeps one thread pool per process, sized by the first run; a run asking
                # for another size fails ("global scheduler has already been initialized")
                # unless the pool is rebuilt first. Rebuilding it for every run that names a
                # size costs milliseconds and keeps no record of the pool in this module.
                highspy.Highs.resetGlobalScheduler(True)
            if ends_at is not None:  # what loading left of the limit, less what ends the run
                left = ends_at - time.perf_counter()
                size = len(lp.variables()) + lp.numConstraints()
                reserve = min(0.5 * left, HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY * size)
                lp.solverModel.setOptionValue("time_limit", max(0.01, left - reserve))
            run_interruptibly(lp.solverModel)

    options = {}
    if gap_abs is not None:
        options["mip_abs_gap"] = gap_abs
    if target is not None:
        options["objective_target"] = target
    return FastHighs(mip=not relax, msg=False, threads=threads, **options)

def _run_highs(model: CheckmateModel, time_limit, threads, warm, relax, gap_abs, target=None) -> Outcome:
    import highspy
    import pulp

    problem = model.problem
    ends_at = None if time_limit is None else time.perf_counter() + time_limit
    problem.solve(_highs_solver(ends_at, threads, warm, relax, gap_abs, target, model.rows))
    highs = problem.solverModel
    status = highs.getModelStatus()
    info = highs.getInfo()
    kinds = highspy.HighsModelStatus
    infeasible = status in (kinds.kInfeasible, kinds.kUnboundedOrInfeasible)
    has_solution = not infeasible and info.primal_solution_status == 2  # kSolutionStatusFeasible
    stopped = status in (kinds.kTimeLimit, kinds.kIterationLimit, kinds.kSolutionLimit, kinds.kInterrupt,
                         kinds.kObjectiveTarget, kinds.kObjectiveBound, kinds.kMemoryLimit)
    if not (has_solution or infeasible or stopped or status == kinds.kOptimal):
        raise RuntimeError(f"ilp: HiGHS failed on the model (status {status.name}); run with backend='cbc', "
                           "or check HiGHS's log (e.g. a 'threads' option HiGHS refused)")
    outcome = Outcome(has_solution, status == kinds.kOptimal and has_solution, infeasible, stopped)
    if has_solution:
        outcome.values = {var: var.varValue for var in model.variables}
        outcome.objective = pulp.value(problem.objective)
        # PuLP does not hand the objective's constant to HiGHS: shift HiGHS's bound by the
        # difference between the objective as we evaluate it and as HiGHS reports it.
        offset = outcome.objective - info.objective_function_value
        bound = info.objective_function_value if relax else info.mip_dual_bound
        if bound is not None and math.isfinite(bound):
            outcome.bound = min(bound + offset, outcome.objective)
    return outcome

def _run_cbc(model: CheckmateModel, time_limit, threads, warm, relax, gap_abs) -> Outcome:
    import pulp

    problem = model.problem
    if warm:
        for var in model.variables:
            var.setInitialValue(warm.get(var, 0.0))
    with tempfile.TemporaryDirectory(prefix="ilp-cbc-") as folder:
        log_path = os.path.join(folder, "cbc.log")
        # warmStart=True makes PuLP write the variables' initial values as a CBC MIP start file
        # (-mips); CBC reports "MIPStart values read" and takes it as its first incumbent.
        solver = _cbc(mip=not relax, msg=False, timeLimit=time_limit, threads=threads,
                      warmStart=bool(warm), logPath=log_path, gapAbs=gap_abs)
        problem.solve(solver)
        with open(log_path, errors="replace") as handle:
            log = handle.read()
    infeasible = problem.status == pulp.LpStatusInfeasible
    has_solution = problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    stopped = problem.status == pulp.LpStatusNotSolved  # CBC's "Stopped on time": with or without a solution
    if not (has_solution or infeasible or stopped):
        raise RuntimeError(f"ilp: CBC failed on the model (status {pulp.LpStatus[problem.status]}); "
                           "run with backend='highs'")
    outcome = Outcome(has_solution, problem.sol_status == pulp.LpSolutionOptimal, infeasible, stopped)
    if has_solution:
        outcome.values = {var: var.varValue for var in model.variables}
        outcome.objective = pulp.value(problem.objective)
        if outcome.optimal:
            outcome.bound = outcome.objective
        else:
            # CBC's summary: "Objective value: X" and "Lower bound: Y" (without our constant).
            reported = re.search(r"Objective value:\s*(\S+)", log)
            lower = re.search(r"Lower bound:\s*(\S+)", log)
            try:
                offset = outcome.objective - float(reported.group(1))
                outcome.bound = min(float(lower.group(1)) + offset, outcome.objective)
            except (AttributeError, ValueError):
                outcome.bound = None
    return outcome

def run_backend(model: CheckmateModel, backend: str, time_limit: float | None = None, threads: int | None = None,
                warm: dict | None = None, relax: bool = False, gap_abs: float | None = None,
                target: float | None = None) -> Outcome:
    """Solve ``model`` with ``backend`` ("highs" or "cbc"); ``warm`` maps variables to a start.

    ``target`` (HiGHS only): stop at the first solution whose objective is at most this.
    """
    if time_limit is not None:
        time_limit = max(0.01, float(time_limit))
    started = time.perf_counter()
    if backend == "highs":
        outcome = _run_highs(model, time_limit, threads, warm, relax, gap_abs, target)
    else:
        outcome = _run_cbc(model, time_limit, threads, warm, relax, gap_abs)
    LOG.debug("ilp: %s %s in %.1f s: optimal %s, objective %s, bound %s", backend, "LP" if relax else "MILP",
              time.perf_counter() - started, outcome.optimal, outcome.objective, outcome.bound)
    return outcome
