"""The order-free relaxation (see the package docstring): milestones, columns, one function per
constraint family, built in bulk into highspy; its bound and the layouts of its solutions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..clock import Clock
from ..errors import SolverTimeout, SolverUnavailable
from ..graph import NodeCosts, node_costs

METHOD = "orderfree"
# Milestones are thinned (every k-th path node) until c and h have at most this many columns: a
# 1001-node chain with every 10th path node is ~100k columns (built in 1.7 s).
MAX_COLUMNS = 120_000
# The rows of the memory inside intervals (``OrderFreeModel._interval_memory``) are built on models of
# at most this many c and h columns. On larger ones they slow the MILP more than they help the
# layout, and the method repairs at smaller budgets instead: on the 1001-node chain (112 milestones,
# 168k columns) the MILP was proven in 12 s without them and unproven after 60 s with them, and its
# layout overshot the budget either way (by 13 bytes without, and with them at 28 milestones by the
# same 51 bytes as without).
INTERVAL_ROWS_MAX_COLUMNS = 50_000
# Seconds the other methods (ilp, cpsat, auto) give the bound at most: the small graphs' MILPs solve
# in milliseconds; larger ones keep the dual bound reached (or the LP's) when this passes.
ORDER_FREE_SECONDS = 10.0
# On models of at most this many columns HiGHS branches on pseudocosts from the start
# (``mip_pscost_minreliable = 0``: no strong branching to make them reliable first). Measured on
# Checkmate's MLSys graphs at point 0.2 (load 4.3-5): FCN-8s (6,040 columns) started from ilp's
# schedule proved optimal in 20.2 s (52.1 s with strong branching; its log had ~30 s of strong
# branching over 50 nodes), unstarted its bound reached +10.9% in 40 s (+9.5% in 45 s); VGG19
# (4,475 columns) optimal in 20.2 s (26.0 s). Larger models (the GPT-2 graphs', 18.8k and up) keep
# HiGHS's default: with the limit at 40,000 (2026-11-27, load ~1) auto and orderfree at 60 s on the
# 12-layer GPT-2 module3/module4 graphs returned the same schedules and gaps as with the default
# (+16.3% within 0.2%; +13.8% and +14.1% within 0.7% and 1.0%); module3's MILP alone for 280 s kept
# the root's bound either way (its incumbent within 0.15% with pseudocosts, 0.21% without).
PSEUDOCOST_MAX_COLUMNS = 10_000
# Seconds past its time limit after which a HiGHS run is cancelled (its own checks can be late).
CANCEL_GRACE = 0.5
# The solver's bound is lowered by this relative amount, against float noise in its arithmetic
# (below cpsat's optimality tolerance of 1e-9, so that a met bound still proves optimality).
BOUND_SAFETY = 1e-10


def longest_path(costs: NodeCosts) -> list[int]:
    """A path of the most nodes (positions in topological order), ties to the earliest."""
    length, previous = [1] * costs.n, [-1] * costs.n
    for v in range(costs.n):
        for u in costs.preds[v]:
            if length[u] + 1 > length[v]:
                length[v], previous[v] = length[u] + 1, u
    end = max(range(costs.n), key=lambda v: (length[v], -v)) if costs.n else -1
    path = []
    while end >= 0:
        path.append(end)
        end = previous[end]
    return path[::-1]


def earliest_intervals(costs: NodeCosts, marks: list[int]) -> list[int]:
    """``e[v]``: the last milestone number ``j`` (1-based) whose node is ``v`` or an ancestor of
    ``v`` (0 when none). ``v`` can be computed in interval ``i`` only for ``i >= e[v]``."""
    number = {x: j + 1 for j, x in enumerate(marks)}
    e = [0] * costs.n
    for v in range(costs.n):
        e[v] = max([e[u] for u in costs.preds[v]] + [number.get(v, 0)])
    return e


def choose_milestones(costs: NodeCosts, max_columns: int = MAX_COLUMNS) -> list[int]:
    """Every k-th node of a longest path (the last one always kept), k the least that keeps the
    model within ``max_columns`` columns. Any chain of ancestors keeps the bound valid."""
    path = longest_path(costs)
    for every in range(1, len(path) + 1):
        marks = path[len(path) - 1::-every][::-1]
        e = earliest_intervals(costs, marks)
        m = len(marks)
        if sum((m + 1 - ev) + (m - ev) for ev in e) <= max_columns:
            return marks
    return path[-1:]


class _Rows:
    """Sparse rows collected for one ``addRows`` call: ``lower <= sum(value * column) <= upper``."""

    def __init__(self):
        self.starts, self.indices, self.values, self.lower, self.upper = [], [], [], [], []

    def add(self, terms: dict[int, float], lower: float, upper: float) -> int:
        self.starts.append(len(self.indices))
        for column, value in terms.items():
            self.indices.append(column)
            self.values.append(value)
        self.lower.append(lower)
        self.upper.append(upper)
        return len(self.starts) - 1


class _Columns:
    """Columns collected for one ``addCols`` call: objective (seconds), bounds, integrality."""

    def __init__(self):
        self.objective, self.lower, self.upper, self.integer = [], [], [], []

    def add(self, cost: float = 0.0, lower: float = 0.0, upper: float = 1.0, integer: bool = True) -> int:
        self.objective.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.objective) - 1


@dataclass
class Relaxation:
    """What one solve of the relaxation gives: ``bound`` (seconds, valid over every schedule within
    the budget it was solved at; ``math.inf`` when none fits; ``None`` when the solver gave none),
    ``layouts`` (compute orders of the optimum or incumbent, positions), ``proven`` (MILP optimal)."""

    bound: float | None
    layouts: list[list[int]] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)  # the c columns at 1
    proven: bool = False
    infeasible: bool = False
    values: list[float] | None = None  # the solution's column values, where there is one
    objective: float | None = None  # its cost (seconds)


@dataclass
class OrderFreeModel:
    """The relaxation of the module docstring for one graph and budget, held in a ``highspy.Highs``."""

    costs: NodeCosts
    budget: int
    marks: list[int]
    c: dict = field(default_factory=dict)  # (interval, v) -> column
    h: dict = field(default_factory=dict)  # (milestone, v) -> column
    z: dict = field(default_factory=dict)  # (interval, v) -> column: held throughout interval i
    w: dict = field(default_factory=dict)  # interval -> column: the most bytes a computation in it adds
    memory_rows: list = field(default_factory=list)  # (row, bytes its computation adds) per memory row
    highs: object = None
    infeasible: bool = False  # a milestone's own step does not fit: no schedule does
    # Whether the in-interval memory rows are built (None: where c and h have at most
    # INTERVAL_ROWS_MAX_COLUMNS columns). Valid rows, so either way the bound holds.
    interval_rows: bool | None = None

    # -- columns ------------------------------------------------------------------------------
    def _columns(self, cols: _Columns) -> None:
        """c[i,v] for i >= e[v]; h[j,v] for e[v] < j <= M (binaries). c[j, x_j] is fixed to 1, and
        the inputs of x_j are fixed held at t_j (they are read by its computation)."""
        costs, m = self.costs, len(self.marks)
        e = earliest_intervals(costs, self.marks)
        for v in range(costs.n):
            for i in range(e[v], m + 1):
                self.c[i, v] = cols.add(costs.cost[v])
            for j in range(e[v] + 1, m + 1):
                self.h[j, v] = cols.add()
        for j, x in enumerate(self.marks, start=1):
            cols.lower[self.c[j, x]] = 1.0  # x_j is first computed at t_j, in interval j
            for u in costs.preds[x]:
                cols.lower[self.h[j, u]] = 1.0  # its inputs are held while it is computed

    # -- rows: one function per family --------------------------------------------------------
    def _memory(self, rows: _Rows) -> None:
        """At t_j: held bytes + mem[x_j] + workspace[x_j] <= budget."""
        costs = self.costs
        for j, x in enumerate(self.marks, start=1):
            own = costs.mem[x] + costs.workspace[x]
            if own > self.budget:
                self.infeasible = True
            terms = {self.h[j, v]: float(costs.mem[v]) for v in range(costs.n) if (j, v) in self.h and costs.mem[v]}
            self.memory_rows.append((rows.add(terms, -math.inf, float(self.budget - own)), own))

    def _held_through(self, rows: _Rows, cols: _Columns) -> None:
        """z[i,u] (1 <= i <= M): u is held throughout interval i. A result held at t_i and at
        t_{i+1} (an output: at the end) and not computed in between is:
        z[i,u] >= h[i,u] + h[i+1,u] - c[i,u] - 1. z appears only with positive bytes in memory rows,
        so a solution sets it no higher than that (a schedule's point reads it off as that bound)."""
        costs, m = self.costs, len(self.marks)
        for i in range(1, m + 1):
            for u in range(costs.n):
                if (i, u) not in self.h:
                    continue
                after = self.h.get((i + 1, u)) if i < m else None
                if i < m and after is None or i == m and not costs.output[u]:
                    continue
                self.z[i, u] = cols.add()
                terms = {self.z[i, u]: 1.0, self.h[i, u]: -1.0, self.c[i, u]: 1.0}
                if after is not None:
                    terms[after] = -1.0
                rows.add(terms, -1.0 if after is not None else 0.0, math.inf)

    def _interval_memory(self, rows: _Rows, cols: _Columns) -> None:
        """Memory during a computation inside interval i (1 <= i <= M). Computing v there holds the
        results held throughout the interval, v's inputs, v and its workspace. As one row per v
        (sum_{u not v, not an input} mem[u] z[i,u] + own[v] c[i,v] <= budget, own[v] = mem[v] +
        workspace[v] + its inputs' bytes) this is ~n terms per computation (~n^2 per interval; a
        1001-node chain's 112 intervals had rows for the first few only). Instead one continuous
        w[i] >= 0, the most bytes a computation in the interval adds to those held throughout:
          w[i] >= own[v] c[i,v] - sum_{u input of v} mem[u] z[i,u]   (each v computed there but x_i)
          sum_u mem[u] z[i,u] + w[i] <= budget.
        Together they say the same as the per-v rows (an input held throughout is counted once;
        z[i,v] is 0 where c[i,v] is 1 in a schedule's point), in ~(inputs + 2) terms per v.
        Valid: a schedule's point sets w[i] to the largest right-hand side (or 0, since what is held
        throughout the interval is held at t_i and fits). This is what lets the laid-out optimum fit:
        the milestones alone do not see the recomputations between them."""
        costs, m = self.costs, len(self.marks)
        for i in range(1, m + 1):
            through = {u: self.z[i, u] for u in range(costs.n) if (i, u) in self.z}
            worst = self.w[i] = cols.add(lower=0.0, upper=math.inf, integer=False)
            for v in range(costs.n):
                if (i, v) not in self.c or self.marks[i - 1] == v:
                    continue
                inputs = costs.preds[v]
                own = costs.mem[v] + costs.workspace[v] + sum(costs.mem[u] for u in inputs)
                terms = {worst: 1.0, self.c[i, v]: -float(own)}
                terms.update({through[u]: float(costs.mem[u]) for u in inputs if u in through and costs.mem[u]})
                rows.add(terms, 0.0, math.inf)
            terms = {column: float(costs.mem[u]) for u, column in through.items() if costs.mem[u]}
            terms[worst] = 1.0
            self.memory_rows.append((rows.add(terms, -math.inf, float(self.budget)), 0))

    def _holding(self, rows: _Rows) -> None:
        """Held at t_j implies computed in interval j-1 or held at t_{j-1}: h[j,v] <= c[j-1,v] + h[j-1,v]."""
        for (j, v), column in self.h.items():
            terms = {column: 1.0, self.c[j - 1, v]: -1.0}
            if (j - 1, v) in self.h:
                terms[self.h[j - 1, v]] = -1.0
            rows.add(terms, -math.inf, 0.0)

    def _reads(self, rows: _Rows) -> None:
        """Computed in interval i implies each input computed in interval i or held at t_i:
        c[i,v] <= c[i,u] + h[i,u]. (x_i in its own interval reads inputs fixed held.)"""
        costs = self.costs
        for (i, v), column in self.c.items():
            if i >= 1 and self.marks[i - 1] == v:
                continue
            for u in costs.preds[v]:
                terms = {column: 1.0, self.c[i, u]: -1.0}
                if (i, u) in self.h:
                    terms[self.h[i, u]] = -1.0
                rows.add(terms, -math.inf, 0.0)

    def _coverage(self, rows: _Rows) -> None:
        """Every node computed at least once; sinks (whose earlier computations nobody reads) and
        pinned nodes (never freed, so never recomputed) exactly once."""
        costs, m = self.costs, len(self.marks)
        for v in range(costs.n):
            terms = {self.c[i, v]: 1.0 for i in range(m + 1) if (i, v) in self.c}
            once = not costs.succs[v] or costs.pinned[v]
            rows.add(terms, 1.0, 1.0 if once else math.inf)

    def _pinned_held(self, rows: _Rows) -> None:
        """A pinned node, once computed, is held at every later milestone: sum_{i<j} c[i,v] <= h[j,v]."""
        for (j, v), column in self.h.items():
            if self.costs.pinned[v]:
                terms = {self.c[i, v]: 1.0 for i in range(j) if (i, v) in self.c}
                terms[column] = -1.0
                rows.add(terms, -math.inf, 0.0)

    def _outputs_held(self, rows: _Rows) -> None:
        """An output is held at the end, so held at t_M or computed in interval M: h[M,v] + c[M,v] >= 1."""
        m = len(self.marks)
        for v in range(self.costs.n):
            if self.costs.output[v]:
                terms = {self.c[m, v]: 1.0}
                if (m, v) in self.h:
                    terms[self.h[m, v]] = 1.0
                rows.add(terms, 1.0, math.inf)

    def build(self, clock: Clock | None = None) -> OrderFreeModel:
        """Columns and rows into highspy in bulk (three calls), the clock checked between families."""
        import numpy as np
        try:
            import highspy
        except ImportError as error:
            raise SolverUnavailable(f"orderfree needs highspy (pip install highspy; {error})") from error
        cols, rows = _Columns(), _Rows()
        self._columns(cols)
        self._held_through(rows, cols)
        for family in (self._memory, self._holding, self._reads, self._coverage, self._pinned_held,
                       self._outputs_held):
            if clock is not None:
                clock.check(METHOD, "building the order-free model")
            family(rows)
        if self.interval_rows or self.interval_rows is None and len(cols.objective) <= INTERVAL_ROWS_MAX_COLUMNS:
            self._interval_memory(rows, cols)
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 1e-9)
        if len(cols.objective) <= PSEUDOCOST_MAX_COLUMNS:
            highs.setOptionValue("mip_pscost_minreliable", 0)
        infinity = highspy.kHighsInf
        clip = lambda values: np.clip(np.array(values, dtype=np.float64), -infinity, infinity)
        n_cols = len(cols.objective)
        highs.addCols(n_cols, np.array(cols.objective, dtype=np.float64), clip(cols.lower), clip(cols.upper), 0,
                      np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64))
        highs.addRows(len(rows.starts), clip(rows.lower), clip(rows.upper), len(rows.indices),
                      np.array(rows.starts, dtype=np.int32), np.array(rows.indices, dtype=np.int32),
                      np.array(rows.values, dtype=np.float64))
        integer, continuous = int(highspy.HighsVarType.kInteger), int(highspy.HighsVarType.kContinuous)
        self.integrality = np.array([integer if flag else continuous for flag in cols.integer], dtype=np.uint8)
        self.column_bounds = (clip(cols.lower), clip(cols.upper))  # as built (the window search restores them)
        self.highs = highs
        return self

    def set_budget(self, budget: int) -> None:
        """The memory rows at another budget (the repair's smaller budgets)."""
        import highspy

        self.budget = budget
        for row, own in self.memory_rows:
            self.highs.changeRowBounds(row, -highspy.kHighsInf, float(budget - own))

    def solve(self, seconds: float | None, integral: bool = True, give_up=None,
              below: float | None = None) -> Relaxation:
        """Solve the MILP (or its LP relaxation) within ``seconds``: its bound and laid-out solution.
        ``give_up(seconds_run, gap)``, called as the MILP runs (``gap``: its incumbent's relative
        distance to its dual bound, ``None`` before it has one), stops it when it returns True;
        the bound and incumbent reached stand, as at a time limit. ``below`` (seconds): only
        solutions cheaper than this are sought (HiGHS's ``objective_bound``), and the first one found
        ends the run; its dual bound is then no bound (left ``None``)."""
        import highspy
        import numpy as np

        if self.infeasible or any(own > self.budget for _, own in self.memory_rows):
            return Relaxation(math.inf, infeasible=True)
        highs = self.highs
        n_cols = len(self.integrality)
        kind = self.integrality if integral else np.zeros(n_cols, dtype=np.uint8)
        highs.changeColsIntegrality(n_cols, np.arange(n_cols, dtype=np.int32), kind)
        if seconds is not None:
            highs.setOptionValue("time_limit", max(0.01, float(seconds)))
        highs.setOptionValue("objective_bound", highspy.kHighsInf if below is None else float(below))
        _run(highs, seconds, give_up if integral else None, below if integral else None)
        status, info, kinds = highs.getModelStatus(), highs.getInfo(), highspy.HighsModelStatus
        if status in (kinds.kInfeasible, kinds.kUnboundedOrInfeasible):
            # below a cut-off, infeasible says only that nothing is cheaper than ``below``
            return Relaxation(None) if below is not None else Relaxation(math.inf, infeasible=True)
        optimal = status == kinds.kOptimal
        if integral:
            bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
        else:
            bound = info.objective_function_value if optimal else None  # a stopped LP bounds nothing
        if below is not None:
            bound = None  # a search cut off at ``below`` bounds nothing
        elif bound is not None:
            bound -= BOUND_SAFETY * max(1.0, abs(bound))
        has_solution = integral and info.primal_solution_status == 2  # kSolutionStatusFeasible
        if has_solution and below is not None and not info.objective_function_value < below:
            has_solution = False  # HiGHS keeps a solution above its cut-off (measured: +80% below +11.6%)
        values = highs.getSolution().col_value if has_solution else None
        layouts = self.layouts(values) if has_solution else []
        chosen = [column for column in self.c.values() if values[column] > 0.5] if has_solution else []
        objective = info.objective_function_value if has_solution else None
        return Relaxation(bound, layouts, chosen, proven=integral and optimal, values=values, objective=objective)

    def exclude(self, chosen: list[int]) -> None:
        """A no-good cut: some c column differs from ``chosen`` (the c columns at 1). It removes
        feasible points, so a bound solved after it is no bound (only the first solve's is used)."""
        import highspy
        import numpy as np

        ones = set(chosen)
        columns = sorted(self.c.values())
        values = [-1.0 if column in ones else 1.0 for column in columns]
        self.highs.addRow(1.0 - len(ones), highspy.kHighsInf, len(columns), np.array(columns, dtype=np.int32),
                          np.array(values, dtype=np.float64))

    def layouts(self, values) -> list[list[int]]:
        """The solution as compute orders: interval by interval, x_i first (its inputs are held),
        then the interval's other computations, each after its inputs computed in the interval.
        Two orders within an interval: topological (by position), and greedy on memory (next, the
        ready computation whose result, less the inputs it is the last in the interval to read and
        that are not held at the next milestone, adds the fewest bytes). The milestones do not fix
        the order between them, and on DAGs that order decides the peak."""
        costs, m = self.costs, len(self.marks)
        chosen = [[v for v in range(costs.n) if (i, v) in self.c and values[self.c[i, v]] > 0.5] for i in range(m + 1)]
        plain, greedy = [], []
        for i, nodes in enumerate(chosen):
            first = [self.marks[i - 1]] if i >= 1 else []
            rest = [v for v in nodes if v not in first]
            plain += first + rest
            greedy += first + self._greedy(i, rest, set(first), values)
        return [plain] if greedy == plain else [plain, greedy]

    def _greedy(self, i: int, nodes: list[int], done: set, values) -> list[int]:
        costs, m = self.costs, len(self.marks)
        left = set(nodes)
        kept = {u for u in range(costs.n) if costs.output[u] or (i + 1 <= m and (i + 1, u) in self.h
                                                                  and values[self.h[i + 1, u]] > 0.5)}
        readers = {u: sum(1 for w in costs.succs[u] if w in left) for u in range(costs.n)}
        order = []
        while left:
            ready = [v for v in left if all(u not in left for u in costs.preds[v])]

            def added(v: int) -> int:
                freed = sum(costs.mem[u] for u in costs.preds[v] if readers[u] == 1 and u not in kept and u not in left)
                return costs.mem[v] - freed

            v = min(ready, key=lambda v: (added(v), v))
            order.append(v)
            left.discard(v)
            for u in costs.preds[v]:
                readers[u] -= 1
        return order


