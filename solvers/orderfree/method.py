"""``solve_orderfree``: the relaxation's optimum laid out, repaired, checked, with fallbacks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..clock import Clock
from ..errors import Infeasible, SolverTimeout, SolverUnavailable
from ..graph import NodeCosts, node_costs
from ..liveness import drop_redundant_computes, schedule_from_computes
from ..api import schedule_from, solve
from ..options import time_limit_or_default
from ..schedule import FEASIBLE, OPTIMAL, Schedule
from ..simulate import simulate
from .model import METHOD, OrderFreeModel, Relaxation, choose_milestones
from .windows import improve_by_windows

# Re-solves when the laid-out optimum overshoots the budget: first other solutions at the budget
# (each excluded by a cut once tried), then solutions at smaller budgets.
REPAIR_ATTEMPTS = 6
NO_GOOD_CUTS = 2
# A schedule whose cost is within this relative distance of the bound is reported optimal.
OPTIMALITY_TOLERANCE = 1e-7
# Graphs this small fall back on the exhaustive search (solvers/exhaustive.py) where no layout fits.
EXACT_FALLBACK_NODES = 20
# Share of the time left given to each fast heuristic (dp, chen-greedy) before the relaxation.
HEURISTIC_SHARE = 0.15
# Share of the time left given to the LP relaxation, then to the first MILP solve (the rest: the
# repairs). At 0.7 the MILP on the 163-node GPT-2 module graph stopped at dp's start in a 60 s
# call (34 s for the MILP under load) and the call ended at 43 s with the rest unused.
LP_SHARE = 0.5
FIRST_SOLVE_SHARE = 0.85
# On models of at most SMALL_MODEL_COLUMNS columns the first solve gets FIRST_SOLVE_SHARE_SMALL:
# there the MILP is what closes the gap. On the 68-node VGG19 graph at 82% of its peak (4,475
# columns, docs/solvers-benchmark.md) it proved +24.9% optimal 56.5 s into a 120 s call, and
# stopped at ~51 s within 4.9% in a 60 s call at 0.85; at 0.97, optimal in 54.2 s of 60 (load 4.5);
# at 0.95 in the benchmark (load 5), within 2.9% in 57.1 s. Still short of a proof there under load.
SMALL_MODEL_COLUMNS = 10_000
FIRST_SOLVE_SHARE_SMALL = 0.95
# The MIP start and the repairs' re-solves only for models this small. Measured on the 1001-node
# skip graph (168k columns): with a start its MILP spent 72 s in its root LP, past a 5 s limit and
# deaf to cancelling (without, 2.5 s); a re-solve after a no-good cut, 70 s. On the 163-node GPT-2
# graph (18.8k columns) the start is what makes the layout fit; on the 595-node 48-layer GPT-2
# graph (123k columns) too: started from dp's schedule its incumbent laid out at +21.2% within the
# budget after 40 s, without it at +52% (dp's +22.4% stood, 1.3% from the bound); the 501-node
# skip graph of tests/test_orderfree.py (126k columns) kept its limits with a start (4-6 s of 5 s).
START_MAX_COLUMNS = 130_000
# dp runs first only on graphs whose chain views have at most this many stages (dp's COARSE_STAGES);
# elsewhere after the relaxation, and only where no layout fits. On the 1001-node chain (one view
# of 500 stages) it took 16 s of a 9 s share (its first view always runs), and on models above
# START_MAX_COLUMNS its schedule is no MIP start, only a fallback; chen-greedy takes ~1 s. On the
# 595-node 48-layer GPT-2 graph (views of 57 stages and fewer) it takes 0.4 s and is the best start.
QUICK_DP_STAGES = 100
# Where no fast heuristic's schedule fits the budget (so the MILP has no start) on graphs of at most
# ILP_START_MAX_NODES nodes, the first MILP solve is a probe: given up PROBE_SECONDS into it when
# its incumbent is still more than PROBE_GAP from its bound (or it has none). Then Checkmate's MILP
# (``ilp``, its fixed-order model, its own bounds skipped) gets ILP_START_SHARE of the time left
# for a schedule, and the relaxation's MILP is solved again from the cheaper of that schedule and
# the probe's incumbent. Measured on the 80-node FCN-8s graph at 81% of its peak (the MLSys
# benchmark's point 0.2, load ~4, HiGHS's default branching): unstarted, the MILP's incumbent was
# +37% at 5.5 s and +12.1% at 45 s (bound +9.5%); ilp had +11.6% 17 s into its call; started from
# it, the MILP was within 1% at 27 s and proved +11.4% optimal at 52 s (20 s with
# PSEUDOCOST_MAX_COLUMNS's branching). That optimum's layouts overshoot the budget by 1.2 MB (so
# do 300 random orders within its intervals): ilp's +11.64% is the schedule, within 0.18% of the
# bound (49.9 s of 60, load 4.6). On the 68-node VGG19 graph at 82% (no heuristic fits either) the
# unstarted MILP was within 5.9% at 1.4 s and proved optimal at 20-26 s: no probe gives up there.
# ilp's model has n^2 columns: 150 nodes is the benchmark's exact-ilp limit.
ILP_START_MAX_NODES = 150
PROBE_SECONDS = 4.0
PROBE_GAP = 0.10
ILP_START_SHARE = 0.45
ILP_START_GAP = 0.01


@dataclass(frozen=True)
class Repair:
    """How a layout over the budget is repaired: at most ``attempts`` re-solves, the first
    ``cuts`` of them at the same budget with a no-good cut, the rest at the budget less ``margin``
    times the last overshoot (bytes), each re-solve given ``share`` of the time left."""

    attempts: int = REPAIR_ATTEMPTS
    cuts: int = NO_GOOD_CUTS
    margin: float = 1.0
    share: float = 0.5


# Models above START_MAX_COLUMNS: no cuts (a cut made HiGHS spend 70 s in the 1001-node skip
# graph's root LP), budget reductions with a margin (the 1001-node chain's layout overshot by 13
# bytes, the solution 13 bytes lower by 1, 14 lower fit), each given most of what is left (the
# re-solve at the lower budget took 22 s where the first took 12 s).
LARGE_REPAIR = Repair(attempts=2, cuts=0, margin=1.25, share=0.9)


def _checked(graph, costs: NodeCosts, computes: list[int], budget: int):
    """(schedule, simulation) of a compute order, when it is valid and within the budget."""
    nodes = drop_redundant_computes(graph, [costs.order[v] for v in computes])
    schedule = schedule_from_computes(graph, nodes)
    outcome = simulate(graph, schedule)
    return (schedule, outcome) if outcome.valid else (None, outcome)


@dataclass
class _Search:
    """What one call has in hand: the graph indexed, the clock, the schedules found so far
    (``(cost, peak, schedule, source)``), the relaxation and its first solve, and notes for the
    message."""

    graph: object
    costs: NodeCosts
    budget: int
    clock: Clock
    found: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    model: OrderFreeModel | None = None
    first: Relaxation = field(default_factory=lambda: Relaxation(None))

    def small_model(self) -> bool:
        """Whether the model is small enough for a MIP start and re-solves (``START_MAX_COLUMNS``)."""
        return self.model is not None and len(self.model.integrality) <= START_MAX_COLUMNS


def solve_orderfree(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """The ``orderfree`` method (module docstring): the relaxation's optimum laid out, repaired at
    smaller budgets when it overshoots, against the fast heuristics; ``optimal`` only when the cost
    meets the bound. ``time_limit`` (seconds, default :data:`solvers.options.DEFAULT_TIME_LIMIT`)
    covers building, solving, repairs and heuristics. Raises :class:`Infeasible` when the relaxation
    proves no schedule fits (``min_budget``: the least budget the fallbacks meet, which this method
    then meets) and :class:`SolverTimeout` when time runs out with no schedule."""
    clock = Clock(time_limit_or_default(time_limit))
    costs = node_costs(graph)
    store_all, outcome = _checked(graph, costs, list(range(costs.n)), budget)
    if outcome.peak_bytes <= budget:
        return store_all.with_info(method=METHOD, status=OPTIMAL, gap=0.0, lower_bound=float(sum(costs.cost)),
                                   message="store-all fits the budget")
    # The fast heuristics first: their schedules stand when the MILP runs out of time.
    upfront = ("dp", "chen-greedy") if _quick_dp(graph) else ("chen-greedy",)
    search = _Search(graph, costs, budget, clock, _fallbacks(graph, budget, clock, upfront, HEURISTIC_SHARE))
    _solve_relaxation(search)
    bound = _bound(search)
    if search.first.infeasible:
        least = _fallback_minimum(graph, costs, outcome.peak_bytes, clock)
        raise Infeasible(f"orderfree: the order-free relaxation proves that no schedule fits in {budget} bytes; "
                         f"the least budget this method meets is {least} bytes", min_budget=least, method=METHOD)
    laid = None
    if search.model is not None:
        repair = Repair() if search.small_model() else LARGE_REPAIR
        cheapest = min((item[0] for item in search.found), default=None)
        laid = _laid_out(graph, costs, search.model, search.first, budget, clock, repair, cheapest)
        search.found += [laid] if laid is not None else []
    if laid is not None and _stalled(search, laid, bound):
        search.found += improve_by_windows(search.model, search.first, clock,
                                           lambda result: _fitting(graph, costs, result, budget))
    best = min((item[0] for item in search.found), default=None)
    if _unproven(best, bound) and costs.n <= EXACT_FALLBACK_NODES:
        search.found += _fallbacks(graph, budget, clock, ("exhaustive",), 0.5)
    elif laid is None and "dp" not in upfront:
        # No layout fits: dp's schedule may beat chen-greedy's (its first view can overrun the time
        # left, so not where a layout stands: on the 1001-node chain the call then took 63 s of 60).
        search.found += _fallbacks(graph, budget, clock, ("dp",), 1.0)
    if not search.found:
        raise _nothing_found(search, outcome.peak_bytes)
    return _reported(search, bound)


def _quick_dp(graph) -> bool:
    """Whether dp plans this graph in about a second: every chain view has at most
    ``QUICK_DP_STAGES`` stages (building the views takes ~0.1 s at 1001 nodes)."""
    from ..chain import chain_views

    return all(view.length <= QUICK_DP_STAGES for view in chain_views(graph))


def _stalled(search: _Search, laid: tuple, bound: float) -> bool:
    """Whether the window search should run: the first MILP's own laid-out incumbent fits, is not
    proven, and is no cheaper than the cheapest heuristic schedule it was started from (the MILP
    found nothing better in its time), on a model small enough for MIP starts."""
    heuristics = [item[0] for item in search.found if item is not laid]
    objective = search.first.objective
    return (search.small_model() and laid[3] == "its laid-out optimum" and objective is not None
            and _unproven(laid[0], bound) and bool(heuristics) and objective >= min(heuristics) * (1 - 1e-9))


def _fitting(graph, costs: NodeCosts, result: Relaxation, budget: int):
    """(cost, peak, schedule, source) of the best layout of a window search's solution within
    ``budget``, or ``None``."""
    laid = [_checked(graph, costs, computes, budget) for computes in result.layouts]
    fitting = [(sim.compute_cost, sim.peak_bytes, schedule) for schedule, sim in laid
               if schedule is not None and sim.peak_bytes <= budget]
    if not fitting:
        return None
    cost, peak, schedule = min(fitting, key=lambda item: (item[0], item[1]))
    return cost, peak, schedule, "the window search's solution, laid out"


@dataclass
class _Probe:
    """``give_up`` of the first MILP solve where it has no start (``ILP_START_MAX_NODES``): True
    once ``seconds`` into it while its incumbent is more than ``gap`` from its bound, or it has none.
    ``fired`` records that it gave up."""

    seconds: float = PROBE_SECONDS
    gap: float = PROBE_GAP
    fired: bool = False

    def __call__(self, running: float, gap: float | None) -> bool:
        if not self.fired and running >= self.seconds and (gap is None or gap > self.gap):
            self.fired = True
        return self.fired


def _solve_relaxation(search: _Search) -> None:
    """Build the relaxation, solve its LP (a bound even where the MILP's root does not finish in
    time: 501 nodes, ~4 s; milliseconds on small graphs), then its MILP started from the cheapest
    heuristic schedule; where there is none, from ilp's when the MILP alone finds poor incumbents
    (``_Probe``, ``_started_from_ilp``). Sets ``search.model`` and ``search.first`` (holding the best of
    the LP's and the MILP solves' bounds); on a timeout with schedules in hand, notes it."""
    costs, clock, found = search.costs, search.clock, search.found
    try:
        model = OrderFreeModel(costs, search.budget, choose_milestones(costs)).build(clock)
        lp = model.solve(clock.share(LP_SHARE), integral=False)
        if found and len(model.integrality) <= START_MAX_COLUMNS:
            start = min(found, key=lambda item: item[0])[2]
            start_from(model, [(kind, costs.index[v]) for kind, v in start])
        share = FIRST_SOLVE_SHARE_SMALL if len(model.integrality) <= SMALL_MODEL_COLUMNS else FIRST_SOLVE_SHARE
        probe = _Probe() if not found and costs.n <= ILP_START_MAX_NODES else None
        first = lp if lp.infeasible else model.solve(clock.share(share), give_up=probe)
        if probe is not None and probe.fired:
            first = _started_from_ilp(search, model, first, share)
    except SolverTimeout as error:
        if not found:
            raise
        search.notes.append(str(error))
        return
    if lp.bound is not None and (first.bound is None or first.bound < lp.bound):
        first.bound = lp.bound
    search.model, search.first = model, first


def _started_from_ilp(search: _Search, model: OrderFreeModel, probe: Relaxation, share: float) -> Relaxation:
    """After a probe gave up: ilp's schedule (``ILP_START_SHARE`` of the time left; added to
    ``search.found``), then the MILP again with ``share`` of what is left, started from the cheaper
    of that schedule and the probe's incumbent. Its result, with the better of the two solves' bounds
    (the same model at the same budget: both hold)."""
    import numpy as np

    costs, clock = search.costs, search.clock
    try:
        schedule = solve(search.graph, search.budget, method="ilp", time_limit=clock.share(ILP_START_SHARE),
                         every_order_bound=False, stop_gap=ILP_START_GAP)
    except (Infeasible, TimeoutError, SolverUnavailable):
        schedule = None
    search.notes.append("the MILP started from ilp's schedule" if schedule is not None
                        else "ilp found no schedule to start the MILP from")
    if schedule is not None:
        search.found.append((schedule.info.compute_cost, schedule.info.predicted_peak_bytes, schedule, "ilp"))
    if schedule is not None and (probe.objective is None or schedule.info.compute_cost < probe.objective):
        start_from(model, [(kind, costs.index[v]) for kind, v in schedule])
    elif probe.values is not None:
        model.highs.setSolution(len(model.integrality), np.arange(len(model.integrality), dtype=np.int32),
                                np.array(probe.values, dtype=np.float64))
    if clock.expired():
        return probe
    result = model.solve(clock.share(share))
    bounds = [b for b in (probe.bound, result.bound) if b is not None]
    result.bound = max(bounds) if bounds else None
    return result


def _bound(search: _Search) -> float:
    """Seconds every schedule within the budget needs: the relaxation's bound, never below
    computing every node once."""
    base = float(sum(search.costs.cost))
    return base if search.first.bound is None else max(base, search.first.bound)


def _unproven(best: float | None, bound: float) -> bool:
    """Whether the cheapest cost found (seconds; ``None``: none) is not proven by ``bound``."""
    return best is None or best - bound > OPTIMALITY_TOLERANCE * max(best, 1e-12)


def _nothing_found(search: _Search, store_all_peak: int) -> Exception:
    """The error when no schedule fits: a timeout when out of time or the MILP was stopped by its
    share of it (more time may find one), else :class:`Infeasible` with the fallbacks' least budget."""
    clock, budget = search.clock, search.budget
    stopped = clock.expired() or not search.first.proven
    least = None if stopped else _fallback_minimum(search.graph, search.costs, store_all_peak, clock)
    if least is None or least <= budget:
        return SolverTimeout(f"orderfree: no schedule within {budget} bytes found in {clock.limit:g} s",
                             method=METHOD)
    return Infeasible(f"orderfree: no laid-out solution of the relaxation fits {budget} bytes and the "
                      f"fallbacks found none; the least budget this method meets is {least} bytes",
                      min_budget=least, method=METHOD)


