"""``solver="auto"``: the best of the methods that fit the graph, and why.

- If the un-checkpointed step fits, store-all: nothing to recompute, nothing to search.
- Otherwise the fast planners on the chain view (``dp``, optimal in the chain model, and
  ``chen-greedy``).
- Then, on graphs of at most :data:`ORDERFREE_MAX_NODES` nodes, with the exact methods' seconds
  (``time_limit``, default :data:`DEFAULT_EXACT_SECONDS`): on graphs with repeated blocks (a block
  class of at least :data:`solvers.hierarchical.REPEATED_MEMBERS` members: every transformer
  layer the same) whose menu offers a choice (:func:`solvers.hierarchical.repeated_choices`)
  ``hierarchical`` with :data:`HIERARCHICAL_SHARE` of them (its block program's
  plan, started from the fast methods' schedules, and the order-free relaxation's bound), else
  ``orderfree`` with :data:`ORDERFREE_SHARE` (its laid-out optimum, and the same bound); either
  with at least :data:`SOLE_EXACT_SHARE` above :data:`EXACT_MAX_NODES` nodes, where nothing runs
  after it, and where no fast method's schedule fits the budget. When the bound meets the cheapest
  schedule's cost, that schedule is proven optimal and nothing else runs.
- Otherwise, on graphs of at most :data:`EXACT_MAX_NODES` nodes, ``cpsat`` with the rest of those
  seconds, hinted with the fast methods' schedules. The cheapest schedule wins; its ``lower_bound``
  is the best bound any of them proved (the order-free one, or cpsat's own), its status
  ``optimal`` when that bound meets its cost and ``feasible`` with the gap otherwise; the message
  says which bound certifies.

``time_limit`` (seconds) bounds the whole call, model building included as each solver counts it:
each method gets at most what is left of it, and none starts once it is spent and a schedule is in
hand. Without it the fast methods run unlimited and the exact ones share
:data:`DEFAULT_EXACT_SECONDS`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .api import solve
from .errors import Infeasible, SolverUnavailable
from .schedule import Schedule
from .simulate import simulate
from .store_all import store_all_schedule

# CP-SAT searches all schedules. Up to about this many nodes, hinted with the fast methods' schedules,
# it improves on them within a minute on two cores: in docs/solvers-benchmark.md (60 s each) it is
# the cheapest method on all four profiled graphs (161-235 nodes). It seldom proves optimality there:
# it does on the 21-node chain and the skip graphs of up to 101 nodes, but on the chains of 51-201
# nodes and the GPT-2 and MLP graphs its proven gap stays at 8.6-14.2% (1.1% on the U-Net).
EXACT_MAX_NODES = 250
# orderfree (and hierarchical, which runs its relaxation) up to this many nodes: measured in
# docs/solvers-benchmark.md at 60 s, the 1001-node chain +12.1% certified within 0.4% in 25-26 s,
# the 1001-node skip graph proven optimal in 6.5-17.9 s, the 595-node 48-layer GPT-2 within 0.5% in
# 52-56 s. Larger graphs are not measured.
ORDERFREE_MAX_NODES = 1001
DEFAULT_EXACT_SECONDS = 30.0
FAST_METHODS = ("dp", "chen-greedy")
# Then orderfree or hierarchical (up to ORDERFREE_MAX_NODES nodes: a laid-out schedule and a bound
# over every order), and cpsat (up to EXACT_MAX_NODES) only where that bound does not prove the
# cheapest schedule optimal.
EXACT_METHODS = ("orderfree", "hierarchical", "cpsat")
# orderfree's share of the exact methods' seconds (time_limit, or DEFAULT_EXACT_SECONDS); cpsat
# gets what it leaves (at least half of the rest). Measured (docs/solvers.md): orderfree proves
# Checkmate's chains and skip graphs of 21-101 nodes and a 161-node U-Net optimal in 0.1-15 s, where
# cpsat's own search proved none of the chains of 51-101 nodes in 60 s. On the 100-250-node graphs
# its MILP needs most of a minute (docs/solvers-benchmark.md, "auto's share"): at 60 s (load ~4)
# gpt2-12-module3 +16.3% within 0.2%, resnet-mlp-module1 +14.9% optimal, unet-module3 +1.1%
# optimal; with half of 60 s (load 6-8) it kept dp's schedule on all three (+21.0%, +17.0%, +1.6%)
# and auto returned cpsat's +17.8% with 2.9% on gpt2-12-module3. cpsat after a whole minute of
# orderfree (load 7-10) was cheaper where orderfree had stalled at dp's schedule (gpt2-12-module3
# +16.7% against +21.0%, resnet-mlp-module1 +15.2% against +17.0%) and by 0.1% on gpt2-12-module4
# (not than hierarchical, which auto runs there), never on the chains, skip graphs or U-Net; and
# cpsat's 6 s there gave most of its 30 s's gain (+18.0%, +15.4%).
ORDERFREE_SHARE = 0.85
# hierarchical's share on graphs with repeated blocks: its relaxation's MILP and window search use
# most of a minute on the 12-layer GPT-2 module graphs (docs/solvers.md), and cpsat's bound there
# is about the cost of computing everything once.
HIERARCHICAL_SHARE = 0.9
# orderfree's or hierarchical's share above EXACT_MAX_NODES, where cpsat does not run after them.
# With half of 60 s, orderfree on the 595-node 48-layer GPT-2 graph returned +21.2% with only the
# bound of computing everything once (17.5% gap) at a load average of 14; given 60 s, within 0.5%.
# Also where no fast method's schedule fits the budget (cpsat then has no hint): on the five MLSys
# cases of docs/solvers-benchmark.md where none fits (VGG16 and VGG19 at both budgets, FCN-8s at
# point 0.2) cpsat's 60 s schedules were +16.6% to +44.5%, orderfree's +3.3% to +31.8%; and on
# FCN-8s orderfree needs most of the minute (a probe, ilp's start, its MILP from it: within 0.74%
# in 59.0 s of a 60 s call, load 4.5).
SOLE_EXACT_SHARE = 0.95
# A method that runs at all gets at least this many seconds (a searching solver refuses a limit of 0).
MIN_METHOD_SECONDS = 0.05
# A cost within this relative distance of a bound is proven optimal (the solvers' tolerance).
OPTIMALITY_TOLERANCE = 1e-7


def solve_auto(graph, budget: int, time_limit: float | None = None) -> Schedule:
    store_all = store_all_schedule(graph)
    if simulate(graph, store_all).peak_bytes <= budget:
        return store_all.with_info(
            method="store-all", status="optimal", gap=0.0,
            message="auto: store-all, the step fits the budget without recomputation",
        )
    methods, share = _portfolio(graph)
    run = _Run(graph, budget, time_limit, share)
    for method in methods:
        if not run.worth_starting(method):
            break
        run.attempt(method)
    return _certified(run.tried, run.minimums, budget)


def _portfolio(graph) -> tuple[list[str], float]:
    """The methods auto runs on ``graph``, in order, and the relaxation's share of the exact seconds."""
    nodes = graph.number_of_nodes()
    methods = list(FAST_METHODS)
    share = ORDERFREE_SHARE
    if nodes <= ORDERFREE_MAX_NODES:
        from .hierarchical import REPEATED_MEMBERS, repeated_choices

        members, choices = repeated_choices(graph)
        if members >= REPEATED_MEMBERS and choices >= 2:
            methods.append("hierarchical")
            share = HIERARCHICAL_SHARE
        else:
            methods.append("orderfree")
    if nodes <= EXACT_MAX_NODES:
        methods.append("cpsat")
    else:  # nothing runs after the relaxation: it gets nearly all the exact seconds
        share = max(share, SOLE_EXACT_SHARE)
    return methods, share