def _mip_gap(primal: float, dual: float) -> float | None:
    """The relative distance of a MILP's incumbent (``primal``, seconds) to its dual bound, ``None``
    without an incumbent."""
    if not math.isfinite(primal):
        return None
    return 0.0 if primal <= 0 else max(0.0, (primal - dual) / primal) if math.isfinite(dual) else 1.0


def _run(highs, seconds: float | None, give_up=None, below: float | None = None) -> None:
    """``highs.run()`` in highspy's worker thread, cancelled ``CANCEL_GRACE`` seconds after its
    time limit (measured: a 1001-node MILP given 23 s ran for 82 s, HiGHS checking its limit too
    seldom), when ``give_up`` says so or a solution cheaper than ``below`` is found (checked at
    HiGHS's MIP interrupt callbacks; with ``objective_bound`` at ``below``, HiGHS reports ``below``
    as its primal bound until then) and at Ctrl-C, which then propagates (as
    :func:`solvers.ilp.backends.run_interruptibly`).

    Every interrupt callback sets HiGHS's interrupt flag, to False as well: HiGHS keeps the flag
    between runs, and a run after an interrupted one stopped at once (measured: 0.1 s, no bound)."""
    import time

    import highspy

    stop = [False]
    mip = highspy.cb.HighsCallbackType.kCallbackMipInterrupt

    def check(event) -> None:
        if not stop[0] and event.callback_type == mip:
            out = event.data_out
            if give_up is not None:
                stop[0] = bool(give_up(out.running_time, _mip_gap(out.mip_primal_bound, out.mip_dual_bound)))
            if below is not None and out.mip_primal_bound < below * (1 - 1e-12):
                stop[0] = True
        event.interrupt(stop[0])

    def cancel() -> None:
        stop[0] = True
        highs.cancelSolve()

    events = (highs.cbSimplexInterrupt, highs.cbIpmInterrupt, highs.cbMipInterrupt)
    for event in events:
        event.subscribe(check)
    worker = highs.startSolve()
    ends = None if seconds is None else time.perf_counter() + seconds + CANCEL_GRACE
    try:
        while not highs.wait(0.1)[0]:
            if ends is not None and time.perf_counter() > ends:
                cancel()
                worker.join()
                return
    except KeyboardInterrupt:
        cancel()
        worker.join()
        raise
    finally:
        for event in events:
            event.unsubscribe(check)


