"""``solve()``: one entry point over every method, each checked by the simulator before it returns."""

from __future__ import annotations

import importlib
import math
import numbers
import time
from collections.abc import Callable

from .errors import Infeasible, SolverUnavailable
from .graph import validate
from .options import check_options, check_time_limit
from .schedule import Schedule
from .simulate import simulate

# method name -> "module:function". Imported on first use: the MILP and CP-SAT back ends are heavy.
# Every function has the signature f(graph, budget: int, time_limit: float | None, **options) -> Schedule
# and raises Infeasible (with min_budget) when its plans cannot meet the budget.
METHODS: dict[str, str] = {
    "store-all": "solvers.store_all:solve_store_all",
    "chen-sqrtn": "solvers.chen:solve_chen_sqrtn",
    "chen-greedy": "solvers.chen:solve_chen_greedy",
    "revolve": "solvers.revolve:solve_revolve",
    "dp": "solvers.dp:solve_dp",
    "ilp": "solvers.ilp:solve_ilp",
    "cpsat": "solvers.cpsat:solve_cpsat",
    "exhaustive": "solvers.exhaustive:solve_exhaustive",
    "orderfree": "solvers.orderfree:solve_orderfree",
    # Repeated blocks planned once per class, a chain program over them, the order-free bound.
    "hierarchical": "solvers.hierarchical:solve_hierarchical",
    # The native executor's plans (regions of the model checkpointed, solvers/native): its schedules
    # run on a graph of their own, the op graph with the recomputed ops' twins (schedule.executed_graph).
    "regions": "solvers.native:solve_regions",
}

# "auto" is no method of its own but a portfolio of them (solvers/auto.py), found like one: by name,
# so that this dispatcher imports no method and every method may ask it for another's schedule.
AUTO = "solvers.auto:solve_auto"


def method_function(method: str) -> Callable[..., Schedule]:
    if method not in METHODS:
        accepted = ", ".join(["auto", *METHODS])
        raise ValueError(f"unknown method {method!r}; accepted: {accepted}")
    return _resolve(METHODS[method])


def _resolve(entry: str) -> Callable[..., Schedule]:
    """The function named by a registry entry ``"module:function"``."""
    module_name, function_name = entry.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def check_budget(budget_bytes) -> int:
    """Budgets reaching the solvers are whole bytes >= 0 (the planner parses '12GB' and the like)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
        raise ValueError(f"budget_bytes must be a number of bytes, got {budget_bytes!r}")
    if not math.isfinite(budget_bytes) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be finite and >= 0, got {budget_bytes!r}")
    return int(budget_bytes)


def solve(graph, budget_bytes, method: str = "auto", time_limit: float | None = None, **options) -> Schedule:
    """Compute a schedule of ``graph`` whose peak (bytes, ``fixed_bytes`` excluded) fits ``budget_bytes``.

    ``method`` is one of :data:`METHODS` or ``"auto"`` (see :mod:`solvers.auto`: the cheapest schedule
    of the methods that suit the graph; ``schedule.info.method`` names the one that made it).
    ``time_limit`` (seconds) bounds the solvers that search (each has a default,
    :data:`solvers.options.DEFAULT_TIME_LIMIT`); they return the best schedule found and report in
    ``schedule.info`` whether it is proven optimal and the gap. ``options`` are the method's own
    (``slots=`` for revolve, ``backend=`` for ilp...); one it does not take raises ``TypeError``
    naming those it does. Raises :class:`Infeasible` (with ``min_budget``) when the method cannot
    meet the budget, and :class:`~solvers.errors.SolverTimeout` (a ``TimeoutError``) when the time
    limit passes before it finds a schedule or proves its minimum budget.
    """
    validate(graph)
    budget = check_budget(budget_bytes)
    time_limit = check_time_limit(time_limit)
    function = _resolve(AUTO) if method == "auto" else method_function(method)
    check_options(method, function, options)
    started = time.perf_counter()
    try:
        schedule = function(graph, budget, time_limit=time_limit, **options)
    except Infeasible as error:
        error.method = error.method or method
        raise
    elapsed = time.perf_counter() - started
    executed = getattr(schedule, "executed_graph", None)  # a native plan's region graph
    outcome = simulate(graph if executed is None else executed, schedule)
    if not outcome.valid or outcome.peak_bytes > budget:
        # A solver bug, never a user error: say exactly what went wrong.
        raise AssertionError(
            f"method {method!r} returned a schedule that {'is invalid: ' + str(outcome.error) if not outcome.valid else f'peaks at {outcome.peak_bytes} bytes over the budget {budget}'}"
        )
    return schedule.with_info(
        method=schedule.info.method if method == "auto" else method,
        solve_seconds=elapsed,
        budget_bytes=budget,
        predicted_peak_bytes=outcome.peak_bytes,
        compute_cost=outcome.compute_cost,
    )


def schedule_from(graph, budget: int, method: str, time_limit: float | None) -> Schedule | None:
    """``method``'s schedule of ``graph`` within ``budget`` bytes (checked by :func:`solve`), or
    ``None`` when the method has none to give: infeasible, out of time, or its library missing. How a
    method asks another for a warm start or a hint.

    Only those three are caught: a method that fails otherwise (an invalid schedule, a crash) is a
    bug that must be seen, not a warm start fewer.
    """
    try:
        return solve(graph, budget, method=method, time_limit=time_limit)
    except (Infeasible, TimeoutError, SolverUnavailable):
        return None
