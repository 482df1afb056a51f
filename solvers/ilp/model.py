"""Checkmate's MILP as sparse arrays: columns, then rows in CSR, built stage by stage with numpy
(:mod:`solvers.ilp` has the formulation; :mod:`solvers.ilp.backends` loads the arrays into HiGHS in
one call, or hands them to CBC through PuLP).

Each family of rows is one function, called once per stage ``t``; inside a stage the rows are
numpy operations over the stage's nodes, edges or (input, reader) pairs, so a 1001-node graph's
model (~2.6 million columns) builds in seconds where the PuLP model it replaces took minutes
(docs/solvers-lp.md has the measurements).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..clock import Clock
from ..errors import SolverTimeout
from ..graph import NodeCosts

LOG = logging.getLogger(__name__)

INFINITY = math.inf
# Seconds of building per column, an upper estimate: a 1001-node training graph's 2.6 million
# columns were built in 5.3-5.6 s and passed to HiGHS in 1.4-2.2 s at load averages of 3-8 on this
# project's 2-core machine (~3e-6 s per column; docs/solvers-lp.md). What the method uses to refuse,
# before building, a model that cannot be built in the time left.
BUILD_SECONDS_PER_COLUMN = 5e-6


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
    """The model's columns and rows as arrays, and where each variable is.

    ``r_col[t, i]``, ``s_col[t, i]`` and ``u_col[t, k]`` are the columns of ``R``, ``S`` and ``U``
    (-1 where the entry is fixed: :meth:`r` and :meth:`s` give the fixed values); ``FREE``'s columns
    are ``free_cols[t]``'s range, one per ``(free_i, free_k)`` entry there. Rows are
    ``row_lower <= A x <= row_upper`` with ``A`` in CSR (``row_start``, ``row_index``,
    ``row_value``). The objective is ``col_cost . x + objective_constant``.
    """

    costs: NodeCosts
    scales: Scales
    slots: list[list[int]]  # slots[t]: nodes that may be computed in stage t, ascending; t is last
    r_col: np.ndarray
    s_col: np.ndarray
    u_col: np.ndarray
    free_i: np.ndarray  # per FREE column (in column order, from free_base): the freed node...
    free_k: np.ndarray  # ...and the node after whose computation it is freed
    free_t: np.ndarray  # ...and the stage
    free_base: int
    col_cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray  # bool per column
    row_start: np.ndarray
    row_index: np.ndarray
    row_value: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    objective_constant: float  # the first computations' cost (normalised): R[t,t] = 1 is not a column
    # The rows U[t,k] + workspace[k] R[t,k] <= budget and the part of their upper bound that is not
    # the budget (a fixed R[t,t] = 1 moves -workspace[t] there).
    budget_rows: np.ndarray
    budget_fixed: np.ndarray
    peak: int | None = None  # the min-peak model's objective column
    u_cols: slice = field(default_factory=lambda: slice(0, 0))  # U's columns
    build_seconds: float = 0.0
    _free_index: dict | None = field(default=None, repr=False)

    @property
    def num_cols(self) -> int:
        return len(self.col_cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    @property
    def num_nonzeros(self) -> int:
        return len(self.row_index)

    def set_budget(self, budget: float) -> None:
        """Change the budget (bytes) of the memory rows in place: the LP of lp-rounding at a
        fraction of the budget, a tightened MILP, all without rebuilding the model."""
        self.row_upper[self.budget_rows] = budget / self.scales.mem_unit + self.budget_fixed
        self.col_upper[self.u_cols] = budget / self.scales.mem_unit

    def r(self, t: int, i: int) -> tuple[int, int]:
        """``R[t,i]`` as ``(column, fixed value)``: column -1 when the entry is fixed."""
        if i == t:
            return -1, 1
        column = int(self.r_col[t, i]) if i < t else -1
        return column, 0

    def s(self, t: int, i: int) -> tuple[int, int]:
        """``S[t,i]`` for 0 <= t <= n (``S[n,i]`` = held at the end) as ``(column, fixed value)``."""
        costs = self.costs
        if i >= t:
            return -1, 0
        if costs.pinned[i]:
            return -1, 1  # pinned: held from its first computation (stage i) to the end
        if t == costs.n:
            return -1, 1 if costs.output[i] else 0
        return int(self.s_col[t, i]), 0

    def free(self, t: int, i: int, k: int) -> int:
        """The column of ``FREE[t,i,k]``, -1 when there is none."""
        if self._free_index is None:
            keys = zip(self.free_t.tolist(), self.free_i.tolist(), self.free_k.tolist())
            self._free_index = {key: self.free_base + position for position, key in enumerate(keys)}
        return self._free_index.get((t, i, k), -1)

    def held_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every ``S`` column with its stage and node: ``(t, i, column)`` arrays."""
        t, i = np.nonzero(self.s_col >= 0)
        return t, i, self.s_col[t, i]


