"""``solve_regions_exact``: the cheapest native plan within a budget, proven (or with its gap).

Where the rows verify as a chain (solvers/native/chain.py), the chain's dynamic program
(solvers/native/chain_dp.py) finds it and proves it, and where no plan fits gives the least peak of
any; the heuristic and the MILP below run only where they do not.

The heuristic search (:func:`solvers.regions.plan_regions`) gives the first incumbent; the MILP of
solvers/native/milp.py over the menu (solvers/native/menu.py), its memory rows exact at every plan
(solvers/native/peak_rows.py), proves it optimal or finds a cheaper one. Each incumbent is checked
by :class:`~solvers.regions.RegionModel` (the simulator's twin, equal to it on every plan) before it
is taken, and the plan returned by :func:`~solvers.regions.evaluate` (the simulator itself). Should an
incumbent's rows and the simulator disagree, the incumbent is cut off (a no-good cut) and the search
goes on: what is returned always fits by the simulator.

``status``: ``optimal`` when the MILP closed with every row the incumbent touches (no native plan
over the menu is cheaper: "optimal" here is over the plans the native executor runs, its class);
``feasible`` at the time limit, with ``gap`` the incumbent's distance above the MILP's bound (a bound
over the same class: reported as ``gap``, never as ``lower_bound``, which the solvers keep for bounds
over every schedule).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from ..clock import Clock
from ..errors import Infeasible, SolverTimeout
from ..options import time_limit_or_default
from ..regions.policies import SAVE_POLICIES
from ..regions.prediction import RegionPlan, evaluate
from ..regions.region_model import RegionModel
from ..regions.search import plan_regions
from ..schedule import FEASIBLE, OPTIMAL, Schedule, SolverInfo
from ..store_all import store_all_schedule
from .chain import NoChain, chain_structure
from .chain_dp import least_peak, solve_chain
from .menu import Menu, build_menu
from .milp import RegionMilp
from .peak_rows import build_rows

METHOD = "regions"
# Memory rows added per round: the events the incumbent breaks most.
ROWS_PER_ROUND = 12
# Seconds of a MILP run while rows are still being added (doubled after a run that found nothing
# better than its start); once a new incumbent meets every row, the next run has the rest of the time. A run stops at its slice so that an
# incumbent is checked early: on the residual MLP at 40% the first run, given the whole 30 s, spent
# it on a plan that broke 205 events' rows (its 12 rows were far from enough), and the plan returned
# was the heuristic's (+21.4%); in slices, +12.6% within 4.5% of the bound (at 120 s).
FIRST_SLICE = 2.0


def _signature(model: RegionModel, region: str) -> tuple:
    recomputed, backward, trigger, held, overhead = model.parts(region)
    return tuple(recomputed), tuple(backward), trigger, tuple(held), overhead


def _menu_indices(menu: Menu, regions: Sequence[str], model: RegionModel) -> set[int] | None:
    """The heuristic's plan as menu choices: each region as the choice that checkpoints exactly as it
    does (itself; for a one-child segment, ``"layers[3:4]"``, its child module; for a policy the menu
    left out as a duplicate, the choice it duplicates). None when a region has no such choice."""
    by_signature = {}
    for i, choice in enumerate(menu.choices):
        by_signature.setdefault(_signature(model, choice), i)
    taken = set()
    for region in regions:
        index = by_signature.get(_signature(model, region))
        if index is None:
            return None
        taken.add(index)
    return taken


def _heuristic_start(graph, budget: int, candidates, sequentials, policies, seconds: float | None):
    """The heuristic's plan (its regions), or None with the least peak it saw."""
    try:
        plan = plan_regions(graph, budget, candidates, sequentials, time_limit=seconds, policies=policies)
    except Infeasible as error:
        return None, error.min_budget
    return plan.regions, None


@dataclass
class _Search:
    """Where the MILP search stands: ``best`` (choice indices) and its ``best_cost`` (seconds the
    choices add), ``bound`` (the MILP's best bound on those seconds), whether the incumbent is
    ``proven`` optimal, whether ``nothing_fits`` (no plan meets the rows), the no-good ``cuts`` and
    MILP ``rounds`` so far."""

    best: set[int] | None
    best_cost: float
    bound: float | None = None
    proven: bool = False
    nothing_fits: bool = False
    cuts: int = 0
    rounds: int = 0


