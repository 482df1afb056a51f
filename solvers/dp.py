"""``dp``: the heterogeneous-chain dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly and
Shilova, "Optimal checkpointing for heterogeneous chains: how to train deep neural networks with
limited memory" (2019), with the fix for its overshoot and without its discretisation loss.

The chain model and its memory accounting are :func:`solvers.chainmodel.simulate_chain`'s. The
program solves, for every sub-chain ``i..l`` (``0 <= i <= l <= L``) and every memory ``m``,

    C(i, l, m) = least time to turn ``x_i`` (held) and ``y_{l+1}`` (held) into ``y_i``,

where ``m`` is the memory the sub-problem may use *including* ``x_i``, ``y_{l+1}`` and the
``gout`` left by the backwards already run (stages > l, ``G[l+1] = gout[l+1] + ... + gout[L]``).
Counting them inside ``m`` (rotor counts ``m`` without ``x_i``) makes every shift below depend on
``i`` alone. With ``x[L+1] = 0`` (the loss has no incoming gradient):

- ``C(L, L, m) = bw[L]`` if ``m >= 2 x[L] + G[L] + btmp[L]`` (op ``L``).
- Infeasible if ``m < need(i, l) = x[i] + x[l+1] + G[l+1] + max(x[i+1] + ftmp[i],
  max_{i<k<l} x[k] + x[k+1] + ftmp[k])`` (l > i): some run of each ``F_k`` happens then.
- Otherwise (i < L) the min of
  (a) store input only, for ``j`` in ``i+1..l``:
      ``fw[i] + ... + fw[j-1] + C(j, l, m - x[i]) + C(i, j-1, m)``
      (ops ``CF_i Fn_{i+1} .. Fn_{j-1}``, then solve ``(j, l)``, then ``(i, j-1)``);
  (b) full history, if ``m >= x[i] + x[l+1] + G[l+1] + xbar[i+1] + ftmp[i]`` (``F_i`` with grad
      while ``y_{l+1}`` is live: the check rotor's published code misses, docs/algorithms.md trap 1) and
      ``m >= 2 x[i] + xbar[i+1] + x[i+1] + G[i] + btmp[i]`` (``B_i``):
      ``fw[i] + bw[i] + C(i+1, l, m - x[i] - xbar[i+1] + x[i+1])`` (ops ``Fe_i``, solve
      ``(i+1, l)``, ``B_i``; ``C(i+1, i, .) = 0``).
- Answer: ``C(0, L, budget)``, the budget counting ``x_0``.

The model is persistent, as the program assumes: a checkpoint (an ``x_i`` read by ``CF_i``) stays
held until ``B_i``. Without that rule a heterogeneous chain can do better (tests/test_dp.py).

Ties between equal makespans go to the sequence with fewer forward operations (trap 3: with
zero-time stages a plain min picks needless recomputations). Both are folded into one exact
integer key, ``ticks(time) * W + forwards``, kept below 2**52 so float64 sums stay exact.

Two engines evaluate the recurrence (solvers/dp_engines.py):

- the *grid* (:func:`_grid_tables`): ``C(i, l, .)`` as an array over memory levels ``0..M``,
  numpy-vectorised over the level and the split ``j``; each row is computed only between the
  sub-chain's least memory and the memory of its plan without recomputation. Exact when the
  unit is 1; with a coarser unit every size is rounded *up*, so the plan still fits (it may lose
  time: rotor's 500 levels lose up to ~16% near tight budgets, docs/algorithms.md trap 2).
- the *fronts* (:func:`_front_tables`): ``C(i, l, .)`` as its exact step function of memory (the
  memories at which it drops and its values), vectorised over all splits of a cell; one solve
  serves every budget, in bytes, at ~L^4 cost.

:func:`solve_chain` uses the unit-1 grid for small budgets (integer units), the fronts for chains
of up to :data:`FRONTS_MAX_STAGES` stages, and beyond that the finest affordable grid, certified
within 1% of the exact optimum by a second grid with sizes rounded *down* (a relaxation), the
fronts truncated at the budget deciding where the certificate fails. :func:`plan_chain` solves
once for every budget; :func:`solve_dp` runs the program on a cost graph through its chain view.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from .chain import ChainView, chain_views, coarsened
from .chainmodel import Chain, Op, simulate_chain
from .dp_engines import _Bounds, _bounds, _front_tables, _grid_tables, _Keys, _keys, _sequence, _Sizes, _sizes
from .errors import Infeasible
from .schedule import Schedule
from .simulate import simulate
from .store_all import store_all_schedule

__all__ = ["Chain", "ChainPlans", "ChainResult", "Op", "min_budget", "plan_chain", "solve_chain", "solve_dp"]

# The grid holds a float64 table of (L+1)^2 (M+1) entries and adds ~L^3 M / 6 of them: caps that
# keep one solve under 160 MB and a few seconds. Exact (unit 1) grids are used up to
# EXACT_GRID_LEVELS levels; above that the step functions are faster on chains they can handle.
MAX_GRID_CELLS = 2e7
MAX_GRID_WORK = 4e8
EXACT_GRID_LEVELS = 4096
# Chain views longer than this are also planned merged down to at most this many stages, where the
# caps above still allow ~2000 memory levels.
COARSE_STAGES = 100




# -- the public API ---------------------------------------------------------------------------------

# Exact step functions cost ~L^4: up to this many stages they take ~2 s or less (docs/solvers.md).
FRONTS_MAX_STAGES = 40


@dataclass(frozen=True)
class ChainResult:
    """A sequence for a budget: ``makespan`` (sum of op times), ``sequence`` (list of Op), ``peak``
    (its memory in the chain model, x_0 included), the ``budget`` asked for (chain unit), the
    memory ``unit`` the program ran in, the ``engine`` (``grid``, ``fronts``, or ``least-memory``
    where rounding left no plan) and ``exact``: optimal in the chain model (not only up to the
    discretisation)."""

    makespan: float
    sequence: list
    peak: int
    budget: int
    unit: int = 1
    engine: str = "grid"
    exact: bool = True
    lower_bound: float | None = None  # proven bound on the exact optimum (the makespan when exact)

    def __post_init__(self):
        if self.exact and self.lower_bound is None:
            object.__setattr__(self, "lower_bound", self.makespan)

    @property
    def recomputations(self) -> int:
        """Forward operations beyond one per stage."""
        forwards = [op.stage for op in self.sequence if op.kind in ("CF", "Fn", "Fe")]
        return len(forwards) - len(set(forwards))


def min_budget(chain: Chain) -> int:
    """The least budget (chain unit, x_0 included) at which the chain has a valid sequence.

    The recurrence with (min, +) replaced by (min, max) over memory: exact, O(L^3) on scalars.
    """
    return int(_bounds(_sizes(chain)).least[0, chain.length])


@dataclass(frozen=True)
class _LeastMemory:
    """The plan of least memory, unfolded from the (min, max) recurrence (memory is ignored)."""

    sizes: _Sizes
    bounds: _Bounds

    def choice_at(self, i: int, l: int, m: int) -> int:
        sz, least = self.sizes, self.bounds.least
        if i == sz.length or i == l:
            return i
        if max(int(self.bounds.need_b[i, l]), int(least[i + 1, l]) + sz.shift_b(i)) == least[i, l]:
            return i
        splits = np.maximum(least[i + 1 : l + 1, l] + sz.x[i], least[i, i:l])
        return i + 1 + int(np.argmin(splits))


@dataclass
class ChainPlans:
    """A chain solved once for every budget (:func:`plan_chain`); :meth:`plan` reads one off.

    ``engine``: ``"grid"`` (arrays over memory levels of ``unit``) or ``"fronts"`` (exact step
    functions in the chain's unit). Budgets up to ``top`` (chain unit; None: all) are covered.
    ``min_budget`` is exact.
    """

    chain: Chain
    engine: str
    unit: int
    min_budget: int
    top: int | None
    sizes: _Sizes = field(repr=False)
    table: object = field(repr=False)
    exact_sizes: _Sizes = field(repr=False)
    exact_bounds: _Bounds = field(repr=False)

    def budgets(self) -> list[int]:
        """Budgets (chain unit) at which the optimum changes, from the least: one plan each."""
        if self.engine == "fronts":
            return [int(m) for m in self.table.fronts[0, self.chain.length].mem]
        row = self.table.value[0, self.chain.length]
        changes = np.flatnonzero(np.isfinite(row) & np.concatenate(([True], row[1:] != row[:-1])))
        return [int(m) * self.unit for m in changes]

    def plan(self, budget: int) -> ChainResult:
        """The best sequence whose peak is at most ``budget`` (chain unit, x_0 included).

        Optimal unless the grid's unit is above 1: then the plans of the levels from
        ``budget // unit`` up are tried against the exact sizes (rounding up leaves slack), and
        where rounding leaves no plan at all, the least-memory plan is returned.
        """
        budget = math.floor(budget)  # sizes are whole units
        if budget < self.min_budget:
            raise _infeasible(budget, self.min_budget)
        length = self.chain.length
        if self.top is not None and budget > self.top:
            if self.top < self.exact_bounds.full[0, length]:
                raise ValueError(f"these plans cover budgets up to {self.top}; solve again for {budget}")
            budget = self.top  # from `full` on, the plan without recomputation is the best
        memory = int(budget) // self.unit
        if self.unit == 1:
            return self._result(_sequence(self.table.choice_at, self.sizes, memory), budget, exact=True)
        best = None
        for level in _levels_to_try(memory, self.table.levels):
            if self.table.choice_at(0, length, level) < 0:
                continue
            sequence = _sequence(self.table.choice_at, self.sizes, level)
            outcome = simulate_chain(self.chain, sequence, budget)
            if outcome.valid and (best is None or outcome.makespan < best[0]):
                best = (outcome.makespan, sequence)
        if best is None:
            least = _LeastMemory(self.exact_sizes, self.exact_bounds)
            return self._result(_sequence(least.choice_at, self.exact_sizes, 0), budget, False, "least-memory")
        return self._result(best[1], budget, exact=False)

    def _result(self, sequence: list, budget: int, exact: bool, engine: str | None = None) -> ChainResult:
        outcome = simulate_chain(self.chain, sequence, budget)
        if not outcome.valid:
            raise AssertionError(f"dp produced an invalid sequence: {outcome.error}")
        return ChainResult(outcome.makespan, sequence, outcome.peak, int(budget), self.unit, engine or self.engine, exact)


def _levels_to_try(start: int, top: int) -> list[int]:
    """``start`` and a geometric walk above it to ``top``: plans above the nominal level may
    still fit in exact sizes, and the best of them is what rounding would otherwise lose."""
    levels, step = [start], 1
    while start + step <= top:
        levels.append(start + step)
        step *= 2
    return levels


def _infeasible(budget: int, least: int) -> Infeasible:
    return Infeasible(
        f"the chain needs at least {least} (x_0 included) for any sequence; the budget is {budget}",
        min_budget=least,
        method="dp",
    )


def grid_levels_cap(length: int) -> int:
    """The most memory levels the grid engine uses for a chain of ``length`` stages."""
    stages = length + 1
    by_cells = MAX_GRID_CELLS / (stages * stages)
    by_work = MAX_GRID_WORK / max(1.0, stages**3 / 6)
    return int(max(1, min(by_cells, by_work)))


def plan_chain(chain: Chain, top: int | None = None, *, levels: int | None = None) -> ChainPlans:
    """Solve ``chain`` once for every budget up to ``top`` (chain unit; None: every budget).

    - ``levels=None`` (automatic): the grid in the chain's own unit (exact) when ``top`` is at
      most :data:`EXACT_GRID_LEVELS` and :func:`grid_levels_cap`; else the exact step functions
      (up to ``top``) when the chain has at most :data:`FRONTS_MAX_STAGES` stages or ``top`` is
      None; else the grid at the finest unit the cap allows (``ceil(top / cap)``), sizes rounded up.
    - ``levels=K``: rotor's discretisation, the grid over K levels of ``unit = ceil(top / K)``,
      sizes rounded up (plans fit; they may cost more near tight budgets).
    """
    exact_sizes = _sizes(chain)
    exact_bounds = _bounds(exact_sizes)
    least = int(exact_bounds.least[0, chain.length])
    keys = _keys(chain)
    cap = grid_levels_cap(chain.length)
    if top is not None:
        if not top >= 0:
            raise ValueError(f"top must be >= 0, got {top}")
        top = math.floor(top)
    exact_grid = top is not None and top <= min(cap, EXACT_GRID_LEVELS)
    if levels is None and (top is None or (not exact_grid and chain.length <= FRONTS_MAX_STAGES)):
        return _exact_plans(chain, top, exact_sizes, exact_bounds, keys)
    unit = max(1, -(-int(top) // int(levels if levels is not None else cap)))
    if unit == 1:
        sizes, bounds, top_level = exact_sizes, exact_bounds, int(top)
    else:
        sizes = _sizes(chain, unit)
        bounds = _bounds(sizes)
        # Room above the nominal level for plan.plan's upward search: sizes rounded up overstate
        # a plan's peak by < 1 unit per value held, a few % of the levels in practice.
        top_level = int(top) // unit + max(8, int(top) // unit // 16)
    grid = _grid_tables(sizes, keys, top_level, bounds)
    return ChainPlans(chain, "grid", unit, least, int(top), sizes, grid, exact_sizes, exact_bounds)


def _exact_plans(chain: Chain, top: int | None, sizes: _Sizes, bounds: _Bounds, keys: _Keys) -> ChainPlans:
    """The exact step functions, up to ``top`` (all budgets when None)."""
    fronts = _front_tables(sizes, keys, bounds, top)
    return ChainPlans(chain, "fronts", 1, int(bounds.least[0, chain.length]), top, sizes, fronts, sizes, bounds)


def _relaxed_makespan(chain: Chain, budget: int, unit: int) -> float:
    """The optimum with sizes rounded down to ``unit``: a lower bound on the exact optimum."""
    sizes = _sizes(chain, unit, down=True)
    bounds = _bounds(sizes)
    level = int(budget) // unit
    if bounds.least[0, chain.length] > level:
        return math.inf  # cannot happen when budget >= the exact least; kept for safety
    grid = _grid_tables(sizes, _keys(chain), level, bounds)
    return chain.makespan(_sequence(grid.choice_at, sizes, level))


def solve_chain(chain: Chain, budget: int, *, levels: int | None = None, tolerance: float = 0.01) -> ChainResult:
    """The least-makespan sequence of ``chain`` whose peak (x_0 included) is at most ``budget``.

    Automatic (``levels=None``): exact for chains of up to :data:`FRONTS_MAX_STAGES` stages or
    budgets of up to :data:`EXACT_GRID_LEVELS` units. Longer chains in bytes are solved on the finest
    grid the cap allows and certified against a lower bound (sizes rounded down); when the
    certified gap exceeds ``tolerance`` the exact step functions (truncated at the budget) decide.
    So the result is within ``tolerance`` of the exact optimum; ``result.lower_bound`` says how
    close. ``levels=K`` uses rotor's K-level discretisation as is. Raises
    :class:`~solvers.errors.Infeasible` with ``min_budget`` (the chain's unit) below the least
    budget at which the chain has any valid sequence.
    """
    if not budget >= 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    budget = math.floor(budget)  # sizes are whole units: a fraction of one cannot be used
    plans = plan_chain(chain, budget, levels=levels)
    result = plans.plan(budget)
    if result.exact or levels is not None:
        return result
    bound = _relaxed_makespan(chain, budget, plans.unit)
    if result.makespan <= (1 + tolerance) * bound:
        return replace(result, lower_bound=bound)
    exact = _exact_plans(chain, int(budget), plans.exact_sizes, plans.exact_bounds, _keys(chain))
    return exact.plan(budget)


# -- graphs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lowered:
    """One chain plan lowered to the graph: its schedule and what the simulator says of it."""

    chain_budget: int
    schedule: Schedule
    peak: int
    cost: float


def _lower(view: ChainView, plans: ChainPlans, chain_budget: int, graph) -> _Lowered:
    sequence = plans.plan(chain_budget).sequence
    schedule = view.lower(sequence)
    outcome = simulate(graph, schedule)
    if not outcome.valid:
        raise AssertionError(f"dp: a lowered chain plan is not a valid schedule: {outcome.error}")
    return _Lowered(chain_budget, schedule, outcome.peak_bytes, outcome.compute_cost)


def _search(view: ChainView, plans: ChainPlans, budget: int, graph) -> tuple[_Lowered | None, _Lowered]:
    """The cheapest plan whose lowered peak fits ``budget``, and the least-memory plan lowered.

    Plans are indexed by the chain budgets at which the optimum changes (cheaper as they grow).
    The chain model over-counts what the graph holds, so a plan whose chain budget exceeds
    ``budget - reserved`` may still fit: bisect over all of them on "the lowered peak fits",
    and keep the cheapest fitting plan among those tried (peaks are not always monotone).
    """
    breakpoints = plans.budgets()
    tried: dict[int, _Lowered] = {}

    def lowered(index: int) -> _Lowered:
        if index not in tried:
            tried[index] = _lower(view, plans, breakpoints[index], graph)
        return tried[index]

    least = lowered(0)
    if least.peak > budget:
        return None, least
    low, high = 0, len(breakpoints) - 1  # invariant: plan `low` fits
    while low < high:
        middle = (low + high + 1) // 2
        if lowered(middle).peak <= budget:
            low = middle
        else:
            high = middle - 1
    fitting = [plan for plan in tried.values() if plan.peak <= budget]
    return min(fitting, key=lambda plan: (plan.cost, plan.peak)), least


def _planning_views(graph) -> Iterator[ChainView]:
    """The chain views, each long one followed by its coarsening to at most :data:`COARSE_STAGES`.

    The grid's memory levels shrink as the stage count grows (:func:`grid_levels_cap`: 19 levels
    at 500 stages, so every size rounds up to ~5% of the peak); merged stages lose some schedules
    but are planned on ~2000 levels. Measured on benchmarks/solvers.py's 500-layer chain.
    """
    for view in chain_views(graph):
        yield view
        if view.length > COARSE_STAGES:
            yield coarsened(view, math.ceil(view.length / COARSE_STAGES))


def solve_dp(graph, budget: int, time_limit: float | None = None, levels: int | None = None) -> Schedule:
    """``dp`` on a cost graph: Beaumont et al.'s program on the chain views (solvers/chain.py).

    Store-all when it fits (status ``optimal``). Otherwise each view's chain is solved once for
    every budget (exactly, or on ``levels`` memory levels when given), and the cheapest plan over
    the views whose lowered schedule's simulated peak fits ``budget`` is returned (status
    ``heuristic``: optimal only in the chain model, whose sizes bound the graph's from above).
    Raises :class:`Infeasible` with ``min_budget`` = the least simulated peak of the views'
    least-memory chain plans, lowered. With ``time_limit`` (seconds), views not started when it
    is spent are skipped (the first, default view always runs).
    """
    store_all = store_all_schedule(graph)
    outcome = simulate(graph, store_all)
    if outcome.peak_bytes <= budget:
        return store_all.with_info(
            status="optimal", gap=0.0, lower_bound=outcome.compute_cost,
            message="dp: store-all fits the budget, no recomputation needed",
        )
    # One program per chain view (solvers/chain.py: chain_views); the best lowered plan wins.
    best: tuple[_Lowered, ChainView, ChainPlans] | None = None
    least: tuple[_Lowered, ChainView] | None = None
    deadline = None if time_limit is None else time.monotonic() + time_limit
    for view in _planning_views(graph):
        if least is not None and deadline is not None and time.monotonic() > deadline:
            break  # the default view ran; the others are refinements
        chain = view.chain()
        # Above the plan without recomputation nothing changes: solve up to it, once.
        top = int(_bounds(_sizes(chain)).full[0, chain.length])
        plans = plan_chain(chain, top, levels=levels)
        fitting, view_least = _search(view, plans, budget, graph)
        if fitting is not None and (best is None or (fitting.cost, fitting.peak) < (best[0].cost, best[0].peak)):
            best = (fitting, view, plans)
        if least is None or view_least.peak < least[0].peak:
            least = (view_least, view)
    if best is None:
        # Store-all is this method's plan too, should it need less than every chain plan.
        reach = min(least[0].peak, outcome.peak_bytes)
        raise Infeasible(
            f"dp: the least-memory plan on the chain views ({least[1].length} stages) peaks at {least[0].peak} "
            f"bytes and store-all at {outcome.peak_bytes}; the budget is {budget} bytes",
            min_budget=reach,
            method="dp",
        )
    lowered, view, plans = best
    if lowered.cost >= outcome.compute_cost and lowered.peak > outcome.peak_bytes:
        raise AssertionError("dp: a chain plan that recomputes nothing should be store-all")
    engine = f"{plans.engine}, unit {plans.unit}" if plans.unit != 1 else plans.engine
    return lowered.schedule.with_info(
        status="heuristic",
        message=(
            f"dp: optimal in the heterogeneous chain model ({view.length} stages, {engine}) at chain budget "
            f"{lowered.chain_budget} bytes + {view.reserved_bytes} reserved; the graph's schedule is not proven optimal"
        ),
    )
