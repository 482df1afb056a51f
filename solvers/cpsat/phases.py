"""``solve_cpsat``: store-all, the hints, phase 1 (the least peak) when none fits, phase 2 (the
least cost), with one clock for the whole call."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from collections.abc import Callable

from .. import exhaustive
from ..bounds import BOUND_SECONDS, Backward
from ..clock import Clock
from ..errors import Infeasible, SolverTimeout, SolverUnavailable
from ..graph import NodeCosts, node_costs, total_cost
from ..options import time_limit_or_default
from ..orderfree import ORDER_FREE_SECONDS, order_free_bound
from ..schedule import Schedule
from ..simulate import Simulation
from .counts import (COUNT_CEILING, Counts, capped_lower_bound, counts_of, interval_counts, max_computations,
                     uniform_cap)
from .heuristics import Checked, checked, greedy_schedules, heuristic_schedules, low_peak_schedule
from .model import METHOD, build_model, cp_model
from .scales import CostScale, MemoryScale, scale_costs, scale_memory
from .solving import Outcome, add_hint, fits, run_solver

# A schedule is reported optimal when the proven relative gap is at most this (float rounding).
OPTIMALITY_TOLERANCE = 1e-9
# Model size is the horizon (sum of interval counts). The first model is capped at
# max(FIRST_HORIZON_PER_NODE * n, FIRST_HORIZON_MIN); raising caps stops at MAX_HORIZON_PER_NODE * n.
FIRST_HORIZON_PER_NODE = 2
FIRST_HORIZON_MIN = 150
MAX_HORIZON_PER_NODE = 12
# Phase 2 restarts with smaller counts when a new best schedule shrinks the horizon this much.
RESTART_SHRINK = 0.75
# Share of the remaining time phase 1 may use before phase 2 gets the rest. Phase 1 runs only when
# no schedule is known and stops as soon as one fits the budget, so a larger share costs phase 2
# nothing when phase 1 is quick, and when it is slow it is the only way to any schedule: at 0.5, a
# 250-node layered DAG (tests/graphs.py layered_dag(25, 10), budget 90) raised a timeout after
# 8.3 s of a 12 s limit; at 0.9 it used 11.9 s, and with 20 s it found the optimum in 18.5 s.
PHASE1_TIME_SHARE = 0.9
# Phase 1 on graphs this small first tries the exact bit-mask search of solvers/exhaustive.py, with
# this share of the time: measured, CP-SAT did not reach the minimum peak of a 20-node training
# graph (a 4-layer MLP by op) in 60 s, which the search proves in ~2 s.
EXACT_PEAK_MAX_NODES = 20
EXACT_PEAK_TIME_SHARE = 0.3
# Phase 2 on those graphs first tries the exhaustive search for the least cost, with this share.
EXACT_COST_TIME_SHARE = 0.5


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
class PeakResult:
    computes: list[int]
    peak: int  # bytes, simulated
    lower: int  # bytes: no schedule peaks lower
    finished: bool  # CP-SAT finished (not stopped by the time limit)
    counts: Counts

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

def exact_min_cost(graph, costs: NodeCosts, budget: int, clock: Clock) -> Checked | None:
    """The cheapest schedule within ``budget`` by exhaustive search on small graphs (proven
    optimal), or None when the graph is too large or the search runs out of its share of the time."""
    if costs.n > EXACT_PEAK_MAX_NODES:
        return None
    try:
        schedule = exhaustive.min_cost_schedule(graph, budget, clock.share(EXACT_COST_TIME_SHARE))
    except (TimeoutError, Infeasible):
        return None
    return checked(graph, costs, [costs.index[v] for v in schedule.computes()], budget)

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
    an unproven minimum must not be reported as the least budget."""
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

    # Phase 2 on graphs this small: the exact search first (on a 15-node U-Net graph at
    # its minimum budget CP-SAT stopped at 98 after 60 s where the optimum, found here, is 71).
    exact = exact_min_cost(graph, costs, budget, clock) if hints else None
    if exact is not None:
        return finish(exact.schedule, exact.simulation, "optimal", exact.simulation.compute_cost,
                      "proven by the exhaustive search (graphs of at most "
                      f"{EXACT_PEAK_MAX_NODES} nodes)")  # cost is its proven optimum
    return finish(*cost_phase(graph, costs, memory, budget, known, clock, workers, hard_cap, horizon_limit))