def order_free_bound(graph, budget: int, seconds: float | None = 2.0, integral: bool = True,
                     costs: NodeCosts | None = None, max_columns: int = MAX_COLUMNS) -> float:
    """Seconds of computation every schedule of ``graph`` within ``budget`` bytes needs, in any order
    (package docstring): the relaxation's MILP dual bound (``integral``) or LP value, solved within
    ``seconds`` (building included); ``math.inf`` when no schedule fits. Never below computing
    every node once, which it returns when the time runs out first. ``costs``: the graph indexed
    in some topological order (default :func:`solvers.graph.node_costs`); ``max_columns`` thins
    the milestones (:func:`choose_milestones`)."""
    costs = node_costs(graph) if costs is None else costs
    once = float(sum(costs.cost))
    if costs.n == 0:
        return 0.0
    clock = Clock(seconds)
    try:
        model = OrderFreeModel(costs, budget, choose_milestones(costs, max_columns)).build(clock)
        # The LP first: a bound even where the MILP's root does not finish in time.
        results = [model.solve(clock.share(0.5) if integral else clock.left(), integral=False)]
        if integral and not results[0].infeasible and not clock.expired():
            results.append(model.solve(clock.left()))
    except (SolverTimeout, SolverUnavailable):
        return once
    if any(result.infeasible for result in results):
        return math.inf
    return max([once] + [result.bound for result in results if result.bound is not None])
