"""Checkmate's MILP as a PuLP problem: its variables and one function per family of rows
(:mod:`solvers.ilp` has the formulation)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..clock import Clock
from ..graph import NodeCosts

if TYPE_CHECKING:  # PuLP is imported where it is used: importing solvers must stay cheap
    import pulp

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scales:
    """Units that keep the MILP's coefficients near 1.

    Memory is divided by ``mem_unit`` (1 byte for small graphs, else 1/1024 of the largest
    per-node memory, so the largest coefficient is ~1024 and the smallest stays well above the
    solver's drop tolerance); costs by the largest node cost.
    """

    mem_unit: float
    cost_unit: float

    @staticmethod
    def of(costs: NodeCosts) -> Scales:
        largest_mem = max((m + w for m, w in zip(costs.mem, costs.workspace)), default=0)
        largest_cost = max(costs.cost, default=0.0)
        return Scales(mem_unit=max(1.0, largest_mem / 1024.0), cost_unit=largest_cost if largest_cost > 0 else 1.0)

@dataclass
class CheckmateModel:
    """The PuLP problem and its variables, indexed by ``(stage, node)`` positions.

    Only entries that can be non-zero (or are not fixed) are variables; :meth:`r` and :meth:`s`
    return the fixed values (0 or 1) for the others.
    """

    problem: pulp.LpProblem
    costs: NodeCosts
    scales: Scales
    slots: list[list[int]]  # slots[t]: nodes that may be computed in stage t, ascending; t is last
    R: dict[tuple[int, int], pulp.LpVariable]
    S: dict[tuple[int, int], pulp.LpVariable]
    FREE: dict[tuple[int, int, int], pulp.LpVariable]
    U: dict[tuple[int, int], pulp.LpVariable]
    objective_constant: float  # the first computations' cost (normalised): R[t,t] = 1 is not a variable
    peak: pulp.LpVariable | None = None  # the min-peak model's objective
    # (row, fixed part): the rows U[t,k] + workspace[k] R[t,k] <= budget, each with the part of its
    # right-hand side that is not the budget (a fixed R[t,t] = 1 moves workspace[t] there).
    budget_rows: list = field(default_factory=list)
    variables: list = field(default_factory=list)  # every variable, in creation order
    rows: list = field(default_factory=list)  # every constraint, in creation order

    def set_budget(self, budget: float) -> None:
        """Change the budget (bytes) of the memory rows in place: the LP of lp-rounding at a
        fraction of the budget, a tightened MILP, all without rebuilding the model."""
        for row, fixed in self.budget_rows:
            # PuLP stores "expr <= b" as "expr - b <= 0": the constant is -b.
            row.constant = -(budget / self.scales.mem_unit + fixed)

    def r(self, t: int, i: int):
        """``R[t,i]``: a variable, or its fixed value."""
        if i == t:
            return 1
        return self.R.get((t, i), 0)

    def s(self, t: int, i: int):
        """``S[t,i]`` for 0 <= t <= n (``S[n,i]`` = held at the end): a variable, or its fixed value."""
        costs = self.costs
        if i >= t:
            return 0
        if costs.pinned[i]:
            return 1  # pinned: held from its first computation (stage i) to the end
        if t == costs.n:
            return 1 if costs.output[i] else 0
        return self.S.get((t, i), 0)

def _can_recompute(costs: NodeCosts, i: int, t: int) -> bool:
    """Whether ``R[t,i]`` (i < t) may be 1: not pinned, and someone can use the result."""
    if i >= t or costs.pinned[i]:
        return False
    if costs.succs[i]:
        return True
    return costs.output[i] and t == costs.n - 1  # an output sink recomputed to be held at the end

def _may_hold(costs: NodeCosts, i: int, t: int) -> bool:
    """Whether ``S[t,i]`` (0 < t < n) is a variable: a non-pinned result someone may still need."""
    return i < t and not costs.pinned[i] and (bool(costs.succs[i]) or costs.output[i])

def _is_const(entry) -> bool:
    return isinstance(entry, (int, float))

def _set_one(entry, values: dict) -> bool:
    """Set a warm-start entry to 1: a variable gets the value, a fixed entry must already be 1
    (False: the schedule is not expressible in the model)."""
    if _is_const(entry):
        return entry == 1
    values[entry] = 1.0
    return True

def _is_one(entry) -> bool:
    """Whether a model entry is fixed to 1. (Never write ``entry == 1``: on a PuLP variable that
    builds a constraint, which is truthy.)"""
    return _is_const(entry) and entry == 1

class _Rows:
    """Adds constraints to a PuLP problem from ``(coefficient, entry)`` terms, where an entry is a
    variable or a fixed number. It builds ``LpConstraint`` objects directly: PuLP's operator
    overloading (``a + b <= c``) costs several times more on models of 10^4-10^5 rows."""

    def __init__(self, problem):
        import pulp

        self.problem = problem
        self.pulp = pulp
        self.added: list = []

    def add(self, name: str, terms, sense: str, rhs: float = 0.0):
        pulp = self.pulp
        coefficients: dict = {}
        for coefficient, entry in terms:
            if _is_const(entry):
                rhs -= coefficient * entry
            elif coefficient != 0:
                coefficients[entry] = coefficients.get(entry, 0.0) + coefficient
        if not coefficients:
            # Fixed entries only: the row holds by construction (a violated one is a bug here).
            satisfied = {"<=": 0 <= rhs + 1e-12, ">=": 0 >= rhs - 1e-12, "==": abs(rhs) <= 1e-12}[sense]
            if not satisfied:
                raise AssertionError(f"ilp model row {name} is violated by fixed values")
            return None
        kind = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}[sense]
        row = pulp.LpConstraint(pulp.LpAffineExpression(list(coefficients.items())), kind, name, rhs)
        self.problem.addConstraint(row, name)
        self.added.append(row)
        return row


class _Builder:
    """What building one model shares: the PuLP problem, its rows, its variables in creation order
    (the order HiGHS numbers its columns in), and the clock the build is charged to."""

    def __init__(self, costs: NodeCosts, scales: Scales, clock: Clock):
        import pulp

        self.pulp = pulp
        self.costs, self.scales, self.clock = costs, scales, clock
        self.problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
        self.rows = _Rows(self.problem)
        self.variables: list = []
        # PuLP >= 3.3 creates variables through the problem (constructing LpVariable directly is
        # deprecated there, and warns once per variable); older PuLP only has the constructor.
        self._create = getattr(self.problem, "add_variable", pulp.LpVariable)

    def variable(self, name: str, upper: float | None = 1.0, lower: float = 0.0, binary: bool = True):
        pulp = self.pulp
        var = self._create(name, lower, upper, pulp.LpBinary if binary else pulp.LpContinuous)
        self.variables.append(var)
        return var

    def check(self, family: str) -> None:
        """Charge the build to the clock: :class:`SolverTimeout` once the limit has passed."""
        self.clock.check("ilp", f"building Checkmate's model (its {family})")


def _stage_variables(build: _Builder) -> CheckmateModel:
    """``R`` and ``S``, where they are variables. R[t,t] = 1 (stage t ends with t's first
    computation), R[t,i] = 0 for i > t and S[t,i] = 0 for i >= t are fixed values, not variables;
    so are the pinned nodes' S (1 once computed) and R (0 after their stage)."""
    costs, n = build.costs, build.costs.n
    slots = [[i for i in range(t) if _can_recompute(costs, i, t)] + [t] for t in range(n)]
    R = {(t, i): build.variable(f"R_{t}_{i}") for t in range(n) for i in slots[t][:-1]}
    S = {(t, i): build.variable(f"S_{t}_{i}") for t in range(1, n) for i in range(t) if _may_hold(costs, i, t)}
    return CheckmateModel(build.problem, costs, build.scales, slots, R, S, {}, {}, 0.0,
                          variables=build.variables, rows=build.rows.added)


def _free_variables(build: _Builder, model: CheckmateModel) -> dict[tuple[int, int], list[int]]:
    """``FREE[t,i,k]`` where it can be 1 and matters: i is not pinned, not an output in the last
    stage (it must be held at the end), t itself does not read i later in the stage, and k is not
    t: frees after a stage's last computation change no memory the model counts (stage t+1 starts
    from S[t+1]), so those are left to the extraction. Returns the readers after which each
    ``(t, i)`` may be freed."""
    costs, s = build.costs, model.s
    for t in range(costs.n):
        build.check("FREE variables")
        for k in model.slots[t][:-1]:
            for i in (*costs.preds[k], k):
                if costs.pinned[i] or _is_one(s(t + 1, i)):
                    continue
                if t in costs.succs[i]:
                    continue  # t reads i at the end of this stage: i cannot go after k < t
                model.FREE[t, i, k] = build.variable(f"F_{t}_{i}_{k}")
    frees_of: dict[tuple[int, int], list[int]] = {}
    for (t, i, k) in model.FREE:
        frees_of.setdefault((t, i), []).append(k)
    return frees_of


def _cost_objective(build: _Builder, model: CheckmateModel):
    """Total compute cost (normalised), first computations included as a constant."""
    costs, scales = build.costs, build.scales
    model.objective_constant = sum(costs.cost) / scales.cost_unit
    return build.pulp.LpAffineExpression([(var, costs.cost[i] / scales.cost_unit) for (t, i), var in model.R.items()],
                                         constant=model.objective_constant)


def _no_recomputation_of_held(build: _Builder, model: CheckmateModel) -> None:
    """R[t,i] + S[t,i] <= 1: no recomputation of a held result (our semantics; the paper allows
    it and double-counts)."""
    for (t, i), var in model.R.items():
        if (t, i) in model.S:
            build.rows.add(f"held_{t}_{i}", [(1, var), (1, model.S[t, i])], "<=", 1)


def _dependencies(build: _Builder, model: CheckmateModel) -> None:
    """R[t,k] <= R[t,i] + S[t,i] for each input i of k: k can be computed in stage t only if each
    input is held entering the stage or computed earlier in it (ascending order within a stage
    makes "earlier" = smaller)."""
    costs, r, s = build.costs, model.r, model.s
    for t in range(costs.n):
        build.check("dependency rows")
        for k in model.slots[t]:
            for i in costs.preds[k]:
                if not _is_one(s(t, i)):
                    build.rows.add(f"dep_{t}_{i}_{k}", [(1, r(t, k)), (-1, r(t, i)), (-1, s(t, i))], "<=")


def _conservation(build: _Builder, model: CheckmateModel, frees_of: dict) -> None:
    """S[t+1,i] + sum_k FREE[t,i,k] <= R[t,i] + S[t,i] (the paper's S[t+1,i] <= S[t,i] + R[t,i],
    strengthened): a result present in stage t (held entering or computed; never both) is kept
    into stage t+1 or freed once."""
    r, s = model.r, model.s
    for t in range(build.costs.n):
        build.check("conservation rows")
        for i in range(t + 1):
            frees = frees_of.get((t, i), ())
            keep = s(t + 1, i)
            if not frees and (_is_const(keep) and keep == 0 or _is_one(r(t, i)) or _is_one(s(t, i))):
                continue  # nothing to keep or free, or present for sure with nothing to free
            terms = [(1, keep), (-1, r(t, i)), (-1, s(t, i))] + [(1, model.FREE[t, i, k]) for k in frees]
            build.rows.add(f"keep_{t}_{i}", terms, "<=")


def _free_after_last_use(build: _Builder, model: CheckmateModel, frees_of: dict) -> None:
    """Free only after the last reader: FREE[t,i,k] <= R[t,k], and per later reader j of i in
    stage t, R[t,j] + sum_{k < j} FREE[t,i,k] <= 1, which for binaries is the paper's product form
    (linearised as upper bounds) and gives a tighter LP than one row per (k, j) pair."""
    build.check("free-after-last-use rows")
    costs, r, FREE = build.costs, model.r, model.FREE
    for (t, i, k), var in FREE.items():
        build.rows.add(f"freeafter_{t}_{i}_{k}", [(1, var), (-1, r(t, k))], "<=")
    for (t, i), ks in frees_of.items():
        slot_set = set(model.slots[t])
        for j in costs.succs[i]:
            earlier = [(1, FREE[t, i, k]) for k in ks if k < j]
            if j in slot_set and earlier:
                build.rows.add(f"lastuse_{t}_{i}_{j}", [(1, r(t, j))] + earlier, "<=", 1)


def _memory(build: _Builder, model: CheckmateModel, budget: int | None) -> None:
    """The memory recursion and the budget (or the peak), in units of ``scales.mem_unit``.

    U[t,k] is what is held right after computing k in stage t (before its frees); the step's
    memory is U[t,k] + workspace[k] while computing, at most the budget (or ``model.peak``). U is
    only bounded from above, so the paper's equalities are written as lower bounds: the same
    integer solutions, and HiGHS separates cuts far faster without the equality chains.
    """
    costs, scales, r, s, FREE, U = build.costs, build.scales, model.r, model.s, model.FREE, model.U
    mem = [m / scales.mem_unit for m in costs.mem]
    workspace = [w / scales.mem_unit for w in costs.workspace]
    for t in range(costs.n):
        build.check("memory rows")
        previous = None
        for k in model.slots[t]:
            U[t, k] = build.variable(f"U_{t}_{k}", upper=None, binary=False)
            if previous is None:  # entering the stage: everything checkpointed, then k's result
                terms = [(mem[i], s(t, i)) for i in range(t)]
            else:  # what was held after the previous computation, less what was freed after it
                freed = [i for i in (*costs.preds[previous], previous) if (t, i, previous) in FREE]
                terms = [(1, U[t, previous])] + [(-mem[i], FREE[t, i, previous]) for i in freed]
            build.rows.add(f"mem_{t}_{k}", [(1, U[t, k])] + [(-c, e) for c, e in terms] + [(-mem[k], r(t, k))], ">=")
            during = [(1, U[t, k]), (workspace[k], r(t, k))]
            if budget is None:
                build.rows.add(f"peak_{t}_{k}", during + [(-1, model.peak)], "<=")
            else:
                row = build.rows.add(f"budget_{t}_{k}", during, "<=", budget / scales.mem_unit)
                model.budget_rows.append((row, -row.constant - budget / scales.mem_unit))
            previous = k


def build_model(costs: NodeCosts, budget: int | None, scales: Scales,
                peak_bounds: tuple[int, int] | None = None, clock: Clock | None = None) -> CheckmateModel:
    """Checkmate's MILP for a budget in bytes (``budget``), or, with ``budget=None``, the model
    that minimises the peak (``peak_bounds`` = (lower, upper) bytes) under the same constraints.

    One function per family of variables and rows, in the order the columns and rows are
    created (the order HiGHS sees them in). The LP relaxation is the same model solved without
    integrality (``run_backend(relax=True)``). Building takes ~n^2 Python steps (seconds at 200
    nodes): with a ``clock`` it is checked once per stage of each family, and
    :class:`SolverTimeout` raised when the limit passes.
    """
    started = time.perf_counter()
    build = _Builder(costs, scales, clock or Clock(None))
    model = _stage_variables(build)
    frees_of = _free_variables(build, model)
    objective = _cost_objective(build, model)
    _no_recomputation_of_held(build, model)
    _dependencies(build, model)
    _conservation(build, model, frees_of)
    _free_after_last_use(build, model, frees_of)
    if budget is None:
        lower, upper = peak_bounds
        model.peak = build.variable("peak", upper / scales.mem_unit, lower / scales.mem_unit, binary=False)
        objective = build.pulp.LpAffineExpression([(model.peak, 1.0)])
    _memory(build, model, budget)
    build.problem.setObjective(objective)
    LOG.debug("ilp: model of %d nodes built in %.1f s: %d variables, %d rows", costs.n, time.perf_counter() - started,
              len(build.variables), len(build.rows.added))
    return model