def _cost_floor(graph, costs: NodeCosts, budget: int, cost_scale: CostScale, clock: Clock) -> tuple[float, float]:
    """The backward cost bound, in model units and in seconds (at least computing every node once;
    units are rounded down, so it stays a valid bound); in seconds also the order-free
    relaxation's (solvers/orderfree), which often proves the best hint optimal before any search."""
    floor_units = Backward(costs, seconds=bound_seconds(clock)).cost(budget, cost_scale.units)
    relaxed = order_free_bound(graph, budget, min(ORDER_FREE_SECONDS, 0.1 * (clock.left() or 0.0)), costs=costs)
    if math.isinf(floor_units) or math.isinf(relaxed):  # no schedule fits, yet one is known: a bug
        raise AssertionError("cpsat: a cost bound says no schedule fits the budget")
    return floor_units, max(float(sum(costs.cost)), cost_scale.seconds(floor_units), relaxed)


def _restart_trigger(costs: NodeCosts, cost_scale: CostScale, caps: list[int], horizon: int,
                     best: float) -> Callable[[float, list[int]], bool]:
    """Whether a new solution (its objective in model units, its computes) shrinks the counts
    enough (rule 3) to restart with a smaller model. Only a trigger: the next round recomputes the
    counts from the simulated cost."""
    base = float(sum(costs.cost))

    def restart(objective: float, computes: list[int]) -> bool:
        spare = cost_scale.seconds(objective) - base
        if spare >= best - base - 1e-9 * max(1.0, best):
            return False
        return interval_counts(costs, caps, spare, counts_of(costs.n, computes)).horizon <= RESTART_SHRINK * horizon

    return restart


def _raised_caps(costs: NodeCosts, caps: list[int], counts: Counts, binding: list[int], spare: float,
                 hinted: list[int], hard_cap: int) -> list[int] | None:
    """The caps with each binding node's raised by one, or ``None`` when that changes no count or
    makes the model larger than ``MAX_HORIZON_PER_NODE`` per node."""
    raised = list(caps)
    for v in binding:
        raised[v] = min(hard_cap, counts.counts[v] + 1)
    trial = interval_counts(costs, raised, spare, hinted)
    if trial.counts == counts.counts or trial.horizon > MAX_HORIZON_PER_NODE * costs.n:
        return None
    return raised


def _cost_notes(counts: Counts | None, status: str, memory: MemoryScale, cost_scale: CostScale) -> str:
    """What weakens the claim of an unproven phase 2 result."""
    notes = []
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
    return "; ".join(notes)


def cost_phase(graph, costs: NodeCosts, memory: MemoryScale, budget: int, known: Known, clock: Clock,
               workers: int, hard_cap: int, horizon_limit: int) -> tuple[Schedule, Simulation, str, float, str]:
    """Phase 2: the least cost within the budget. Raises capped counts while they may hide a better
    schedule, and restarts smaller when a better schedule shrinks the counts (rule 3)."""
    n, base = costs.n, float(sum(costs.cost))
    cost_scale = scale_costs(costs.cost, MAX_HORIZON_PER_NODE * max(n, 1))
    floor_units, floor = _cost_floor(graph, costs, budget, cost_scale, clock)

    def hinted() -> list[int]:  # the best schedule's counts, which the model must admit if allowed
        return [min(c, hard_cap) for c in counts_of(n, known.computes)]

    def proven(bound: float) -> bool:
        return bound >= known.cost * (1 - OPTIMALITY_TOLERANCE)

    caps = [min(hard_cap, uniform_cap(costs, known.cost - base, horizon_limit, hinted()))] * n
    lower, counts, status = floor, None, "UNSOLVED"
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
        restart = _restart_trigger(costs, cost_scale, caps, counts.horizon, known.cost)
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
        raised = None if status != "OPTIMAL" or not binding else _raised_caps(costs, caps, counts, binding, spare,
                                                                              hinted(), hard_cap)
        if raised is None:
            break
        caps = raised
    notes = "" if proven(lower) else _cost_notes(counts, status, memory, cost_scale)
    return known.best.schedule, known.best.simulation, "feasible", lower, notes