@dataclass
class _Run:
    """One auto call's methods as they run: what each returned, the minimums they proved, and the
    time left to the next (``time_limit`` bounds auto as a whole: each method gets at most what is
    left of it)."""

    graph: object
    budget: int
    time_limit: float | None
    share: float
    tried: list[tuple[str, Schedule | None]] = field(default_factory=list)
    minimums: list[int] = field(default_factory=list)
    exact_started: float | None = None

    def __post_init__(self):
        self.deadline = None if self.time_limit is None else time.perf_counter() + self.time_limit
        self.exact_seconds = self.time_limit or DEFAULT_EXACT_SECONDS

    def _found_any(self) -> bool:
        return any(s is not None for _, s in self.tried)

    def _left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def worth_starting(self, method: str) -> bool:
        if method == "cpsat" and _proven(self.tried):
            return False  # the order-free bound already proves the cheapest schedule optimal
        left = self._left()
        return not (left is not None and left <= 0 and self._found_any())  # out of time, with a schedule

    def _limit(self, method: str) -> float | None:
        """Seconds ``method`` gets: what is left; the relaxation its share of the exact seconds; cpsat
        without a time limit what the relaxation left of them, at least a share."""
        left = self._left()
        limit = left
        if method in ("orderfree", "hierarchical"):
            if not self._found_any():
                self.share = max(self.share, SOLE_EXACT_SHARE)  # no fast schedule fits: little for cpsat after it
            self.exact_started = time.perf_counter()
            limit = self.exact_seconds * self.share if left is None else min(self.exact_seconds * self.share, left)
        elif method == "cpsat" and left is None:
            used = time.perf_counter() - (self.exact_started or time.perf_counter())
            limit = max(self.exact_seconds - used, self.exact_seconds * (1 - self.share) / 2)
        return None if limit is None else max(limit, MIN_METHOD_SECONDS)

    def attempt(self, method: str) -> None:
        limit = self._limit(method)
        options = {}
        if method == "hierarchical":  # it starts its relaxation from the fast methods' schedules
            options["starts"] = [s for _, s in self.tried if s is not None]
        try:
            self.tried.append((method, solve(self.graph, self.budget, method=method, time_limit=limit, **options)))
        except Infeasible as error:
            self.tried.append((method, None))
            if error.min_budget is not None:
                self.minimums.append(int(error.min_budget))
        except (TimeoutError, SolverUnavailable):
            self.tried.append((method, None))