def estimated_columns(costs: NodeCosts) -> int:
    """About how many columns Checkmate's model of ``costs`` has (an upper estimate, in O(n + edges)):
    one R, S and U per (stage, earlier node) that can be recomputed or held, one FREE per (stage,
    edge or node) whose reader can be recomputed."""
    n = costs.n
    later = np.arange(n - 1, -1, -1, dtype=np.int64)  # stages after node k's own
    pinned = np.array(costs.pinned, dtype=bool)
    has_succ = np.array([bool(s) for s in costs.succs], dtype=bool)
    base = ~pinned & has_succ
    hold = ~pinned & (has_succ | np.array(costs.output, dtype=bool))
    readers = np.array([len(p) + 1 for p in costs.preds], dtype=np.int64)
    recompute = int((later * base).sum())
    return 2 * recompute + int((later * hold).sum()) + int((later * base * readers).sum()) + n


class _Blocks:
    """Rows collected block by block as (row, column, value) triplets with local row numbers, made
    CSR at the end; zero coefficients are dropped."""

    def __init__(self):
        self.rows = 0
        self.lengths: list[np.ndarray] = []
        self.index: list[np.ndarray] = []
        self.value: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []

    def add(self, count: int, row: np.ndarray, column: np.ndarray, value: np.ndarray, lower, upper) -> np.ndarray:
        """``count`` rows; returns their numbers."""
        numbers = np.arange(self.rows, self.rows + count, dtype=np.int64)
        if count == 0:
            return numbers
        if np.any(column < 0):
            raise AssertionError("ilp model: a row refers to an entry that has no column")
        keep = value != 0
        row, column, value = row[keep], column[keep], value[keep]
        order = np.argsort(row, kind="stable")
        self.lengths.append(np.bincount(row, minlength=count))
        self.index.append(column[order].astype(np.int32))
        self.value.append(value[order].astype(np.float64))
        self.lower.append(np.broadcast_to(np.asarray(lower, dtype=np.float64), (count,)))
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (count,)))
        self.rows += count
        return numbers

    def csr(self):
        def joined(parts, dtype):
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

        lengths = joined(self.lengths, np.int64)
        start = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=start[1:])
        return (start, joined(self.index, np.int32), joined(self.value, np.float64),
                joined(self.lower, np.float64).copy(), joined(self.upper, np.float64).copy())