def _longer_slice(slice_seconds: float | None, improved: bool) -> float | None:
    """The next MILP run's seconds: the rest of the time (None) after a new incumbent, else twice the
    slice (the run found nothing better in it)."""
    return None if improved or slice_seconds is None else 2 * slice_seconds


def _admit(search: _Search, milp: RegionMilp, rows, model: RegionModel, taken: set[int], budget_bytes: int) -> bool:
    """Whether the plan ``taken`` fits ``budget_bytes`` by every row and by the simulator's twin. When it
    does not, the rows it breaks are added to ``milp``, or (none fresh, or the rows and the twin
    disagree) the plan is cut off and counted in ``search.cuts``."""
    violated = _worst_events(rows, taken, budget_bytes)
    if violated:
        fresh = [event for event in violated if event not in milp.events_added]
        for event in fresh:
            milp.add_event(event)
        if not fresh:  # over by less than HiGHS's feasibility tolerance (a byte or so of a budget): cut it off
            milp.exclude(taken)
            search.cuts += 1
        return False
    peak, _ = model.peak_and_cost([rows.menu.choices[c] for c in sorted(taken)])
    if peak > budget_bytes:  # the rows and the simulator's twin disagree: never take the plan
        milp.exclude(taken)
        search.cuts += 1
        return False
    return True


def _search(milp: RegionMilp, rows, model: RegionModel, budget_bytes: int, clock: Clock,
            best: set[int] | None) -> _Search:
    """Run the MILP in slices from the incumbent ``best`` until it is proven, none fits, or the
    ``clock`` runs out: each plan found is admitted (:func:`_admit`) before it is taken."""
    search = _Search(best, rows.cost_of(best) if best is not None else np.inf)
    slice_seconds: float | None = FIRST_SLICE
    while not clock.expired():
        search.rounds += 1
        if search.best is not None:
            milp.start(search.best)
        outcome = milp.solve(clock.left() if slice_seconds is None else min(clock.left(), slice_seconds))
        if outcome.bound is not None:  # every round's bound holds: its rows are some of the exact problem's
            search.bound = outcome.bound if search.bound is None else max(search.bound, outcome.bound)
        if outcome.infeasible:  # no plan meets the rows (with cuts: none but those cut off, over the budget)
            search.proven, search.nothing_fits = search.best is not None, search.best is None
            break
        if outcome.taken is None:
            slice_seconds = _longer_slice(slice_seconds, False)  # none in the slice: a longer one
            continue
        taken = outcome.taken
        if not _admit(search, milp, rows, model, taken, budget_bytes):
            continue
        improved = search.best is None or rows.cost_of(taken) < search.best_cost
        if improved:
            search.best, search.best_cost = taken, rows.cost_of(taken)
        search.proven = outcome.proven
        if search.proven:
            break
        # A new plan that meets every row: the rest of the time for the proof. The start again (the
        # run found nothing better in its slice): a longer slice, still checked when it ends.
        slice_seconds = _longer_slice(slice_seconds, improved)
    return search


def _no_plan(search: _Search, budget_bytes: int, least: int | None, clock: Clock) -> Exception:
    """The error when the search ends without a plan: :class:`Infeasible` (``least``: the least peak
    in bytes the heuristic saw) or :class:`SolverTimeout`."""
    if search.nothing_fits:
        return Infeasible(f"no set of checkpointed regions fits {budget_bytes} bytes of activations"
                          + (f"; the least found holds {least}" if least is not None else ""),
                          min_budget=least, method=METHOD)
    if least is not None:  # the heuristic's verdict stands: the exact search neither found a plan nor proved none
        return Infeasible(f"no set of checkpointed regions found within {budget_bytes} bytes of activations in the "
                          f"time limit of {clock.limit:g} s; the least found holds {least}", min_budget=least,
                          method=METHOD)
    return SolverTimeout(f"{METHOD}: the time limit of {clock.limit:g} s passed before a plan within "
                         f"{budget_bytes} bytes was found", method=METHOD)


