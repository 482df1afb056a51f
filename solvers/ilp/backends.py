"""Solving a :class:`~solvers.ilp.model.CheckmateModel` with HiGHS (its arrays passed to highspy in
one call) or CBC (through PuLP): the outcome in the model's units, with the time limit charged for
loading and read-back."""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from ..errors import SolverTimeout, SolverUnavailable
from .model import CheckmateModel

LOG = logging.getLogger(__name__)

BACKENDS = ("highs", "cbc")
# HiGHS stops some time after its time_limit (an LP of 106,652 columns and 180,145 rows, the
# 201-node training graph with 10 skips: 2.0 s run against a 0.9 s limit; measured when PuLP still
# read the solution back, 0.6 s there): ~1.7 s for 286,797 entries, so this many seconds per column
# and row are taken off the limit HiGHS is given (at most half of what is left).
HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY = 6e-6


# HiGHS's own mip_rel_gap default: a run stopped there is reported optimal, as before ``gap_rel``.
DEFAULT_MIP_REL_GAP = 1e-4


@dataclass
class Outcome:
    """What a backend run says, in the model's normalised objective units (constant included)."""

    has_solution: bool
    optimal: bool
    infeasible: bool
    stopped: bool = False  # a time (or other) limit ended the search before it concluded
    objective: float | None = None
    bound: float | None = None
    values: np.ndarray | None = None  # one value per column

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

    if backend == "highs":
        try:
            if importlib.util.find_spec("highspy") is None:
                raise ImportError("No module named 'highspy'")
            importlib.import_module("highspy")
        except ImportError as error:
            raise SolverUnavailable(f"the 'highs' backend needs highspy (pip install highspy; {error}); "
                                    "or use backend='cbc'") from error
        return
    if importlib.util.find_spec("pulp") is None:
        raise SolverUnavailable("the 'cbc' backend needs PuLP (pip install pulp); or use backend='highs'")
    if not _cbc(msg=False).available():
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


def load_highs(model: CheckmateModel, relax: bool):
    """A ``highspy.Highs`` holding ``model`` (without integrality when ``relax``), passed in one call
    from its arrays, silent."""
    import highspy

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    integrality = (np.zeros(model.num_cols, dtype=np.int32) if relax
                   else model.integer.astype(np.int32) * int(highspy.HighsVarType.kInteger))
    status = highs.passModel(
        model.num_cols, model.num_rows, model.num_nonzeros, int(highspy.MatrixFormat.kRowwise),
        int(highspy.ObjSense.kMinimize), float(model.objective_constant), model.col_cost, model.col_lower,
        model.col_upper, model.row_lower, model.row_upper, model.row_start[:-1].astype(np.int32),
        model.row_index, model.row_value, integrality)
    if status == highspy.HighsStatus.kError:
        raise RuntimeError("ilp: HiGHS refused Checkmate's model (passModel failed)")
    return highs


def dual_bound(model: CheckmateModel, row_dual: np.ndarray) -> float:
    """A lower bound on the LP relaxation's optimum (hence on every solution of the model) from any
    row multipliers ``y``, by weak duality: for ``l <= x <= u`` and ``L <= A x <= U``,
    ``c.x >= sum_i (y_i L_i if y_i > 0 else y_i U_i) + sum_j min(d_j l_j, d_j u_j)`` with
    ``d = c - A^T y`` (a multiplier whose side of the row is infinite is dropped first). It holds
    whatever the solver's tolerances or whether it finished, so an LP solved by a first-order
    method, or stopped early, still certifies this much. Every column is bounded (``U`` by the
    budget), so the bound is finite; it is the larger of the bounds of ``y`` and ``-y`` (HiGHS's
    sign convention need not be assumed)."""
    rows = np.repeat(np.arange(model.num_rows), np.diff(model.row_start))
    best = -math.inf
    for sign in (1.0, -1.0):
        y = sign * np.asarray(row_dual, dtype=np.float64)
        y = np.where((y > 0) & ~np.isfinite(model.row_lower), 0.0, y)
        y = np.where((y < 0) & ~np.isfinite(model.row_upper), 0.0, y)
        d = model.col_cost - np.bincount(model.row_index, weights=model.row_value * y[rows], minlength=model.num_cols)
        rows_part = np.where(y > 0, y * np.where(np.isfinite(model.row_lower), model.row_lower, 0.0),
                             y * np.where(np.isfinite(model.row_upper), model.row_upper, 0.0)).sum()
        if np.any((d < 0) & ~np.isfinite(model.col_upper)) or np.any((d > 0) & ~np.isfinite(model.col_lower)):
            continue
        upper = np.where(np.isfinite(model.col_upper), model.col_upper, 0.0)
        columns_part = np.where(d > 0, d * model.col_lower, d * upper).sum()
        best = max(best, float(rows_part + columns_part) + model.objective_constant)
    return best