def _reported(search: _Search, bound: float) -> Schedule:
    """The cheapest schedule found, with its status (``optimal`` only when its cost meets the
    bound, or the exhaustive search proved it), gap, bound and a message naming its source."""
    cost, peak, schedule, source = min(search.found, key=lambda item: (item[0], item[1]))
    if source == "exhaustive" and schedule.info.status == OPTIMAL:
        bound = max(bound, schedule.info.lower_bound)  # the search proved its optimum: a bound too
    lower = min(bound, cost)
    gap = 0.0 if cost <= 0 else (cost - lower) / cost
    status = OPTIMAL if gap <= OPTIMALITY_TOLERANCE else FEASIBLE
    notes = list(search.notes)
    if status == OPTIMAL:  # proven up to the solver's tolerance (the bound is lowered by BOUND_SAFETY)
        lower, gap = cost, 0.0
    elif search.model is not None and not search.first.proven:
        notes.append("time limit reached before the relaxation was solved: its dual bound stands")
    model = search.model
    marks = "" if model is None else f"; bound of the order-free relaxation with {len(model.marks)} milestones"
    source = source if source.startswith(("its", "the relax", "the window")) else f"{source}'s schedule"
    return schedule.with_info(method=METHOD, status=status, gap=gap, lower_bound=lower, budget_bytes=search.budget,
                              compute_cost=cost, predicted_peak_bytes=peak,
                              message="; ".join([source + marks] + notes))