def _found(graph: nx.DiGraph, rows, milp: RegionMilp | None, search: _Search, budget_bytes: int,
           started: float, how: str | None = None) -> RegionPlan:
    """The incumbent as a plan evaluated by the simulator, reported ``optimal`` or ``feasible`` with
    its gap (the share of its step seconds above the bound); ``how``: how it was found, when not by
    ``milp``."""
    menu = rows.menu
    plan = evaluate(graph, [menu.choices[c] for c in sorted(search.best)])
    if plan.outcome.peak_bytes > budget_bytes:  # RegionModel and evaluate are equal: a bug if this fires
        raise AssertionError(f"{METHOD}: the plan's simulated peak {plan.outcome.peak_bytes} exceeds {budget_bytes}")
    how = how or f"{len(milp.events_added)} memory rows, {search.rounds} MILP run(s)" + (
        f", {search.cuts} no-good cut(s)" if search.cuts else "")
    note = f"{len(plan.regions)} region(s) of {len(menu.choices)} choices, {how}"
    if search.proven:
        return _reported(plan, OPTIMAL, None, started, f"optimal over the native plans: {note}")
    lower = rows.base_cost + search.bound if search.bound is not None else rows.base_cost
    cost = plan.outcome.compute_cost
    gap = max(0.0, (cost - lower) / cost) if cost else 0.0
    return _reported(plan, FEASIBLE, gap, started, f"time limit: {note}, within {gap:.2%} of the best native plan")


def solve_regions_exact(graph: nx.DiGraph, budget_bytes: int, candidates: Sequence[str] | None = None,
                        sequentials: dict[str, int] | None = None, time_limit: float | None = None,
                        policies: Sequence[str] = tuple(SAVE_POLICIES)) -> RegionPlan:
    """The cheapest set of disjoint regions (``candidates``, default every checkpointable module;
    every run of two or more children of the ``sequentials``), each plain or under one of
    ``policies``, whose predicted peak (bytes, the schedule's part) fits ``budget_bytes``; its
    schedule's ``info`` says ``optimal`` or ``feasible`` with the gap (module docstring). Raises
    :class:`Infeasible` (``min_budget``: the least peak a plan was seen to reach) when no plan fits,
    :class:`SolverTimeout` when the time runs out before any plan within the budget is known."""
    started = time.perf_counter()
    clock = Clock(time_limit_or_default(time_limit), started)
    empty = evaluate(graph, ())
    if empty.outcome.peak_bytes <= budget_bytes:
        return step_as_it_is(graph, empty)
    policies = tuple(policies or ())
    model = RegionModel(graph)
    menu = build_menu(graph, candidates, sequentials, policies, model)
    if not menu.choices:  # no module to checkpoint (ops in the root's own forward): the step as it is
        raise Infeasible(f"no region can be checkpointed, and the step holds {empty.outcome.peak_bytes} bytes of "
                         "activations", min_budget=empty.outcome.peak_bytes, method=METHOD)
    rows = build_rows(graph, menu, model)
    clock.check(METHOD, "building the memory rows")
    chained = _chain_plan(graph, rows, model, budget_bytes, started)
    if chained is not None:
        return chained
    clock.check(METHOD, "checking the rows for a chain")
    # The heuristic may take the whole limit: whatever the MILP then does, the plan is never slower
    # than the heuristic's (a share of a 30 s limit cut it short at a load of 12: the residual MLP's
    # plan at 70% came out +1.5% against its +1.4% uncut).
    start, least = _heuristic_start(graph, budget_bytes, candidates, sequentials, policies, clock.left())
    clock.check(METHOD, "searching for a first plan")
    milp = RegionMilp(rows, budget_bytes)
    best = _menu_indices(menu, start, model) if start is not None else None
    if start is not None and best is None:  # a region the menu lacks: keep the heuristic's plan as it is
        return _reported(evaluate(graph, start), FEASIBLE, None, started,
                         "the heuristic's plan (a region outside the exact method's menu)")
    for event in _worst_events(rows, set(), budget_bytes):
        milp.add_event(event)
    search = _search(milp, rows, model, budget_bytes, clock, best)
    if search.best is None:
        raise _no_plan(search, budget_bytes, least, clock)
    return _found(graph, rows, milp, search, budget_bytes, started)