def _run_highs(model: CheckmateModel, time_limit, threads, warm, relax, gap_abs, target=None,
               lp_solver: str = "choose", gap_rel: float | None = None) -> Outcome:
    import highspy

    ends_at = None if time_limit is None else time.perf_counter() + time_limit
    highs = load_highs(model, relax)
    if relax and lp_solver != "choose":
        highs.setOptionValue("solver", lp_solver)
    if gap_abs is not None:
        highs.setOptionValue("mip_abs_gap", gap_abs)
    if target is not None:
        highs.setOptionValue("objective_target", target)
    if gap_rel is not None:
        highs.setOptionValue("mip_rel_gap", gap_rel)
    if threads is not None:
        # HiGHS keeps one thread pool per process, sized by the first run; a run asking for another
        # size fails ("global scheduler has already been initialized") unless the pool is rebuilt
        # first. Rebuilding it for every run that names a size costs milliseconds.
        highspy.Highs.resetGlobalScheduler(True)
        highs.setOptionValue("threads", int(threads))
    if warm is not None and not relax:
        # HiGHS checks the start ("MIP start solution is feasible") and takes it as its first
        # incumbent: with a time limit too short to find anything else, it comes back as the
        # solution (tests/test_ilp.py checks this). An infeasible start is silently dropped, which is
        # why :func:`_check_values` guards it.
        values = np.asarray(warm, dtype=np.float64)
        highs.setSolution(len(values), np.arange(len(values), dtype=np.int32), values)
    if ends_at is not None:  # what loading left of the limit, less what ends the run
        left = ends_at - time.perf_counter()
        reserve = min(0.5 * left, HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY * (model.num_cols + model.num_rows))
        if left <= 0:
            raise SolverTimeout("ilp: the time limit passed while loading the model into HiGHS", method="ilp")
        highs.setOptionValue("time_limit", max(0.01, left - reserve))
    run_interruptibly(highs)
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
    optimal = status == kinds.kOptimal and has_solution
    if optimal and gap_rel is not None and info.mip_gap > DEFAULT_MIP_REL_GAP:
        optimal, stopped = False, True  # stopped at gap_rel, not proven
    outcome = Outcome(has_solution, optimal, infeasible, stopped)
    solution = highs.getSolution()
    if has_solution:
        outcome.values = np.array(solution.col_value, dtype=np.float64)
        outcome.objective = float(model.col_cost @ outcome.values) + model.objective_constant
    if relax and solution.dual_valid and not infeasible:
        # the LP's bound by weak duality from its row duals: valid to the last bit, and also when
        # the LP stopped early or was solved to a first-order method's looser tolerance
        bound = dual_bound(model, np.array(solution.row_dual, dtype=np.float64))
    else:
        bound = None if relax or not has_solution else info.mip_dual_bound
    if bound is not None and math.isfinite(bound):
        outcome.bound = bound if outcome.objective is None else min(bound, outcome.objective)
    return outcome