def start_from(model: OrderFreeModel, steps) -> None:
    """A MIP start read off a valid schedule (``steps``: (kind, position) pairs; see
    :func:`schedule_point`): HiGHS then starts from that schedule's cost instead of searching
    for a first incumbent (it drops a start that breaks a row, e.g. a sink computed twice)."""
    import numpy as np

    values = schedule_point(model, steps)
    if values is None:
        return
    n_cols = len(model.integrality)
    dense = np.zeros(n_cols, dtype=np.float64)
    for column, value in values.items():
        dense[column] = value
    model.highs.setSolution(n_cols, np.arange(n_cols, dtype=np.int32), dense)


def schedule_point(model: OrderFreeModel, steps) -> dict[int, float] | None:
    """The model's point of a valid schedule (``steps``: (kind, position) pairs), as in the package
    docstring's proof: c[i,v] = 1 where v is computed in interval i, h[j,u] = 1 where u is held when
    x_j is first computed, z and w at the least values their rows allow. Column -> value, columns
    left out at 0; ``None`` when the model cannot read the schedule (not the graph's, or out of order).
    For a schedule within the model's budget it meets every row, at an objective no greater than the
    schedule's cost: as in the proof, only the last computation of each sink is read (a sink
    computed twice, as ilp's schedules may, breaks the coverage row that says once, and HiGHS drops
    the whole start)."""
    number = {x: j + 1 for j, x in enumerate(model.marks)}
    values, held, interval = {}, set(), 0
    steps = _last_sink_computations(model.costs, list(steps))
    for kind, v in steps:
        if kind == "free":
            held.discard(v)
            continue
        if number.get(v) == interval + 1:  # x_j's first computation: a milestone
            interval += 1
            values.update({model.h[interval, u]: 1.0 for u in held if (interval, u) in model.h})
        if (interval, v) not in model.c:
            return None
        values[model.c[interval, v]] = 1.0
        held.add(v)
    m = len(model.marks)
    for (i, u), column in model.z.items():
        after = values.get(model.h.get((i + 1, u)), 0.0) if i < m else 1.0
        values[column] = max(0.0, values.get(model.h[i, u], 0.0) + after - values.get(model.c[i, u], 0.0) - 1.0)
    _start_worst(model, values)
    return values


