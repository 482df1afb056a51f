"""Checkmate §5: the LP relaxation and its roundings, each completed by the least
recomputation and judged by the simulator."""

from __future__ import annotations

import random
import logging
import time
from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np

from ..clock import Clock
from .backends import run_backend
from .candidates import Candidate, _candidate
from .model import CheckmateModel
from .values import least_recomputation, schedule_of_order

LOG = logging.getLogger(__name__)

DEFAULT_ROUNDING_SAMPLES = 48
# Fractions of the budget offered to the LP in lp-rounding mode, loosest first: a rounding of a
# tighter LP tends to fit where the first one's roundings overshoot (Checkmate §5 does the same).
LP_BUDGET_FRACTIONS = (1.0, 0.9, 0.75, 0.5)


def _roundings(model: CheckmateModel, values: np.ndarray, samples: int, rng: random.Random):
    """Held sets from the LP's ``S``: Checkmate's deterministic threshold rounding at a few
    thresholds, then Bernoulli samples with the LP values as probabilities."""
    costs = model.costs
    n = costs.n
    stage, node, columns = model.held_columns()
    value = np.asarray(values, dtype=np.float64)[columns]
    fixed = [{i for i in range(t) if costs.pinned[i]} for t in range(n)]
    fixed.append({i for i in range(n) if costs.output[i]})  # held at the end

    def held_sets(chosen: np.ndarray) -> list[set[int]]:
        picked_stage, picked_node = stage[chosen], node[chosen]  # by stage (S's column order)
        bounds = np.searchsorted(picked_stage, np.arange(n + 1))
        return [fixed[t] | set(picked_node[bounds[t]:bounds[t + 1]].tolist()) for t in range(n)] + [fixed[n]]

    for threshold in (0.5, 0.25, 0.75, 0.1, 0.9, 1e-6):
        yield f"threshold {threshold}", held_sets(value >= threshold)
    for sample in range(samples):
        draws = np.array([rng.random() for _ in range(len(value))])
        yield f"sample {sample}", held_sets(draws < value)

@dataclass
class Rounded:
    """What the LP relaxation and its roundings give."""

    lower_bound: float | None  # the LP's bound at the full budget (seconds), None when it gave none
    infeasible: bool  # the LP at the full budget is infeasible, hence the MILP too
    best: Candidate | None  # the cheapest rounding that fits the budget
    tried: int  # distinct compute orders simulated
    # per LP solved: (fraction of the budget, LP seconds, its value in seconds or None, seconds of
    # rounding, completing and simulating its roundings)
    steps: list = field(default_factory=list)
    lp_optimal: bool = False  # the LP at the full budget was solved to optimality (else stopped)

def lp_rounding(model: CheckmateModel, graph, budget: int, backend: str, deadline: Clock, threads: int | None,
                samples: int, rng: random.Random, fractions: Sequence[float] = LP_BUDGET_FRACTIONS,
                lp_solver: str = "choose") -> Rounded:
    """Checkmate §5: solve the LP relaxation, round ``S`` (thresholds, then Bernoulli samples), take
    the least recomputation for each rounding, and keep the cheapest whose simulated peak fits.

    The LP is solved at ``budget * fraction`` for each fraction in turn (loosest first) until some
    rounding fits: a tighter LP leaves room for what rounding adds. ``model`` is left at
    ``budget``. ``lower_bound`` is the first LP's bound (:func:`solvers.ilp.backends.dual_bound` with
    HiGHS). ``lp_solver``: see :func:`solvers.ilp.backends.run_backend`.
    """
    costs = model.costs
    result = Rounded(None, False, None, 0)
    seen: set[tuple[int, ...]] = set()
    try:
        for fraction in fractions:
            model.set_budget(budget * fraction)
            started = time.perf_counter()
            outcome = run_backend(model, backend, deadline.left(), threads, relax=True, lp_solver=lp_solver)
            lp_seconds, started = time.perf_counter() - started, time.perf_counter()
            if fraction == fractions[0]:
                if outcome.infeasible:
                    result.infeasible = True
                    return result
                if outcome.bound is not None:  # weak duality from the LP's duals (HiGHS), or its optimum (CBC)
                    result.lower_bound = outcome.bound * model.scales.cost_unit
                result.lp_optimal = outcome.optimal
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
            value = None if outcome.objective is None else outcome.objective * model.scales.cost_unit
            result.steps.append((fraction, lp_seconds, value, time.perf_counter() - started))
            LOG.debug("ilp: LP at %g x budget in %.1f s (value %s), %d roundings in %.1f s", fraction, lp_seconds,
                      value, len(seen), time.perf_counter() - started)
            left = deadline.left()
            if result.best is not None or (left is not None and left <= 0):
                break
            if outcome.stopped and not outcome.has_solution:
                break  # stopped by the limit: a tighter LP is no quicker (1001 nodes: 46 s more for nothing)
    finally:
        model.set_budget(budget)
        result.tried = len(seen)
    return result