def as_pulp(model: CheckmateModel):
    """The model as a PuLP problem (for CBC): its variables in column order."""
    import pulp

    problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
    create = getattr(problem, "add_variable", pulp.LpVariable)  # PuLP >= 3.3 creates them through the problem
    variables = []
    for j in range(model.num_cols):
        upper = None if math.isinf(model.col_upper[j]) else float(model.col_upper[j])
        category = pulp.LpInteger if model.integer[j] else pulp.LpContinuous
        variables.append(create(f"x{j}", float(model.col_lower[j]), upper, category))
    index, value, start = model.row_index.tolist(), model.row_value.tolist(), model.row_start.tolist()
    for row in range(model.num_rows):
        terms = [(variables[index[e]], value[e]) for e in range(start[row], start[row + 1])]
        lower, upper = float(model.row_lower[row]), float(model.row_upper[row])
        expression = pulp.LpAffineExpression(terms)
        if math.isfinite(lower):
            problem.addConstraint(pulp.LpConstraint(expression, pulp.LpConstraintGE, f"g{row}", lower))
        if math.isfinite(upper):
            problem.addConstraint(pulp.LpConstraint(expression, pulp.LpConstraintLE, f"l{row}", upper))
    problem.setObjective(pulp.LpAffineExpression(
        [(variables[j], float(c)) for j, c in enumerate(model.col_cost) if c != 0],
        constant=model.objective_constant))
    return problem, variables


def _run_cbc(model: CheckmateModel, time_limit, threads, warm, relax, gap_abs) -> Outcome:
    import pulp

    problem, variables = as_pulp(model)
    if warm is not None:
        for var, value in zip(variables, np.asarray(warm, dtype=np.float64).tolist()):
            var.setInitialValue(value)
    with tempfile.TemporaryDirectory(prefix="ilp-cbc-") as folder:
        log_path = os.path.join(folder, "cbc.log")
        # warmStart=True makes PuLP write the variables' initial values as a CBC MIP start file
        # (-mips); CBC reports "MIPStart values read" and takes it as its first incumbent.
        solver = _cbc(mip=not relax, msg=False, timeLimit=time_limit, threads=threads,
                      warmStart=warm is not None, logPath=log_path, gapAbs=gap_abs)
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
        outcome.values = np.array([var.varValue or 0.0 for var in variables], dtype=np.float64)
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
                warm: np.ndarray | None = None, relax: bool = False, gap_abs: float | None = None,
                target: float | None = None, lp_solver: str = "choose", gap_rel: float | None = None) -> Outcome:
    """Solve ``model`` with ``backend`` ("highs" or "cbc"); ``warm``: a start, one value per column.

    ``target`` (HiGHS only): stop at the first solution whose objective is at most this.
    ``gap_rel`` (HiGHS only): stop once the incumbent is within this relative gap of the bound (the
    outcome is then not ``optimal`` unless within HiGHS's default gap, ``DEFAULT_MIP_REL_GAP``).
    ``lp_solver`` (HiGHS only, with ``relax``): HiGHS's ``solver`` option for the LP ("choose", its
    default, picks the simplex; "pdlp", its first-order method, for LPs too large for it); the
    LP's bound is :func:`dual_bound`'s either way.
    """
    if time_limit is not None:
        time_limit = max(0.01, float(time_limit))
    started = time.perf_counter()
    if backend == "highs":
        outcome = _run_highs(model, time_limit, threads, warm, relax, gap_abs, target, lp_solver, gap_rel)
    else:
        outcome = _run_cbc(model, time_limit, threads, warm, relax, gap_abs)
    LOG.debug("ilp: %s %s in %.1f s: optimal %s, objective %s, bound %s", backend, "LP" if relax else "MILP",
              time.perf_counter() - started, outcome.optimal, outcome.objective, outcome.bound)
    return outcome