def _last_sink_computations(costs: NodeCosts, steps: list) -> list:
    """``steps`` without the computations of sinks (nodes nobody reads) before their last one: nobody
    reads those results, so dropping them lowers no step's memory need and keeps the schedule valid."""
    last = {v: k for k, (kind, v) in enumerate(steps) if kind != "free" and not costs.succs[v]}
    return [(kind, v) for k, (kind, v) in enumerate(steps)
            if kind == "free" or costs.succs[v] or last[v] == k]


def _start_worst(model: OrderFreeModel, values: dict) -> None:
    """w[i] of a MIP start: the largest bytes a computation in interval i adds to what is held
    throughout it (the rows of ``OrderFreeModel._interval_memory``), at least 0."""
    costs = model.costs
    for i, column in model.w.items():
        worst = 0.0
        for v in range(costs.n):
            if values.get(model.c.get((i, v)), 0.0) > 0.5 and model.marks[i - 1] != v:
                inputs = costs.preds[v]
                own = costs.mem[v] + costs.workspace[v] + sum(costs.mem[u] for u in inputs)
                worst = max(worst, own - sum(costs.mem[u] * values.get(model.z.get((i, u)), 0.0) for u in inputs))
        values[column] = worst


def _laid_out(graph, costs: NodeCosts, model: OrderFreeModel, first: Relaxation, budget: int, clock: Clock,
              repair: Repair | None = None, below: float | None = None):
    """(cost, peak, schedule, source) of the first layout within ``budget``: the optimum's; else,
    at the same budget, another solution (a cut excludes each one tried, up to ``repair.cuts``);
    else solutions at the budget less ``repair.margin`` times the last overshoot (halved while that
    is infeasible). At most ``repair.attempts`` re-solves. ``None`` when none fits.

    ``below`` (seconds: the cheapest schedule in hand): the re-solves seek only solutions cheaper
    than it and stop at the first (``OrderFreeModel.solve``), instead of proving each optimal.
    Measured on FCN-8s at 81% of its peak (load 4-4.9): the proven optimum's layouts overshot by
    261 kB; with ilp's +11.64% as ``below`` the first cut's re-solve found a +11.57% solution in 3.9 s
    (overshooting), the second a +11.49% one in 8.3 s whose layout fits; not stopping at the first, each
    re-solve ran its whole 15 s (the cut-off alone does not end a run)."""
    repair = Repair() if repair is None else repair
    result, target, cuts, reduction = first, budget, 0, 0
    for attempt in range(repair.attempts + 1):
        if result.layouts:
            laid = [_checked(graph, costs, computes, budget) for computes in result.layouts]
            schedule, sim = min(laid, key=lambda pair: (pair[0] is None, pair[1].peak_bytes))
            if schedule is not None and sim.peak_bytes <= budget:
                source = "its laid-out optimum" if attempt == 0 else (
                    f"the relaxation's solution at {target} bytes, laid out" if target < budget
                    else f"its laid-out solution after {cuts} cut(s)")
                return sim.compute_cost, sim.peak_bytes, schedule, source
            reduction = max(1, math.ceil(repair.margin * (sim.peak_bytes - budget)))
        elif target == budget or reduction <= 1:
            return None  # out of time, or infeasible at the budget (all cuts) or one byte below it
        else:
            reduction //= 2  # infeasible that far below the budget: ask for less
        if attempt == repair.attempts or clock.expired():
            return None
        if result.layouts and cuts < repair.cuts:
            model.exclude(result.chosen)
            cuts += 1
        else:
            target = budget - reduction
            model.set_budget(target)
        result = model.solve(clock.share(repair.share), below=below)
    return None