def _chain_plan(graph: nx.DiGraph, rows, model: RegionModel, budget_bytes: int, started: float) -> RegionPlan | None:
    """The cheapest plan by the chain's dynamic program (solvers/native/chain_dp.py), ``optimal``, where
    the rows verify as a chain (solvers/native/chain.py); None where they do not (the MILP then
    searches). Raises :class:`Infeasible` with the least peak of any plan (``min_budget``, exact)
    where none fits. Its plan is checked by the rows and the simulator's twin, as the MILP's
    incumbents are, and by the simulator when returned (:func:`_found`)."""
    structure = chain_structure(rows, model)
    if isinstance(structure, NoChain):
        return None
    solution = solve_chain(structure, budget_bytes)
    if solution is None:
        least = least_peak(structure)
        raise Infeasible(f"no set of checkpointed regions fits {budget_bytes} bytes of activations; the least "
                         f"plan holds {least}", min_budget=least, method=METHOD)
    taken, _ = solution
    regions = [rows.menu.choices[c] for c in sorted(taken)]
    memory = rows.memory(taken)
    if memory.max() > budget_bytes or model.peak_and_cost(regions)[0] > budget_bytes:
        # The verified chain and the rows disagree: a bug, said aloud; the MILP's answer stands instead.
        warnings.warn(f"the chain dynamic program's plan {regions} holds more than the budget of {budget_bytes} "
                      "bytes by the rows or the region model (a bug in solvers/native/chain*.py: please report "
                      "it); the MILP searches instead", RuntimeWarning, stacklevel=2)
        return None
    search = _Search(taken, rows.cost_of(taken), proven=True)
    note = (f"chain dynamic program over {structure.units} units and "
            f"{len(structure.components) - structure.units} whole regions, the rows verified as a chain")
    return _found(graph, rows, None, search, budget_bytes, started, note)


def step_as_it_is(graph: nx.DiGraph, empty: RegionPlan | None = None) -> RegionPlan:
    """The plan of no regions, reported ``optimal``: where the step fits as it is (predicted, or
    measured by the planner), no native plan is faster, since every region only adds its
    recomputation. ``empty``: ``evaluate(graph, ())`` when the caller has it already."""
    started = time.perf_counter()
    plan = evaluate(graph, ()) if empty is None else empty
    return _reported(plan, OPTIMAL, None, started, "nothing to checkpoint: the step fits as it is")


def _worst_events(rows, taken: set[int], budget: int) -> list[int]:
    """The axis events at which the plan ``taken`` is over ``budget``, worst first, at most
    :data:`ROWS_PER_ROUND`."""
    memory = rows.memory(taken)
    over = np.flatnonzero(memory > budget)
    if not len(over):
        return []
    worst = over[np.argsort(-memory[over], kind="stable")]
    return [int(e) for e in worst[:ROWS_PER_ROUND]]


def _reported(plan: RegionPlan, status: str, gap: float | None, started: float, message: str) -> RegionPlan:
    info = SolverInfo(method=METHOD, status=status, gap=gap, solve_seconds=time.perf_counter() - started,
                      predicted_peak_bytes=plan.outcome.peak_bytes, compute_cost=plan.outcome.compute_cost,
                      message=message)
    return replace(plan, schedule=plan.schedule.with_info(**info.__dict__))


class RegionSchedule(Schedule):
    """A native plan's schedule, which runs on a graph of its own (``executed_graph``: the op graph
    with the twins of the recomputed ops, :func:`solvers.regions.region_graph`), with its ``regions``."""

    def __init__(self, steps=(), info: SolverInfo | None = None, executed_graph: nx.DiGraph | None = None,
                 regions: Sequence[str] = ()):
        super().__init__(steps, info)
        object.__setattr__(self, "executed_graph", executed_graph)
        object.__setattr__(self, "regions", tuple(regions))

    def with_info(self, **changes) -> RegionSchedule:
        return RegionSchedule(self.steps, replace(self.info, **changes), self.executed_graph, self.regions)


def solve_regions(graph: nx.DiGraph, budget: int, time_limit: float | None = None) -> Schedule:
    """The ``regions`` method of :func:`solvers.solve`: :func:`solve_regions_exact` over every module
    of the trace, as a :class:`RegionSchedule` (checked by the simulator on its ``executed_graph``).
    A graph with no module to checkpoint (not a profiled trace) has one native plan, the step as it
    is: the store-all schedule."""
    if not build_menu(graph).choices:
        schedule = store_all_schedule(graph)
        from ..simulate import simulate

        peak = simulate(graph, schedule).peak_bytes
        if peak > budget:
            raise Infeasible(f"nothing to checkpoint in this graph (no module regions): its step holds {peak} bytes",
                             min_budget=peak, method=METHOD)
        return RegionSchedule(schedule, SolverInfo(method=METHOD, status=OPTIMAL,
                                                   message="no module regions: the step as it is"), graph, ())
    plan = solve_regions_exact(graph, budget, time_limit=time_limit)
    return RegionSchedule(plan.schedule, plan.schedule.info, plan.graph, plan.regions)
