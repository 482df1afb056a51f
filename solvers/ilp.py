"""``ilp``: Checkmate's MILP (Jain et al., MLSys 2020) on the whole DAG, solved with PuLP.

Checkmate (§4 of the paper) fixes the order of *first* computations to one topological order
(here the cheapest warm start's, else :func:`solvers.graph.topological_order`; nodes renamed
``0..n-1`` in it) and splits the schedule into ``n`` stages: stage ``t`` recomputes some earlier
nodes in ascending index order and ends with the first computation of node ``t``
("frontier-advancing" stages). Its variables:

- ``R[t,i]`` (binary): node ``i`` is computed in stage ``t``; the objective is the sum of
  ``cost[i] * R[t,i]``;
- ``S[t,i]`` (binary): ``i``'s result is held when stage ``t`` begins (a checkpoint);
- ``FREE[t,i,k]`` (binary): ``i`` is freed right after ``k`` is computed in stage ``t``, for every
  edge ``i -> k`` and, so that a result nobody reads in the stage can go too, for ``k = i``;
- ``U[t,k]`` (continuous): memory held just after computing ``k`` in stage ``t``.

The constraint families (each block of :func:`build_model` says which): R[t,t] = 1 and the
lower-triangular structure (fixed values, not variables); dependencies ``R[t,k] <= R[t,i] +
S[t,i]``; conservation (a result present in a stage is kept into the next or freed once); frees
only after the last reader in the stage; the memory recursion and the budget. The paper's
equation numbers are not cited here: this was written from the summary of the model in
docs/algorithms.md ("Checkmate"), not from the paper's text. Where this model departs from that summary it says why:

- memory while computing ``k`` is ``held + mem[k] + workspace[k]`` (docs/costgraph.md);
- ``compute k`` while ``k`` is held is not allowed (docs/schedule.md): ``R[t,i] + S[t,i] <= 1``;
- ``pinned`` nodes are computed once and held from then on (``S`` fixed to 1, no ``FREE``, no
  ``R`` after their stage), and ``output`` nodes are held at the end (a fixed ``S[n,i] = 1``);
- the paper's product definition of ``FREE`` is written as upper bounds only (the memory budget
  is the only thing that wants frees, so the solver sets ``FREE`` to 1 wherever allowed and it
  helps), aggregated per reader, with no ``FREE`` after a stage's last computation (it changes no
  memory the model counts); ``U`` is bounded below by the recursion instead of equal to it.

The extracted schedule is the compute order read off ``R`` (stage by stage, ascending within a
stage) with the frees of :func:`solvers.liveness.schedule_from_computes`, which frees every result
at least as early as the model's ``FREE`` does; so its true peak is never above the model's. It is
checked with :func:`solvers.simulate`, in bytes, before it is returned; should the solver's
tolerances let it overshoot, the MILP is re-solved with a tighter budget.

How ``mode="exact"`` solves it: the heuristic methods (store-all, chen-greedy, dp) and the LP
relaxation's roundings (§5 of the paper) give candidate schedules; when the cheapest the model can
express meets the LP bound it is returned as proven optimal, otherwise it warm-starts the MILP
(HiGHS spends most of its time looking for a first incumbent on these models).
``mode="lp-rounding"`` stops after the roundings: for graphs too large to solve exactly.

What the model cannot do (docs/algorithms.md, "Checkmate", traps 1 and 2): other first-computation
orders, recomputing a node twice in one stage or out of index order, and computing anything after
the last node's first computation (so an output that is not a sink is held, or recomputed, while
the last node is computed). Its optimum can therefore
be above the true optimum (``exhaustive``/``cpsat``), and some budgets that other schedules meet
are infeasible here. ``Infeasible.min_budget`` is the smallest budget *this model* can meet.

Errors: :class:`~solvers.errors.Infeasible` when the model cannot meet the budget (proven by the
solver or by a counting bound), with ``min_budget`` (its message says when that minimum is not
proven, e.g. when the time ran out: it is then the least budget found that the model meets);
``TimeoutError`` when the time limit passes before any schedule within the budget is known and
infeasibility is not proven either (``Infeasible`` would claim too much); ``ValueError`` for an
unknown ``backend``/``mode``; :class:`~solvers.errors.SolverUnavailable` when the backend is
missing.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .bounds import BOUND_SECONDS, cost_lower_bound
from .clock import Clock
from .errors import Infeasible, SolverTimeout, SolverUnavailable
from .graph import NodeCosts, is_topological_order, node_costs, validate
from .liveness import drop_redundant_computes, schedule_from_computes
from .options import schedule_from, time_limit_or_default
from .schedule import COMPUTE, FEASIBLE, OPTIMAL, OPTIMAL_IN_ORDER, Schedule, SolverInfo
from .simulate import simulate

if TYPE_CHECKING:  # PuLP is imported where it is used: importing solvers must stay cheap
    import pulp

LOG = logging.getLogger(__name__)

BACKENDS = ("highs", "cbc")
MODES = ("exact", "lp-rounding")
DEFAULT_ROUNDING_SAMPLES = 48
# Heuristic methods tried for a warm start (either may be missing or unfinished: others write
# them). Store-all is not among them: it is checked first, and when it fits no MILP is needed.
WARM_START_METHODS = ("chen-greedy", "dp")
# Each warm-start heuristic gets at most this share of the time left: dp plans on several chain
# views, and unbounded it took 4.7 s of a 30 s limit on the benchmark GPT-2's module graph.
WARM_START_SHARE = 0.15
# Graphs above this many nodes are refused: a 200-node graph's model has ~10^5 variables and
# ~2 x 10^5 rows and takes ~10 s and 330 MB to build in PuLP; both grow as n^2.
MAX_NODES = 600
# HiGHS stops some time after its time_limit (an LP of 106,652 columns and 180,145 rows, the
# 201-node training graph with 10 skips: 2.0 s run against a 0.9 s limit), and PuLP then reads
# the solution back (0.6 s there): ~1.7 s for 286,797 entries, so this many seconds per column
# and row are taken off the limit HiGHS is given (at most half of what is left).
HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY = 6e-6
# Attempts at re-solving with a tighter budget when rounding in the solver overshoots in bytes.
TIGHTEN_ATTEMPTS = 3
# Fractions of the budget offered to the LP in lp-rounding mode, loosest first: a rounding of a
# tighter LP tends to fit where the first one's roundings overshoot (Checkmate §5 does the same).
LP_BUDGET_FRACTIONS = (1.0, 0.9, 0.75, 0.5)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


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
    def of(costs: NodeCosts) -> "Scales":
        largest_mem = max((m + w for m, w in zip(costs.mem, costs.workspace)), default=0)
        largest_cost = max(costs.cost, default=0.0)
        return Scales(mem_unit=max(1.0, largest_mem / 1024.0), cost_unit=largest_cost if largest_cost > 0 else 1.0)


@dataclass
class CheckmateModel:
    """The PuLP problem and its variables, indexed by ``(stage, node)`` positions.

    Only entries that can be non-zero (or are not fixed) are variables; :meth:`r` and :meth:`s`
    return the fixed values (0 or 1) for the others.
    """

    problem: "pulp.LpProblem"
    costs: NodeCosts
    scales: Scales
    slots: list[list[int]]  # slots[t]: nodes that may be computed in stage t, ascending; t is last
    R: dict[tuple[int, int], "pulp.LpVariable"]
    S: dict[tuple[int, int], "pulp.LpVariable"]
    FREE: dict[tuple[int, int, int], "pulp.LpVariable"]
    U: dict[tuple[int, int], "pulp.LpVariable"]
    objective_constant: float  # the first computations' cost (normalised): R[t,t] = 1 is not a variable
    peak: "pulp.LpVariable | None" = None  # the min-peak model's objective
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


def build_model(costs: NodeCosts, budget: int | None, scales: Scales,
                peak_bounds: tuple[int, int] | None = None, clock: Clock | None = None) -> CheckmateModel:
    """Checkmate's MILP for a budget in bytes (``budget``), or, with ``budget=None``, the model
    that minimises the peak (``peak_bounds`` = (lower, upper) bytes) under the same constraints.

    The LP relaxation is the same model solved without integrality (``run_backend(relax=True)``).
    Building takes ~n^2 Python steps (seconds at 200 nodes): with a ``clock`` it is checked once
    per stage of each constraint family, and :class:`SolverTimeout` raised when the limit passes.
    """
    clock = clock or Clock(None)
    import pulp

    started = time.perf_counter()
    n = costs.n
    mem = [m / scales.mem_unit for m in costs.mem]
    workspace = [w / scales.mem_unit for w in costs.workspace]
    problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
    rows = _Rows(problem)
    variables: list = []

    # PuLP >= 3.3 creates variables through the problem (constructing LpVariable directly is
    # deprecated there, and warns once per variable); older PuLP only has the constructor.
    create = getattr(problem, "add_variable", pulp.LpVariable)

    def variable(name: str, upper: float | None = 1.0, lower: float = 0.0, binary: bool = True):
        var = create(name, lower, upper, pulp.LpBinary if binary else pulp.LpContinuous)
        variables.append(var)
        return var

    # Which entries are variables. R[t,t] = 1 (stage t ends with t's first computation), R[t,i] = 0
    # for i > t and S[t,i] = 0 for i >= t are fixed values, not variables; so are the
    # pinned nodes' S (1 once computed) and R (0 after their stage).
    slots = [[i for i in range(t) if _can_recompute(costs, i, t)] + [t] for t in range(n)]
    R = {(t, i): variable(f"R_{t}_{i}") for t in range(n) for i in slots[t][:-1]}
    S = {(t, i): variable(f"S_{t}_{i}") for t in range(1, n) for i in range(t) if _may_hold(costs, i, t)}
    model = CheckmateModel(problem, costs, scales, slots, R, S, {}, {}, 0.0, variables=variables, rows=rows.added)
    r, s = model.r, model.s

    # FREE[t,i,k] exists where it can be 1 and matters: i is not pinned, not an output in the last
    # stage (it must be held at the end), t itself does not read i later in the stage, and k is
    # not t: frees after a stage's last computation change no memory the model counts (stage t+1
    # starts from S[t+1]), so those are left to the extraction.
    FREE = model.FREE
    for t in range(n):
        clock.check("ilp", "building Checkmate's model (its FREE variables)")
        for k in slots[t][:-1]:
            for i in (*costs.preds[k], k):
                if costs.pinned[i] or _is_one(s(t + 1, i)):
                    continue
                if t in costs.succs[i]:
                    continue  # t reads i at the end of this stage: i cannot go after k < t
                FREE[t, i, k] = variable(f"F_{t}_{i}_{k}")
    frees_of: dict[tuple[int, int], list[int]] = {}
    for (t, i, k) in FREE:
        frees_of.setdefault((t, i), []).append(k)

    # Objective: total compute cost, first computations included (as a constant).
    model.objective_constant = sum(costs.cost) / scales.cost_unit
    objective = pulp.LpAffineExpression([(var, costs.cost[i] / scales.cost_unit) for (t, i), var in R.items()],
                                        constant=model.objective_constant)

    # No recomputation of a held result (our semantics; the paper allows it and double-counts).
    for (t, i), var in R.items():
        if (t, i) in S:
            rows.add(f"held_{t}_{i}", [(1, var), (1, S[t, i])], "<=", 1)

    # Dependencies: k can be computed in stage t only if each input is held entering the
    # stage or computed earlier in it (ascending order within a stage makes "earlier" = smaller).
    for t in range(n):
        clock.check("ilp", "building Checkmate's model (its dependency rows)")
        for k in slots[t]:
            for i in costs.preds[k]:
                if not _is_one(s(t, i)):
                    rows.add(f"dep_{t}_{i}_{k}", [(1, r(t, k)), (-1, r(t, i)), (-1, s(t, i))], "<=")

    # Conservation (the paper's S[t+1,i] <= S[t,i] + R[t,i], strengthened): a result present in
    # stage t (held entering or computed; never both) is kept into stage t+1 or freed once.
    for t in range(n):
        clock.check("ilp", "building Checkmate's model (its conservation rows)")
        for i in range(t + 1):
            frees = frees_of.get((t, i), ())
            keep = s(t + 1, i)
            if not frees and (_is_const(keep) and keep == 0 or _is_one(r(t, i)) or _is_one(s(t, i))):
                continue  # nothing to keep or free, or present for sure with nothing to free
            terms = [(1, keep), (-1, r(t, i)), (-1, s(t, i))] + [(1, FREE[t, i, k]) for k in frees]
            rows.add(f"keep_{t}_{i}", terms, "<=")

    # Free only after the last reader: FREE[t,i,k] needs k computed in stage t, and no later
    # reader j > k of i in stage t. Per reader j:  R[t,j] + sum_{k < j} FREE[t,i,k] <= 1,
    # which for binaries is the paper's product form (linearised as upper bounds) and gives a
    # tighter LP than one row per (k, j) pair.
    for (t, i, k), var in FREE.items():
        rows.add(f"freeafter_{t}_{i}_{k}", [(1, var), (-1, r(t, k))], "<=")
    for (t, i), ks in frees_of.items():
        slot_set = set(slots[t])
        for j in costs.succs[i]:
            earlier = [(1, FREE[t, i, k]) for k in ks if k < j]
            if j in slot_set and earlier:
                rows.add(f"lastuse_{t}_{i}_{j}", [(1, r(t, j))] + earlier, "<=", 1)

    # Memory, in units of scales.mem_unit: U[t,k] is what is held right after computing
    # k in stage t (before its frees); the step's memory is U[t,k] + workspace[k] while computing.
    # U is only bounded from above, so the paper's equalities are written as lower bounds: the
    # same integer solutions, and HiGHS separates cuts far faster without the equality chains.
    if budget is None:
        lower, upper = peak_bounds
        model.peak = variable("peak", upper / scales.mem_unit, lower / scales.mem_unit, binary=False)
        objective = pulp.LpAffineExpression([(model.peak, 1.0)])
    clock.check("ilp", "building Checkmate's model (its free-after-last-use rows)")
    U = model.U
    for t in range(n):
        clock.check("ilp", "building Checkmate's model (its memory rows)")
        previous = None
        for k in slots[t]:
            U[t, k] = variable(f"U_{t}_{k}", upper=None, binary=False)
            if previous is None:  # entering the stage: everything checkpointed, then k's result
                terms = [(mem[i], s(t, i)) for i in range(t)]
            else:  # what was held after the previous computation, less what was freed after it
                freed = [i for i in (*costs.preds[previous], previous) if (t, i, previous) in FREE]
                terms = [(1, U[t, previous])] + [(-mem[i], FREE[t, i, previous]) for i in freed]
            rows.add(f"mem_{t}_{k}", [(1, U[t, k])] + [(-c, e) for c, e in terms] + [(-mem[k], r(t, k))], ">=")
            during = [(1, U[t, k]), (workspace[k], r(t, k))]
            if budget is None:
                rows.add(f"peak_{t}_{k}", during + [(-1, model.peak)], "<=")
            else:
                row = rows.add(f"budget_{t}_{k}", during, "<=", budget / scales.mem_unit)
                model.budget_rows.append((row, -row.constant - budget / scales.mem_unit))
            previous = k

    problem.setObjective(objective)
    LOG.debug("ilp: model of %d nodes built in %.1f s: %d variables, %d rows", n, time.perf_counter() - started,
              len(variables), len(rows.added))
    return model


# --------------------------------------------------------------------------------------------
# Between schedules and model values
# --------------------------------------------------------------------------------------------


def compute_order(model: CheckmateModel, values: dict | None = None) -> list[int]:
    """The compute order (node positions) encoded by ``R``: stage by stage, ascending within one."""

    def on(var) -> bool:
        value = values[var] if values is not None else var.varValue
        return value is not None and value > 0.5

    return [i for t in range(model.costs.n) for i in model.slots[t] if i == t or on(model.R[t, i])]


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


def model_values(model: CheckmateModel, graph, schedule: Schedule) -> dict | None:
    """Values of every model variable for ``schedule`` (a warm start), or ``None`` when the model
    cannot express its computations. (Whether they meet the model's budget is
    :func:`_check_values`'s to say.)

    The schedule's computations are kept, less any whose result nobody reads, and its frees are
    replaced by the earliest ones (:func:`schedule_from_computes`), which never hold more.
    """
    costs = model.costs
    nodes = drop_redundant_computes(graph, schedule.computes())
    stages = stages_of_order(costs, [costs.index[v] for v in nodes])
    if stages is None:
        return None
    steps = schedule_from_computes(graph, nodes).steps
    values: dict = {var: 0.0 for var in model.variables}
    held: set[int] = set()
    stage_of = [t for t, stage in enumerate(stages) for _ in stage]
    position = -1
    last: tuple[int, int] | None = None  # (stage, node) of the latest compute
    for kind, node in steps:
        i = costs.index[node]
        if kind == COMPUTE:
            position += 1
            t = stage_of[position]
            if last is None or last[0] != t:
                # held entering stage t
                if not all(_set_one(model.s(t, h), values) for h in held):
                    return None
            if not _set_one(model.r(t, i), values):
                return None
            held.add(i)
            last = (t, i)
        else:
            t, k = last
            held.discard(i)
            if k == t:
                continue  # a free after the stage's last computation: not a model variable
            var = model.FREE.get((t, i, k))
            if var is None:
                return None
            values[var] = 1.0
    # Memory: evaluate the recursion of build_model with these values.
    mem = [m / model.scales.mem_unit for m in costs.mem]
    peak = 0.0

    def value(entry) -> float:
        return float(entry) if _is_const(entry) else values[entry]

    for t in range(costs.n):
        previous = None
        for k in model.slots[t]:
            if previous is None:
                u = sum(mem[i] * value(model.s(t, i)) for i in range(t)) + mem[k] * value(model.r(t, k))
            else:
                u = values[model.U[t, previous]] + mem[k] * value(model.r(t, k))
                u -= sum(mem[i] * values[model.FREE[t, i, previous]]
                         for i in (*costs.preds[previous], previous) if (t, i, previous) in model.FREE)
            values[model.U[t, k]] = u
            if value(model.r(t, k)) > 0.5:
                peak = max(peak, u + costs.workspace[k] / model.scales.mem_unit)
            previous = k
    if model.peak is not None:
        values[model.peak] = max(peak, model.peak.lowBound or 0.0)
    return values


def _check_values(model: CheckmateModel, values: dict, tolerance: float = 1e-6) -> bool:
    """Whether ``values`` satisfy every constraint of the model (a guard on the warm start)."""
    import pulp

    for constraint in model.rows:
        activity = sum(coefficient * values[var] for var, coefficient in constraint.items()) + constraint.constant
        if constraint.sense == pulp.LpConstraintEQ and abs(activity) > tolerance:
            return False
        if constraint.sense == pulp.LpConstraintLE and activity > tolerance:
            return False
        if constraint.sense == pulp.LpConstraintGE and activity < -tolerance:
            return False
    return True


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


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


def _highs_solver(ends_at: float | None, threads, warm: dict | None, relax: bool, gap_abs: float | None,
                  target: float | None = None):
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
            for position, row in enumerate(lp._constraints.values()):
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
                size = len(lp.variables()) + len(lp._constraints)
                reserve = min(0.5 * left, HIGHS_SECONDS_AFTER_LIMIT_PER_ENTRY * size)
                lp.solverModel.setOptionValue("time_limit", max(0.01, left - reserve))
            lp.solverModel.run()

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
    problem.solve(_highs_solver(ends_at, threads, warm, relax, gap_abs, target))
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


# --------------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A checked schedule: valid, within the budget, with its cost in seconds."""

    schedule: Schedule
    cost: float
    peak: int
    source: str


def _candidate(graph, schedule: Schedule, budget: int | None, source: str, outcome=None) -> Candidate | None:
    """``schedule`` checked by the simulator (``outcome``: its result, when the caller has it)."""
    outcome = simulate(graph, schedule) if outcome is None else outcome
    if not outcome.valid or (budget is not None and outcome.peak_bytes > budget):
        return None
    return Candidate(schedule, outcome.compute_cost, outcome.peak_bytes, source)


def model_lower_bound(costs: NodeCosts) -> int:
    """A peak no schedule with the fixed first-computation order can go below (bytes).

    Computing t needs its inputs held, and every pinned node computed before it; the last
    computation (node n-1) also needs every other output held.
    """
    bound = 0
    pinned_before = 0
    for t in range(costs.n):
        needed = set(costs.preds[t])
        if t == costs.n - 1:
            needed |= {i for i in range(t) if costs.output[i]}
        during = costs.mem[t] + costs.workspace[t] + sum(costs.mem[i] for i in needed)
        during += pinned_before - sum(costs.mem[i] for i in needed if costs.pinned[i])
        bound = max(bound, during)
        if costs.pinned[t]:
            pinned_before += costs.mem[t]
    return bound


def warm_start_candidates(graph, budget: int, deadline: Clock) -> list[Candidate]:
    """Schedules from the heuristic methods that fit ``budget``, cheapest first.

    A method that is infeasible, out of time or unavailable gives none
    (:func:`solvers.options.schedule_from`); any other failure of it is a bug and propagates.
    """
    found = []
    for method in WARM_START_METHODS:
        if deadline.expired():
            break
        schedule = schedule_from(graph, budget, method, deadline.share(WARM_START_SHARE))
        candidate = None if schedule is None else _candidate(graph, schedule, budget, method)
        if candidate is not None:
            found.append(candidate)
    return sorted(found, key=lambda c: c.cost)


def _given_candidates(graph, budget: int, schedules: Sequence[Schedule]) -> list[Candidate]:
    """The caller's warm starts that fit ``budget``; a schedule that is not a valid schedule of
    ``graph`` is the caller's mistake and is refused (a start over the budget is only unusable)."""
    found = []
    for index, schedule in enumerate(schedules):
        if not isinstance(schedule, Schedule):
            raise ValueError(f"warm_starts[{index}] is a {type(schedule).__name__}, not a Schedule")
        outcome = simulate(graph, schedule)
        if not outcome.valid:
            raise ValueError(f"warm_starts[{index}] is not a valid schedule of this graph: {outcome.error}")
        source = f"the given {schedule.info.method} schedule" if schedule.info.method else "a given schedule"
        candidate = _candidate(graph, schedule, budget, source, outcome)
        found += [candidate] if candidate is not None else []
    return found


def _best_start(model: CheckmateModel, graph, candidates: Sequence[Candidate]) -> tuple[dict | None, Candidate | None]:
    """The cheapest candidate the model can express, as variable values."""
    for candidate in candidates:
        values = model_values(model, graph, candidate.schedule)
        if values is not None and _check_values(model, values):
            return values, candidate
    return None, None


def _info(status: str, cost: float, lower_bound: float | None, message: str = "") -> SolverInfo:
    gap = None
    if lower_bound is not None:
        lower_bound = min(lower_bound, cost)
        gap = 0.0 if cost <= 0 else (cost - lower_bound) / cost
        gap = 0.0 if gap < 1e-9 else gap  # below the solvers' tolerances: rounding noise
    return SolverInfo(method="ilp", status=status, gap=gap, lower_bound=lower_bound, message=message)


@dataclass
class MinimumBudget:
    """The smallest peak (bytes) found for the model, the schedule that has it, and whether no
    smaller one exists (proven by a bound)."""

    peak: int
    schedule: Candidate
    proven: bool


def minimum_budget(graph, costs: NodeCosts, backend: str, time_limit: float | None, threads: int | None,
                   exact: bool = True, samples: int = 16, seed: int = 0, stop_at: int | None = None) -> MinimumBudget:
    """The smallest budget (bytes) the model can meet.

    Cheap candidates first: store-all, "hold nothing across stages" (every stage recomputes what
    it needs from scratch) and roundings of the LP that minimises the peak; the counting bound and
    that LP's value bound it from below. With ``exact``, the MILP minimising the peak (same
    constraints, warm-started with the best candidate) closes the gap within ``time_limit``.
    Whatever is returned is a budget the model meets; ``proven`` says whether it is the least.
    With ``stop_at`` (bytes) the search stops at the first schedule that peaks at most that: a
    feasibility search for a tight budget.
    """
    deadline = Clock(time_limit)
    scales = Scales.of(costs)
    lower = model_lower_bound(costs)
    nothing_held = [{i for i in range(t) if costs.pinned[i]} for t in range(costs.n)]
    nothing_held.append({i for i in range(costs.n) if costs.output[i]})
    orders = [list(range(costs.n)), least_recomputation(costs, nothing_held)]
    found = [_candidate(graph, schedule_of_order(graph, costs, order), None, "") for order in orders if order]
    best = min((c for c in found if c is not None), key=lambda c: c.peak)
    if best.peak <= lower:
        return MinimumBudget(best.peak, best, True)

    model = build_model(costs, None, scales, peak_bounds=(lower, best.peak), clock=deadline)
    relaxed = run_backend(model, backend, deadline.left(), threads, relax=True)
    if relaxed.optimal and relaxed.objective is not None:
        bound = relaxed.objective * scales.mem_unit
        lower = max(lower, math.ceil(bound - max(1e-6, 1e-9 * bound)))
    if relaxed.has_solution:
        for _source, held in _roundings(model, relaxed.values, samples, random.Random(seed)):
            order = least_recomputation(costs, held)
            candidate = None if order is None else _candidate(graph, schedule_of_order(graph, costs, order), None, "")
            if candidate is not None and candidate.peak < best.peak:
                best = candidate
    left = deadline.left()
    done = stop_at is not None and best.peak <= stop_at
    if best.peak <= lower or done or not exact or (left is not None and left <= 0):
        return MinimumBudget(best.peak, best, best.peak <= lower)

    warm = model_values(model, graph, best.schedule)
    warm = warm if warm is not None and _check_values(model, warm) else None
    # An absolute gap of half a byte: the peak is a whole number of bytes.
    target = None if stop_at is None else stop_at / scales.mem_unit
    outcome = run_backend(model, backend, left, threads, warm, gap_abs=0.5 / scales.mem_unit, target=target)
    if outcome.has_solution:
        order = compute_order(model, outcome.values)
        candidate = _candidate(graph, schedule_of_order(graph, costs, order), None, "")
        if candidate is not None and candidate.peak < best.peak:
            best = candidate
    return MinimumBudget(best.peak, best, outcome.optimal or best.peak <= lower)


def _no_schedule(graph, costs, budget, backend, deadline: Clock, threads, why: str, exact: bool) -> Schedule:
    """Raise :class:`Infeasible` with the model's minimum budget in it (``why``: the proof that
    ``budget`` is out of the model's reach).

    Should the search for the minimum find a schedule within ``budget`` after all (the only way is
    a solver tolerance misjudging the budget rows by a few bytes), that schedule is returned. When
    the time limit passes before the exact minimum is proven, :class:`SolverTimeout` is raised
    instead: an ``Infeasible`` would report an unproven minimum as the least budget (issue 17:
    "minimum 194 MiB" after 1 s, where 122 MiB is met with 120 s). With ``exact=False``
    (lp-rounding) the minimum is the least that method's search reaches, said to be unproven.
    """
    try:
        least = minimum_budget(graph, costs, backend, deadline.left(), threads, exact=exact)
    except SolverTimeout:  # the limit passed while building the model that minimises the peak
        least = None
    if least is not None and least.peak <= budget:
        found = least.schedule
        return _finish(found, budget, FEASIBLE, None, f"{why}, but a schedule that minimises the peak fits")
    if least is None or (exact and not least.proven):
        found = "" if least is None else f" (the least peak found is {least.peak} bytes, not proven minimal)"
        raise SolverTimeout(f"ilp: {why}, so {budget} bytes is out of reach of Checkmate's model, but its least "
                            f"budget was not proven within the time limit of {deadline.limit:g} s{found}",
                            method="ilp")
    qualifier = "" if least.proven else " (not proven minimal: a budget the model can meet)"
    raise Infeasible(f"{why}; Checkmate's model (fixed first-computation order) needs at least {least.peak} bytes"
                     f"{qualifier}", min_budget=least.peak, method="ilp")


def _out_of_time(budget: int, deadline: Clock) -> SolverTimeout:
    return SolverTimeout(f"ilp: no schedule within {budget} bytes found in the time limit ({deadline.limit:g} s); "
                         "the budget is neither met nor proven infeasible", method="ilp")


def _finish(found: Candidate, budget: int, status: str, bound: float | None, message: str) -> Schedule:
    """The schedule with its report (``solve()`` fills in the same numbers when it is the caller)."""
    info = _info(status, found.cost, bound, message)
    return found.schedule.with_info(**{**info.__dict__, "budget_bytes": budget, "compute_cost": found.cost,
                                       "predicted_peak_bytes": found.peak})


def _low_memory_start(graph, costs, budget, backend, deadline, threads) -> list[Candidate]:
    """The least-memory schedule that :func:`minimum_budget` finds without a MILP, if it fits."""
    least = minimum_budget(graph, costs, backend, deadline.left(), threads, exact=False)
    if least.peak > budget:
        return []
    return [Candidate(least.schedule.schedule, least.schedule.cost, least.peak, "a least-memory schedule")]


def _or_best_candidate(solve, candidates: Sequence[Candidate], budget: int) -> Schedule:
    """``solve()``, or, when the time limit passes before it has a schedule (the model may take
    longer to build than the limit allows), the cheapest candidate, which fits the budget."""
    try:
        return solve()
    except SolverTimeout as error:
        if not candidates:
            raise
        best = min(candidates, key=lambda c: c.cost)
        return _finish(best, budget, FEASIBLE, None, f"{error}; returning the cheapest start ({best.source})")


def _solve_exact(graph, costs, budget, backend, deadline, threads, candidates, warm_start, samples, rng) -> Schedule:
    scales = Scales.of(costs)
    messages = []
    pool = [c for c in candidates if expressible(graph, costs, c.schedule)]
    lp_bound = None
    model = build_model(costs, budget, scales, clock=deadline)
    if warm_start:
        # The LP relaxation first: it proves infeasibility cheaply, its roundings are often optimal
        # (HiGHS otherwise spends most of its time looking for a first incumbent), and when the
        # best start meets the LP bound no MILP is needed at all.
        rounded = lp_rounding(model, graph, budget, backend, deadline, threads, samples, rng, fractions=(1.0, 0.9))
        if rounded.infeasible:
            return _no_schedule(graph, costs, budget, backend, deadline, threads,
                                f"the LP relaxation is infeasible at {budget} bytes", exact=True)
        lp_bound = rounded.lower_bound
        pool += [rounded.best] if rounded.best is not None else []
        if not pool and deadline.expired():
            raise _out_of_time(budget, deadline)
        if not pool:
            # A tight budget: nothing cheap fits. Without a start HiGHS can spend minutes before
            # its first incumbent, while the MILP that minimises the peak, stopped at the first
            # schedule within the budget, is a much easier feasibility problem. It also settles
            # infeasibility when it proves the model's minimum above the budget.
            least = minimum_budget(graph, costs, backend, deadline.left(), threads, stop_at=budget)
            if least.peak <= budget:
                pool.append(Candidate(least.schedule.schedule, least.schedule.cost, least.peak,
                                      "a least-memory schedule"))
            elif least.proven:
                raise Infeasible(f"no schedule fits in {budget} bytes; Checkmate's model (fixed first-"
                                 f"computation order) needs at least {least.peak} bytes",
                                 min_budget=least.peak, method="ilp")
    pool.sort(key=lambda c: c.cost)
    if pool and _proven(pool[0].cost, lp_bound):
        return _finish(pool[0], budget, OPTIMAL, lp_bound, f"{pool[0].source} meets the LP bound")

    model_budget = float(budget)
    for _attempt in range(TIGHTEN_ATTEMPTS + 1):
        model.set_budget(math.floor(model_budget))
        warm, started_from = _best_start(model, graph, pool)
        if started_from is None and deadline.expired():
            raise _out_of_time(budget, deadline)
        if started_from is not None and deadline.expired():
            # Loading the model into the backend alone takes seconds at 200 nodes: not past the limit.
            messages.append(f"time limit reached before the MILP; returning the cheapest start ({started_from.source})")
            return _finish(started_from, budget, FEASIBLE, lp_bound, "; ".join(messages))
        outcome = run_backend(model, backend, deadline.left(), threads, warm)
        if outcome.infeasible:
            return _no_schedule(graph, costs, budget, backend, deadline, threads,
                                f"the MILP is infeasible at {budget} bytes", exact=True)
        if started_from is not None:
            messages.append(f"warm start from {started_from.source} (cost {started_from.cost:.6g} s)")
        # A tightened model's bound is no bound for the real budget: only the LP's is left then.
        tightened = model_budget < budget
        bound = None if outcome.bound is None or tightened else outcome.bound * scales.cost_unit
        if lp_bound is not None:
            bound = lp_bound if bound is None else max(bound, lp_bound)
        if not outcome.has_solution:
            if not outcome.stopped:  # neither a solution, nor infeasible, nor out of time
                raise RuntimeError(f"ilp: the {backend} backend ended without a verdict on the MILP")
            if started_from is not None:  # the backend dropped the start; it is still a valid answer
                messages.append("time limit reached; returning the warm start")
                return _finish(started_from, budget, FEASIBLE, bound, "; ".join(messages))
            raise _out_of_time(budget, deadline)
        schedule = schedule_of_order(graph, costs, compute_order(model, outcome.values))
        found = _candidate(graph, schedule, budget, "milp")
        if found is None:
            # The solver's tolerances let the memory rows overshoot by a few bytes: ask for less.
            peak = simulate(graph, schedule).peak_bytes
            model_budget -= max(1.0, (peak - budget) * 2)
            messages.append(f"tightened the MILP budget after a {peak}-byte solution")
            continue
        if started_from is not None and started_from.cost < found.cost:
            found = started_from  # an incumbent worse than its own start: only by the solver's tolerance
        status = OPTIMAL if outcome.optimal and not tightened else FEASIBLE
        if status == OPTIMAL and bound is None:
            bound = found.cost
        if not outcome.optimal:
            messages.append("time limit reached before optimality was proven")
        return _finish(found, budget, status, bound, "; ".join(messages))
    raise RuntimeError(f"ilp: the MILP's solutions overshoot the budget of {budget} bytes after "
                       f"{TIGHTEN_ATTEMPTS} tightenings; this is a numerical problem in the backend")


# ---- LP relaxation + rounding (Checkmate §5) ----


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


def _roundings(model: CheckmateModel, values: dict, samples: int, rng: random.Random):
    """Held sets from the LP's ``S``: Checkmate's deterministic threshold rounding at a few
    thresholds, then Bernoulli samples with the LP values as probabilities."""
    costs = model.costs
    n = costs.n
    by_stage: list[list[tuple[int, float]]] = [[] for _ in range(n + 1)]
    for (t, i), var in model.S.items():
        by_stage[t].append((i, values[var]))
    fixed = [{i for i in range(t) if _is_one(model.s(t, i))} for t in range(n)]
    fixed.append({i for i in range(n) if costs.output[i]})  # held at the end

    def held_sets(choose) -> list[set[int]]:
        return [fixed[t] | {i for i, value in by_stage[t] if choose(value)} for t in range(n + 1)]

    for threshold in (0.5, 0.25, 0.75, 0.1, 0.9, 1e-6):
        yield f"threshold {threshold}", held_sets(lambda value, th=threshold: value >= th)
    for sample in range(samples):
        yield f"sample {sample}", held_sets(lambda value: rng.random() < value)


@dataclass
class Rounded:
    """What the LP relaxation and its roundings give."""

    lower_bound: float | None  # the LP optimum at the full budget (seconds), when solved to optimality
    infeasible: bool  # the LP at the full budget is infeasible, hence the MILP too
    best: Candidate | None  # the cheapest rounding that fits the budget
    tried: int  # distinct compute orders simulated


def lp_rounding(model: CheckmateModel, graph, budget: int, backend: str, deadline: Clock, threads: int | None,
                samples: int, rng: random.Random, fractions: Sequence[float] = LP_BUDGET_FRACTIONS) -> Rounded:
    """Checkmate §5: solve the LP relaxation, round ``S`` (thresholds, then Bernoulli samples), take
    the least recomputation for each rounding, and keep the cheapest whose simulated peak fits.

    The LP is solved at ``budget * fraction`` for each fraction in turn (loosest first) until some
    rounding fits: a tighter LP leaves room for what rounding adds. ``model`` is left at
    ``budget``.
    """
    costs = model.costs
    result = Rounded(None, False, None, 0)
    seen: set[tuple[int, ...]] = set()
    try:
        for fraction in fractions:
            model.set_budget(budget * fraction)
            outcome = run_backend(model, backend, deadline.left(), threads, relax=True)
            if fraction == fractions[0]:
                if outcome.infeasible:
                    result.infeasible = True
                    return result
                if outcome.optimal and outcome.objective is not None:  # a time-limited LP bounds nothing
                    result.lower_bound = outcome.objective * model.scales.cost_unit
            if outcome.has_solution:
                for source, held in _roundings(model, outcome.values, samples, rng):
                    if result.best is not None and deadline.expired():
                        break  # each rounding is simulated: ~20 ms at 200 nodes, ~1 s for all 54
                    order = least_recomputation(costs, held)
                    if order is None or tuple(order) in seen:
                        continue
                    seen.add(tuple(order))
                    candidate = _candidate(graph, schedule_of_order(graph, costs, order), budget,
                                           f"LP rounding ({source}, LP at {fraction:g} x budget)")
                    if candidate is not None and (result.best is None or candidate.cost < result.best.cost):
                        result.best = candidate
            left = deadline.left()
            if result.best is not None or (left is not None and left <= 0):
                break
    finally:
        model.set_budget(budget)
        result.tried = len(seen)
    return result


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


def _proven(cost: float, bound: float | None) -> bool:
    """Whether a lower bound proves ``cost`` optimal, up to the LP solver's tolerance."""
    return bound is not None and cost - bound <= 1e-7 * max(abs(cost), 1e-9)


def _solve_lp_rounding(graph, costs, budget, backend, deadline, threads, candidates, samples, seed) -> Schedule:
    model = build_model(costs, budget, Scales.of(costs), clock=deadline)
    rounded = lp_rounding(model, graph, budget, backend, deadline, threads, samples, random.Random(seed))
    if rounded.infeasible:
        return _no_schedule(graph, costs, budget, backend, deadline, threads,
                            f"the LP relaxation is infeasible at {budget} bytes", exact=False)
    pool = [c for c in candidates if expressible(graph, costs, c.schedule)]
    pool += [rounded.best] if rounded.best is not None else []
    pool = pool or _low_memory_start(graph, costs, budget, backend, deadline, threads)
    if not pool:
        least = minimum_budget(graph, costs, backend, deadline.left(), threads, exact=False)
        raise Infeasible(f"LP rounding found no schedule within {budget} bytes (the LP relaxation is feasible, but "
                         f"every rounding overshoots); the least peak it reaches is {least.peak} bytes, not proven "
                         "minimal: mode='exact' may meet smaller budgets", min_budget=least.peak, method="ilp")
    best = min(pool, key=lambda c: c.cost)
    status = OPTIMAL if _proven(best.cost, rounded.lower_bound) else FEASIBLE
    message = f"LP relaxation + rounding ({rounded.tried} roundings); best from {best.source}"
    return _finish(best, budget, status, rounded.lower_bound, message)


def _order_free(schedule: Schedule, bound: float) -> Schedule:
    """The schedule's report made true over every order of computation.

    The model's optimum and its bounds (MILP, LP) hold only in its fixed order of first
    computations; ``bound`` (:func:`solvers.bounds.cost_lower_bound`, seconds) holds in every order.
    So: ``optimal`` only where ``bound`` meets the cost; a schedule the model proved optimal is
    otherwise ``optimal-in-order``; ``lower_bound`` and ``gap`` are ``bound``'s, and the in-order
    gap goes into the message.
    """
    info = schedule.info
    cost = info.compute_cost
    if math.isinf(bound):  # no schedule fits, yet this one does: a bug in the bound
        raise AssertionError(f"ilp: the order-free cost bound says no schedule fits {info.budget_bytes} bytes")
    notes = []
    if _proven(cost, bound):
        status = OPTIMAL
    elif info.status == OPTIMAL:
        status = OPTIMAL_IN_ORDER
        notes.append("optimal in its order of first computations (Checkmate's model fixes that order; "
                     "a schedule in another order may be cheaper)")
    else:
        status = FEASIBLE
        if info.gap is not None:
            notes.append(f"gap {info.gap:.2%} in its order of first computations")
    lower = min(bound, cost)
    gap = 0.0 if cost <= 0 or status == OPTIMAL else (cost - lower) / cost
    message = "; ".join(notes + ([info.message] if info.message else []))
    return schedule.with_info(status=status, lower_bound=lower, gap=gap, message=message)


def solve_ilp(graph, budget: int, time_limit: float | None = None, *, backend: str = "highs",
              mode: str = "exact", threads: int | None = None, warm_start: bool = True,
              warm_starts: Sequence[Schedule] = (), rounding_samples: int = DEFAULT_ROUNDING_SAMPLES,
              seed: int = 0, max_nodes: int = MAX_NODES) -> Schedule:
    """Checkmate's MILP for ``graph`` under ``budget`` bytes (see the module docstring).

    ``backend``: "highs" (highspy through PuLP) or "cbc" (PuLP's bundled CBC). ``mode``: "exact"
    (the MILP) or "lp-rounding" (the LP relaxation and randomized rounding, for graphs too large to
    solve exactly). The model fixes the order of first computations, so its proofs hold in that
    order only: ``status`` is "optimal-in-order" when the MILP (or the LP value) proves the schedule
    optimal in its order, "optimal" only when :func:`solvers.bounds.cost_lower_bound`, a bound over
    every order, meets its cost, else "feasible"; ``lower_bound`` and ``gap`` are that order-free
    bound's, and the message gives the gap in the model's order. ``time_limit`` (seconds; default
    :data:`solvers.options.DEFAULT_TIME_LIMIT`) bounds the whole call: heuristic warm starts,
    building the model, loading it into the backend, solving, the minimum budget. When it passes
    the cheapest start within the budget is returned, or :class:`SolverTimeout` raised. ``warm_start``: start from the cheapest heuristic or LP-rounded schedule the
    model expresses (False: the bare MILP). ``warm_starts``: schedules of ``graph`` to start from
    besides the heuristics' (another solver's, a previous plan's); those within the budget join the
    candidates, and when one is the cheapest its first-computation order becomes the model's, so the
    result is never above it and its gap is measured in that order. ``rounding_samples``/``seed``:
    Bernoulli roundings of the LP. ``threads``: HiGHS/CBC threads. ``max_nodes``: the model has
    ~n^2 binaries; larger graphs are refused rather than left to build for many minutes.
    """
    validate(graph)
    check_backend(backend)
    if mode not in MODES:
        raise ValueError(f"unknown ilp mode {mode!r}; accepted: {', '.join(MODES)}")
    deadline = Clock(time_limit_or_default(time_limit))
    n = graph.number_of_nodes()
    if n > max_nodes:
        raise ValueError(f"ilp: the graph has {n} nodes; Checkmate's model would have ~{n ** 2:,} "
                         f"binaries, more than PuLP builds in reasonable time and memory (limit: max_nodes="
                         f"{max_nodes}). Use a coarser profile, or the cpsat, dp or chen-greedy methods")
    if n == 0:
        return _finish(Candidate(Schedule([]), 0.0, 0, "empty graph"), budget, OPTIMAL, 0.0, "empty graph")

    # Store-all computes every node once: no schedule is cheaper, so when it fits it is optimal.
    trace_costs = node_costs(graph)
    store_all = _candidate(graph, schedule_of_order(graph, trace_costs, range(n)), None, "store-all")
    if store_all.peak <= budget:
        return _finish(store_all, budget, OPTIMAL, store_all.cost, "store-all fits")

    given = _given_candidates(graph, budget, warm_starts)
    candidates = sorted(given + (warm_start_candidates(graph, budget, deadline) if warm_start else []),
                        key=lambda c: c.cost)
    # The model's fixed first-computation order: the cheapest heuristic schedule's, so that the
    # model expresses it (the default order often cannot: the chain methods' backward runs each
    # gradient's consumers in a different order than the trace did), else the trace's order.
    order = next((o for o in (first_computation_order(graph, c.schedule) for c in candidates) if o), None)
    costs = trace_costs if order is None else node_costs(graph, order)
    # What every schedule within the budget costs, in any order: the only bound worth reporting.
    order_free = cost_lower_bound(costs, budget, min(BOUND_SECONDS, 0.1 * (deadline.left() or 0.0)))
    bound = model_lower_bound(costs)
    if budget < bound and not candidates:
        return _order_free(_no_schedule(graph, costs, budget, backend, deadline, threads,
                                        f"{budget} bytes is below {bound} bytes, what some computation needs at once",
                                        exact=mode == "exact"), order_free)
    if mode == "exact":
        schedule = _or_best_candidate(
            lambda: _solve_exact(graph, costs, budget, backend, deadline, threads, candidates, warm_start,
                                 rounding_samples, random.Random(seed)), candidates, budget)
    else:
        schedule = _or_best_candidate(
            lambda: _solve_lp_rounding(graph, costs, budget, backend, deadline, threads, candidates,
                                       rounding_samples, seed), candidates, budget)
    return _order_free(schedule, order_free)