def _fallbacks(graph, budget: int, clock: Clock, methods: tuple, share: float) -> list:
    """(cost, peak, schedule, source) of the other methods' schedules that fit, each given ``share``
    of the time left: the fast heuristics (their schedules stand where the MILP runs out of time)
    and, on graphs of at most ``EXACT_FALLBACK_NODES`` nodes, the exhaustive search (where no
    layout fits, or the bound is loose: the order between milestones decides the peak)."""
    found = []
    for method in methods:
        if clock.expired():
            break
        other = schedule_from(graph, budget, method, clock.share(share))
        if other is not None:
            found.append((other.info.compute_cost, other.info.predicted_peak_bytes, other, method))
    return found


def _fallback_minimum(graph, costs: NodeCosts, store_all_peak: int, clock: Clock) -> int | None:
    """The least budget the fallbacks meet (the exhaustive search's minimum peak on small graphs),
    which this method then meets; ``None`` when the search runs out of time."""
    from .. import exhaustive
    from ..api import method_function

    if costs.n <= EXACT_FALLBACK_NODES:
        try:
            return exhaustive.min_peak(graph, clock.left())
        except TimeoutError:
            return None
    least = store_all_peak
    for method in ("dp", "chen-greedy"):
        try:
            method_function(method)(graph, 0)
        except Infeasible as error:
            if error.min_budget is not None:
                least = min(least, int(error.min_budget))
    return least