def _certified(tried, minimums: list[int], budget: int) -> Schedule:
    """The cheapest schedule tried, its status and gap against the best bound any method proved, and
    a message saying which method won and what certifies it. Raises Infeasible when none fits."""
    found = [(m, s) for m, s in tried if s is not None]
    names = ", ".join(m for m, _ in tried)
    if not found:
        minimum = min(minimums) if minimums else None
        raise Infeasible(
            f"auto ({names}): no schedule fits in {budget} bytes"
            + (f"; the least any of them reaches is {minimum} bytes" if minimum is not None else ""),
            min_budget=minimum,
            method="auto",
        )
    method, best = min(found, key=lambda item: (item[1].info.compute_cost, item[1].info.predicted_peak_bytes))
    others = ", ".join(f"{m} {s.info.compute_cost:.4g} s" for m, s in found if m != method)
    reason = f"auto: {method} was cheapest of {names}" + (f" (others: {others})" if others else "")
    bound = _best_bound(found)
    info, cost = best.info, best.info.compute_cost
    if bound is not None and info.status != "optimal":
        lower = min(bound[0], cost)
        gap = 0.0 if cost <= 0 else (cost - lower) / cost
        if gap <= OPTIMALITY_TOLERANCE:
            best = best.with_info(status="optimal", gap=0.0, lower_bound=cost)
            reason += f"; proven optimal by {bound[1]}"
        else:
            best = best.with_info(status="feasible", gap=gap, lower_bound=lower)
            reason += f"; within {gap:.2%} of {bound[1]} ({lower:.6g} s)"
    elif info.status == "optimal" and method != "store-all":
        reason += f"; proven optimal by {method}"
    note = f"; {best.info.message}" if best.info.message else ""
    return best.with_info(message=reason + note)


def _best_bound(found) -> tuple[float, str] | None:
    """The highest lower bound any method reported (each holds for every schedule, in any order),
    with what it is: (seconds, words)."""
    bound = None
    for method, schedule in found:
        value = schedule.info.lower_bound
        if value is not None and (bound is None or value > bound[0]):
            words = ("the order-free relaxation's bound" if method in ("orderfree", "hierarchical")
                     else f"{method}'s bound")
            bound = (value, words)
    return bound


def _proven(tried) -> bool:
    """Whether the best bound so far meets the cost of the cheapest schedule tried so far."""
    found = [(m, s) for m, s in tried if s is not None]
    bound = _best_bound(found)
    cost = min((s.info.compute_cost for _, s in found), default=None)
    return bound is not None and cost is not None and cost - bound[0] <= OPTIMALITY_TOLERANCE * max(cost, 1e-12)