def _triplets(*terms) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate ``(rows, columns, values)`` term groups (a scalar value broadcasts)."""
    rows, columns, values = [], [], []
    for row, column, value in terms:
        row = np.asarray(row, dtype=np.int64)
        rows.append(row)
        columns.append(np.asarray(column, dtype=np.int64))
        values.append(np.broadcast_to(np.asarray(value, dtype=np.float64), row.shape))
    return np.concatenate(rows), np.concatenate(columns), np.concatenate(values)


class _Builder:
    """One model's construction: the graph as arrays, the columns laid out, the rows collected."""

    def __init__(self, costs: NodeCosts, scales: Scales, clock: Clock):
        self.costs, self.scales, self.clock = costs, scales, clock
        n = self.n = costs.n
        self.pinned = np.array(costs.pinned, dtype=bool)
        self.output = np.array(costs.output, dtype=bool)
        has_succ = np.array([bool(s) for s in costs.succs], dtype=bool)
        self.base = ~self.pinned & has_succ  # may be recomputed in any later stage
        # an output sink may be recomputed in the last stage only (to be held at the end)
        self.at_last = self.base | (~self.pinned & ~has_succ & self.output)
        self.hold = ~self.pinned & (has_succ | self.output)
        self.mem = np.array(costs.mem, dtype=np.float64) / scales.mem_unit
        self.workspace = np.array(costs.workspace, dtype=np.float64) / scales.mem_unit
        self.pinned_before = np.concatenate([[0.0], np.cumsum(self.mem * self.pinned)])
        # (input, reader) pairs and the reader itself, by reader then input: FREE[t,i,k] per pair
        pair_i = [i for k in range(n) for i in (*costs.preds[k], k)]
        pair_k = [k for k in range(n) for _ in range(len(costs.preds[k]) + 1)]
        keep = [not costs.pinned[i] for i in pair_i]
        self.pair_i = np.array(pair_i, dtype=np.int64)[keep]
        self.pair_k = np.array(pair_k, dtype=np.int64)[keep]
        edge = self.pair_i != self.pair_k
        self.edge_i, self.edge_k = self.pair_i[edge], self.pair_k[edge]  # by reader
        self.pred_of = np.zeros(n, dtype=bool)
        self.blocks = _Blocks()

    def check(self, family: str) -> None:
        """Charge the build to the clock: :class:`SolverTimeout` once the limit has passed."""
        self.clock.check("ilp", f"building Checkmate's model (its {family})")

    def slot_ok(self, t: int) -> np.ndarray:
        return self.at_last if t == self.n - 1 else self.base

    # -- columns ------------------------------------------------------------------------------
    def columns(self, with_peak: bool) -> None:
        n, costs = self.n, self.costs
        self.slots = []
        r_t, r_i = [], []
        for t in range(n):
            recompute = np.flatnonzero(self.slot_ok(t)[:t])
            self.slots.append(recompute.tolist() + [t])
            r_t.append(np.full(len(recompute), t, dtype=np.int64))
            r_i.append(recompute)
        r_t, r_i = np.concatenate(r_t), np.concatenate(r_i)
        self.r_col = np.full((n, n), -1, dtype=np.int32)
        self.r_col[r_t, r_i] = np.arange(len(r_t))
        self.r_t, self.r_i = r_t, r_i
        columns = len(r_t)
        self.check("R columns")

        hold_idx = np.flatnonzero(self.hold)
        counts = np.searchsorted(hold_idx, np.arange(n))  # held nodes before each stage
        counts[0] = 0
        s_t = np.repeat(np.arange(n, dtype=np.int64), counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        s_i = hold_idx[np.arange(len(s_t)) - np.repeat(starts, counts)]
        self.s_col = np.full((n, n), -1, dtype=np.int32)
        self.s_col[s_t, s_i] = columns + np.arange(len(s_t))
        columns += len(s_t)
        self.check("S columns")

        # FREE[t,i,k]: k recomputed in stage t (k < t), i an input of k or k itself, not pinned,
        # not an output in the last stage (held at the end), and not read by t itself.
        self.free_base = columns
        pairs_before = np.searchsorted(self.pair_k, np.arange(n))  # pairs whose reader is before t
        free_t, free_pair = [], []
        self.free_start = [columns]
        for t in range(n):
            if t % 64 == 0:
                self.check("FREE columns")
            head = pairs_before[t]
            pi, pk = self.pair_i[:head], self.pair_k[:head]
            self.pred_of[list(costs.preds[t])] = True
            active = self.slot_ok(t)[pk] & ~self.pred_of[pi]
            self.pred_of[list(costs.preds[t])] = False
            if t == n - 1:
                active &= ~self.output[pi]
            chosen = np.flatnonzero(active)
            free_pair.append(chosen)
            free_t.append(np.full(len(chosen), t, dtype=np.int64))
            columns += len(chosen)
            self.free_start.append(columns)
        self.free_pair = free_pair  # per stage: the pairs with a FREE column, in column order
        self.free_t = np.concatenate(free_t)
        every = np.concatenate(free_pair)
        self.free_i, self.free_k = self.pair_i[every], self.pair_k[every]

        lengths = np.array([len(slot) for slot in self.slots], dtype=np.int64)
        self.u_col = np.full((n, n), -1, dtype=np.int32)
        u_t = np.repeat(np.arange(n, dtype=np.int64), lengths)
        u_k = np.concatenate([np.asarray(slot, dtype=np.int64) for slot in self.slots])
        self.u_col[u_t, u_k] = columns + np.arange(len(u_t))
        self.u_start = columns + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        columns += len(u_t)
        self.peak = columns if with_peak else None
        columns += int(with_peak)

        self.col_cost = np.zeros(columns, dtype=np.float64)
        self.col_lower = np.zeros(columns, dtype=np.float64)
        self.col_upper = np.ones(columns, dtype=np.float64)
        self.integer = np.ones(columns, dtype=bool)
        self.u_cols = slice(columns - len(u_t) - int(with_peak), columns - int(with_peak))
        self.col_upper[self.u_cols] = INFINITY  # bounded by the budget (or the peak's upper bound) below
        self.integer[self.u_cols] = False
        if with_peak:
            self.integer[self.peak] = False

    # -- rows ---------------------------------------------------------------------------------
    def no_recomputation_of_held(self) -> None:
        """R[t,i] + S[t,i] <= 1: no recomputation of a held result (our semantics; the paper allows
        it and double-counts). Every R column has an S column: what may be recomputed may be held."""
        count = len(self.r_t)
        rows = np.arange(count)
        r = self.r_col[self.r_t, self.r_i]
        s = self.s_col[self.r_t, self.r_i]
        self.blocks.add(count, *_triplets((rows, r, 1.0), (rows, s, 1.0)), -INFINITY, 1.0)

    def dependencies(self, t: int) -> None:
        """R[t,k] <= R[t,i] + S[t,i] for each input i of k: k can be computed in stage t only if each
        input is held entering the stage or computed earlier in it (ascending order within a stage
        makes "earlier" = smaller). Inputs that are pinned are held: no row."""
        ei, ek = self.edge_i, self.edge_k
        lo, hi = np.searchsorted(ek, t), np.searchsorted(ek, t, side="right")
        earlier = np.flatnonzero(self.slot_ok(t)[ek[:lo]])
        own = np.arange(lo, hi)  # k = t: R[t,t] = 1
        ie, ke, io = ei[earlier], ek[earlier], ei[own]
        count_e, count_o = len(earlier), len(own)
        rows_e, rows_o = np.arange(count_e), count_e + np.arange(count_o)
        triplets = _triplets((rows_e, self.r_col[t, ke], 1.0), (rows_e, self.r_col[t, ie], -1.0),
                             (rows_e, self.s_col[t, ie], -1.0), (rows_o, self.r_col[t, io], -1.0),
                             (rows_o, self.s_col[t, io], -1.0))
        upper = np.concatenate([np.zeros(count_e), np.full(count_o, -1.0)])
        self.blocks.add(count_e + count_o, *triplets, -INFINITY, upper)

    def conservation(self, t: int) -> None:
        """S[t+1,i] + sum_k FREE[t,i,k] <= R[t,i] + S[t,i] (the paper's S[t+1,i] <= S[t,i] + R[t,i],
        strengthened): a result present in stage t (held entering or computed; never both) is kept
        into stage t+1 or freed once. Results computed before t that may be held only; none before
        stage 1."""
        n = self.n
        held = np.flatnonzero(self.hold[:t])
        free_i = self.pair_i[self.free_pair[t]]
        frees = np.bincount(free_i, minlength=n)[held] if len(free_i) else np.zeros(len(held), dtype=np.int64)
        if t + 1 < n:
            rows_of = held  # keep S[t+1,i] is a column: every held node has its row
        else:  # S[n,i] = 1 for an output (held at the end): a row; otherwise only with frees
            rows_of = held[self.output[held] | (frees > 0)]
        keep_one = self.output[rows_of].astype(np.float64) if t + 1 == n else np.zeros(len(rows_of))
        count = len(rows_of)
        if count == 0:
            return
        local = np.full(n, -1, dtype=np.int64)
        local[rows_of] = np.arange(count)
        rows = np.arange(count)
        r = self.r_col[t, rows_of]
        has_r = r >= 0
        terms = [(rows[has_r], r[has_r], -1.0), (rows, self.s_col[t, rows_of], -1.0)]
        if t + 1 < n:
            terms.append((rows, self.s_col[t + 1, rows_of], 1.0))
        if len(free_i):
            columns = np.arange(self.free_start[t], self.free_start[t + 1])
            terms.append((local[free_i], columns, 1.0))
        self.blocks.add(count, *_triplets(*terms), -INFINITY, -keep_one)

    def free_after_last_use(self) -> None:
        """FREE[t,i,k] <= R[t,k]: free only after a computation that happens."""
        count = len(self.free_t)
        rows = np.arange(count)
        columns = self.free_base + rows
        r = self.r_col[self.free_t, self.free_k]
        self.blocks.add(count, *_triplets((rows, columns, 1.0), (rows, r, -1.0)), -INFINITY, 0.0)

    def last_use_triples(self) -> None:
        """(pair (i, k), later reader j of i): sorted by j, then i, then k, so that the triples of
        one row (i, j) are consecutive and those with j < t are a prefix."""
        costs = self.costs
        p, j = [], []
        for position, (i, k) in enumerate(zip(self.pair_i.tolist(), self.pair_k.tolist())):
            for reader in costs.succs[i]:
                if reader > k:
                    p.append(position)
                    j.append(reader)
        p, j = np.array(p, dtype=np.int64), np.array(j, dtype=np.int64)
        order = np.lexsort((self.pair_k[p] if len(p) else p, self.pair_i[p] if len(p) else p, j))
        self.triple_p, self.triple_j = p[order], j[order]
        group = self.pair_i[self.triple_p] * self.n + self.triple_j if len(p) else p
        self.triple_group = group
        self.free_of_pair = np.full(len(self.pair_i), -1, dtype=np.int64)

    def last_use(self, t: int) -> None:
        """Free only after the last reader: per later reader j of i in stage t,
        R[t,j] + sum_{k < j} FREE[t,i,k] <= 1, which for binaries is the paper's product form
        (linearised as upper bounds) and gives a tighter LP than one row per (k, j) pair."""
        pairs = self.free_pair[t]
        if not len(pairs):
            return
        self.free_of_pair[pairs] = np.arange(self.free_start[t], self.free_start[t + 1])
        head = np.searchsorted(self.triple_j, t)  # readers before t (t itself reads no freed i)
        tp, tj = self.triple_p[:head], self.triple_j[:head]
        free = self.free_of_pair[tp]
        active = np.flatnonzero((free >= 0) & self.slot_ok(t)[tj])
        self.free_of_pair[pairs] = -1
        if not len(active):
            return
        group = self.triple_group[:head][active]
        first = np.concatenate([[True], group[1:] != group[:-1]])
        local = np.cumsum(first) - 1
        count = int(local[-1]) + 1
        readers = tj[active][first]
        triplets = _triplets((np.arange(count), self.r_col[t, readers], 1.0), (local, free[active], 1.0))
        self.blocks.add(count, *triplets, -INFINITY, 1.0)

    def memory(self, t: int, budget: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The memory recursion and the budget (or the peak), in units of ``scales.mem_unit``.

        U[t,k] is what is held right after computing k in stage t (before its frees); the step's
        memory is U[t,k] + workspace[k] while computing, at most the budget (or the peak column). U
        is only bounded from above, so the paper's equalities are written as lower bounds: the same
        integer solutions, and HiGHS separates cuts far faster without the equality chains.
        Returns the budget rows and the part of their upper bound that is not the budget.
        """
        slot = np.asarray(self.slots[t], dtype=np.int64)
        m = len(slot)
        u = self.u_start[t] + np.arange(m)
        recomputed = slot[:-1]
        r = self.r_col[t, recomputed]
        held = np.flatnonzero(self.hold[:t])
        pairs = self.free_pair[t]
        fi, fk = self.pair_i[pairs], self.pair_k[pairs]
        free_rows = np.searchsorted(slot, fk) + 1  # freed after slot[p-1]: row p
        free_columns = np.arange(self.free_start[t], self.free_start[t + 1])
        rows = np.arange(m)
        # row 0: U >= sum mem[i] S[t,i] (+ the pinned results) + mem[k] R[t,k]; row p: U[t,k_p] >=
        # U[t,k_{p-1}] - the results freed after k_{p-1} + mem[k_p] R[t,k_p]
        terms = [(rows, u, 1.0), (rows[1:], u[:-1], -1.0), (np.zeros(len(held)), self.s_col[t, held], -self.mem[held]),
                 (free_rows, free_columns, self.mem[fi]), (rows[:-1], r, -self.mem[recomputed])]
        lower = np.zeros(m)
        lower[0] += self.pinned_before[t]
        lower[-1] += self.mem[t]  # R[t,t] = 1
        self.blocks.add(m, *_triplets(*terms), lower, INFINITY)
        # during the computation of k: U[t,k] + workspace[k] R[t,k] <= budget (or the peak)
        during = [(rows, u, 1.0), (rows[:-1], r, self.workspace[recomputed])]
        fixed = np.zeros(m)
        fixed[-1] = -self.workspace[t]
        if budget is None:
            during.append((rows, np.full(m, self.peak), -1.0))
            self.blocks.add(m, *_triplets(*during), -INFINITY, fixed)
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        numbers = self.blocks.add(m, *_triplets(*during), -INFINITY, budget + fixed)
        return numbers, fixed


def build_model(costs: NodeCosts, budget: int | None, scales: Scales,
                peak_bounds: tuple[int, int] | None = None, clock: Clock | None = None) -> CheckmateModel:
    """Checkmate's MILP for a budget in bytes (``budget``), or, with ``budget=None``, the model
    that minimises the peak (``peak_bounds`` = (lower, upper) bytes) under the same constraints.

    Columns first (R, S, FREE, U, the peak), then one function per family of rows, stage by stage.
    The LP relaxation is the same model solved without integrality (``run_backend(relax=True)``).
    With a ``clock``, a model whose estimated build time exceeds the time left is refused before
    it is built, and the build is checked every few stages of each family: both raise
    :class:`SolverTimeout`, whose message says which.
    """
    started = time.perf_counter()
    if clock is not None:
        refuse_if_too_slow(costs, clock)
    build = _Builder(costs, scales, clock or Clock(None))
    build.columns(with_peak=budget is None)
    n = costs.n
    objective_constant = sum(costs.cost) / scales.cost_unit
    build.col_cost[:len(build.r_t)] = np.array(costs.cost, dtype=np.float64)[build.r_i] / scales.cost_unit
    build.no_recomputation_of_held()
    for t in range(n):
        if t % 32 == 0:
            build.check("dependency rows")
        build.dependencies(t)
    for t in range(1, n):
        if t % 32 == 0:
            build.check("conservation rows")
        build.conservation(t)
    build.free_after_last_use()
    build.last_use_triples()
    for t in range(n):
        if t % 32 == 0:
            build.check("free-after-last-use rows")
        build.last_use(t)
    scaled_budget = None if budget is None else budget / scales.mem_unit
    budget_rows, budget_fixed = [], []
    for t in range(n):
        if t % 32 == 0:
            build.check("memory rows")
        rows, fixed = build.memory(t, scaled_budget)
        budget_rows.append(rows)
        budget_fixed.append(fixed)
    # U is at most the budget (or the peak): implied by the budget rows (workspace >= 0), so the same
    # solutions; bounded, every column is, which keeps the LP's weak-duality bound finite
    # (solvers.ilp.backends.dual_bound).
    build.col_upper[build.u_cols] = (budget if budget is not None else peak_bounds[1]) / scales.mem_unit
    if budget is None:
        lower, upper = peak_bounds
        build.col_cost[:] = 0.0
        build.col_cost[build.peak] = 1.0
        build.col_lower[build.peak] = lower / scales.mem_unit
        build.col_upper[build.peak] = upper / scales.mem_unit
        objective_constant = 0.0
    start, index, value, row_lower, row_upper = build.blocks.csr()
    model = CheckmateModel(
        costs, scales, build.slots, build.r_col, build.s_col, build.u_col, build.free_i, build.free_k, build.free_t,
        build.free_base, build.col_cost, build.col_lower, build.col_upper, build.integer, start, index, value,
        row_lower, row_upper, objective_constant, np.concatenate(budget_rows), np.concatenate(budget_fixed),
        peak=build.peak, u_cols=build.u_cols, build_seconds=time.perf_counter() - started)
    LOG.debug("ilp: model of %d nodes built in %.1f s: %d columns, %d rows, %d nonzeros", n, model.build_seconds,
              model.num_cols, model.num_rows, model.num_nonzeros)
    return model


def refuse_if_too_slow(costs: NodeCosts, clock: Clock) -> None:
    """:class:`SolverTimeout` before building when the model's estimated build time
    (:func:`estimated_columns` at :data:`BUILD_SECONDS_PER_COLUMN`) exceeds the time left."""
    left = clock.left()
    if left is None:
        return
    columns = estimated_columns(costs)
    seconds = columns * BUILD_SECONDS_PER_COLUMN
    if seconds > left:
        raise SolverTimeout(f"ilp: Checkmate's model of {costs.n} nodes would have ~{columns:,} columns, "
                            f"~{seconds:.0f} s to build, more than the {left:.1f} s left of the time limit; "
                            "not built", method="ilp")
