"""``solve_ilp``: the method, exact (LP starts, then the MILP) or by LP rounding."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from ..bounds import BOUND_SECONDS, cost_lower_bound
from ..clock import Clock
from ..errors import Infeasible
from ..graph import node_costs, validate
from ..options import time_limit_or_default
from ..orderfree import ORDER_FREE_SECONDS, order_free_bound
from ..schedule import FEASIBLE, OPTIMAL, Schedule
from ..simulate import simulate
from .backends import Outcome, check_backend, run_backend
from .candidates import (Candidate, _best_start, _candidate, _finish, _given_candidates, _or_best_candidate,
                         _order_free, _proven, warm_start_candidates)
from .minimum import _low_memory_start, _no_schedule, _out_of_time, minimum_budget, model_lower_bound
from .model import CheckmateModel, Scales, build_model
from .rounding import DEFAULT_ROUNDING_SAMPLES, lp_rounding
from .values import compute_order, expressible, first_computation_order, schedule_of_order

MODES = ("exact", "lp-rounding")
# Graphs above this many nodes are refused: the model grows as n^2 (a 1001-node training graph's
# has 2.6 million columns and 12.7 million nonzeros, ~1 GB built, 5 s; its LP takes HiGHS minutes).
# Below it, the time limit decides: a model that cannot be built in the time left is not started
# (solvers.ilp.model.refuse_if_too_slow).
MAX_NODES = 1200
# Attempts at re-solving with a tighter budget when rounding in the solver overshoots in bytes.
TIGHTEN_ATTEMPTS = 3


def _starts_from_the_lp(model: CheckmateModel, graph, budget: int, backend: str, deadline: Clock,
                        threads: int | None, pool: list[Candidate], samples: int,
                        rng: random.Random) -> tuple[float | None, Schedule | None]:
    """The LP relaxation before the MILP: it proves infeasibility cheaply, its roundings are often
    optimal (HiGHS otherwise spends most of its time looking for a first incumbent), and when the
    best start meets the LP bound no MILP is needed at all. Adds its starts to ``pool``; returns
    the LP bound (seconds, in the model's order) and, when the budget is out of the model's reach
    but a least-memory schedule fits after all, that schedule."""
    costs = model.costs
    rounded = lp_rounding(model, graph, budget, backend, deadline, threads, samples, rng, fractions=(1.0, 0.9))
    if rounded.infeasible:
        return None, _no_schedule(graph, costs, budget, backend, deadline, threads,
                                  f"the LP relaxation is infeasible at {budget} bytes", exact=True)
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
            pool.append(Candidate(least.schedule.schedule, least.schedule.cost, least.peak, "a least-memory schedule"))
        elif least.proven:
            raise Infeasible(f"no schedule fits in {budget} bytes; Checkmate's model (fixed first-"
                             f"computation order) needs at least {least.peak} bytes",
                             min_budget=least.peak, method="ilp")
    return rounded.lower_bound, None


def _milp_bound(outcome: Outcome, tightened: bool, cost_unit: float, lp_bound: float | None) -> float | None:
    """The best bound (seconds, in the model's order) after a MILP run. A tightened model's bound
    is no bound for the real budget: only the LP's is left then."""
    bound = None if outcome.bound is None or tightened else outcome.bound * cost_unit
    if lp_bound is not None:
        bound = lp_bound if bound is None else max(bound, lp_bound)
    return bound


def _without_an_incumbent(outcome: Outcome, started_from: Candidate | None, budget: int, backend: str,
                          deadline: Clock, bound: float | None, messages: list[str]) -> Schedule:
    """The MILP stopped with no solution of its own: the start it dropped, or a timeout."""
    if not outcome.stopped:  # neither a solution, nor infeasible, nor out of time
        raise RuntimeError(f"ilp: the {backend} backend ended without a verdict on the MILP")
    if started_from is None:
        raise _out_of_time(budget, deadline)
    messages.append("time limit reached; returning the warm start")  # still a valid answer
    return _finish(started_from, budget, FEASIBLE, bound, "; ".join(messages))


def _milp(model: CheckmateModel, graph, budget: int, backend: str, deadline: Clock, threads: int | None,
          pool: list[Candidate], lp_bound: float | None, stop_gap: float | None = None) -> Schedule:
    """The MILP from the cheapest start the model expresses, re-solved for a few bytes less when
    the backend's tolerances let its solution overshoot the budget."""
    costs, messages = model.costs, []
    model_budget = float(budget)
    for _attempt in range(TIGHTEN_ATTEMPTS + 1):
        model.set_budget(math.floor(model_budget))
        warm, started_from = _best_start(model, graph, pool)
        if deadline.expired():
            if started_from is None:
                raise _out_of_time(budget, deadline)
            messages.append(f"time limit reached before the MILP; returning the cheapest start ({started_from.source})")
            return _finish(started_from, budget, FEASIBLE, lp_bound, "; ".join(messages))
        outcome = run_backend(model, backend, deadline.left(), threads, warm, gap_rel=stop_gap)
        if outcome.infeasible:
            return _no_schedule(graph, costs, budget, backend, deadline, threads,
                                f"the MILP is infeasible at {budget} bytes", exact=True)
        if started_from is not None:
            messages.append(f"warm start from {started_from.source} (cost {started_from.cost:.6g} s)")
        tightened = model_budget < budget
        bound = _milp_bound(outcome, tightened, model.scales.cost_unit, lp_bound)
        if not outcome.has_solution:
            return _without_an_incumbent(outcome, started_from, budget, backend, deadline, bound, messages)
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
            messages.append("time limit reached before optimality was proven" if stop_gap is None
                            else f"stopped before optimality was proven (time limit, or within {stop_gap:g})")
        return _finish(found, budget, status, bound, "; ".join(messages))
    raise RuntimeError(f"ilp: the MILP's solutions overshoot the budget of {budget} bytes after "
                       f"{TIGHTEN_ATTEMPTS} tightenings; this is a numerical problem in the backend")


def _solve_exact(graph, costs, budget, backend, deadline, threads, candidates, warm_start, samples, rng,
                 stop_gap: float | None = None) -> Schedule:
    """``mode="exact"``: the LP's starts (with ``warm_start``), then the MILP unless a start
    already meets the LP bound. Statuses and bounds in the model's order (:func:`_order_free`
    makes them true over every order)."""
    pool = [c for c in candidates if expressible(graph, costs, c.schedule)]
    lp_bound = None
    model = build_model(costs, budget, Scales.of(costs), clock=deadline)
    if warm_start:
        lp_bound, verdict = _starts_from_the_lp(model, graph, budget, backend, deadline, threads, pool, samples, rng)
        if verdict is not None:
            return verdict
    pool.sort(key=lambda c: c.cost)
    if pool and _proven(pool[0].cost, lp_bound):
        return _finish(pool[0], budget, OPTIMAL, lp_bound, f"{pool[0].source} meets the LP bound")
    return _milp(model, graph, budget, backend, deadline, threads, pool, lp_bound, stop_gap)


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
    if not rounded.lp_optimal:
        seconds = sum(step[1] for step in rounded.steps)
        message += (f"; the LP was not solved to optimality in the time limit ({seconds:.0f} s in HiGHS)"
                    + ("" if rounded.lower_bound is None else ": its bound is the stopped LP's, by weak duality"))
    return _finish(best, budget, status, rounded.lower_bound, message)

def solve_ilp(graph, budget: int, time_limit: float | None = None, *, backend: str = "highs",
              mode: str = "exact", threads: int | None = None, warm_start: bool = True,
              warm_starts: Sequence[Schedule] = (), rounding_samples: int = DEFAULT_ROUNDING_SAMPLES,
              seed: int = 0, max_nodes: int = MAX_NODES, every_order_bound: bool = True,
              stop_gap: float | None = None) -> Schedule:
    """Checkmate's MILP for ``graph`` under ``budget`` bytes (see the module docstring).

    ``backend``: "highs" (the model's arrays passed to highspy) or "cbc" (PuLP's bundled CBC). ``mode``: "exact"
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
    ~n^2 binaries; larger graphs are refused. Below that, a model whose estimated build time exceeds
    the time left is refused before it is built (the cheapest warm start comes back, saying so).
    ``every_order_bound``: compute the bounds over every order (:func:`solvers.bounds.cost_lower_bound`
    and the order-free relaxation's, each up to a tenth of the time left); False for a caller that has its
    own bound and wants only the schedule (orderfree's MIP start): ``lower_bound`` is then 0 and
    the status never ``optimal`` (4.5 s of a 25 s call on the 80-node FCN-8s graph). ``stop_gap``
    (HiGHS, ``mode="exact"``): the MILP stops once within this relative gap in its order (never
    then ``optimal-in-order``), for a caller that wants a good schedule soon (orderfree's start).
    """
    validate(graph)
    check_backend(backend)
    if mode not in MODES:
        raise ValueError(f"unknown ilp mode {mode!r}; accepted: {', '.join(MODES)}")
    deadline = Clock(time_limit_or_default(time_limit))
    n = graph.number_of_nodes()
    if n > max_nodes:
        raise ValueError(f"ilp: the graph has {n} nodes; Checkmate's model would have ~{n ** 2:,} "
                         f"binaries, more than fit in reasonable memory and solve time (limit: max_nodes="
                         f"{max_nodes}). Use a coarser profile, or the orderfree, cpsat, dp or chen-greedy methods")
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
    order_free = 0.0
    if every_order_bound:
        order_free = cost_lower_bound(costs, budget, min(BOUND_SECONDS, 0.1 * (deadline.left() or 0.0)))
        # and the order-free relaxation's (solvers/orderfree): exact where the order is forced
        order_free = max(order_free, order_free_bound(graph, budget,
                                                      min(ORDER_FREE_SECONDS, 0.1 * (deadline.left() or 0.0)),
                                                      costs=costs))
    bound = model_lower_bound(costs)
    if budget < bound and not candidates:
        return _order_free(_no_schedule(graph, costs, budget, backend, deadline, threads,
                                        f"{budget} bytes is below {bound} bytes, what some computation needs at once",
                                        exact=mode == "exact"), order_free)
    if mode == "exact":
        schedule = _or_best_candidate(
            lambda: _solve_exact(graph, costs, budget, backend, deadline, threads, candidates, warm_start,
                                 rounding_samples, random.Random(seed), stop_gap), candidates, budget)
    else:
        schedule = _or_best_candidate(
            lambda: _solve_lp_rounding(graph, costs, budget, backend, deadline, threads, candidates,
                                       rounding_samples, seed), candidates, budget)
    return _order_free(schedule, order_free)
