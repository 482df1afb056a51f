"""``chen-sqrtn`` and ``chen-greedy``: segment checkpointing on the chain view.

Chen, Xu, Zhang, Guestrin, "Training Deep Nets with Sublinear Memory Cost" (arXiv 1604.06174, 2016).
Both methods keep the inputs of a few stages (the segment starts, Chen's articulation points) in the
forward pass, drop everything else, and recompute one segment at a time in the backward pass: the
schedule of ``torch.utils.checkpoint.checkpoint_sequential``. They differ in where the segments
start:

- ``chen-sqrtn`` (§4.1): ``k = ceil(sqrt(L))`` segments of (nearly) equal stage count, so memory is
  O(L/k + k) = O(sqrt(L)) stages for about one extra forward pass.
- ``chen-greedy`` (Algorithm 3, "memory planning with budget", with the threshold search of §4.2):
  walk the stages with a running sum of their memory and start a new segment once it exceeds a
  threshold ``B``. ``B`` is not the memory budget; the method tries many thresholds and keeps the
  cheapest plan whose *simulated* peak fits the real budget.

Both work on each of :func:`solvers.chain.chain_views`, lower the chain sequence to a schedule of
the full graph with :meth:`ChainView.lower`, and decide by :func:`solvers.simulate` alone: the
chain model is conservative, so its sizes only guide the search. This module also holds what the
chain heuristics share (:class:`Candidate`, :class:`Plan`, :func:`solve_by_plans`: store-all first, then
the cheapest candidate that fits, else ``Infeasible``); ``solvers.revolve`` uses it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Sequence

from .chain import ChainView, chain_views
from .chainmodel import Chain, Op
from .errors import Infeasible
from .graph import total_cost
from .schedule import Schedule
from .simulate import simulate
from .store_all import store_all_schedule


# -- what the three chain heuristics share ------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One plan of a chain heuristic, summarised without lowering or simulating it.

    ``build()`` makes its chain sequence and ``cost()`` its exact compute cost (seconds, what
    :func:`solvers.simulate` will report, see :func:`plan_seconds`); both are called only for the
    candidates the search needs (a revolve sequence with one slot has L(L+1)/2 forward ops).
    ``cost_lower_bound`` (seconds) and ``peak_lower_bound`` (bytes, :func:`checkpoint_bytes` of the
    checkpoints held across the loss) are cheap and sound: a candidate whose peak bound is over the
    budget is never simulated, and one whose cost bound is over the best plan found is never costed.
    ``label`` says in words which plan it is (for messages).
    """

    label: str
    build: Callable[[], Sequence[Op]]
    cost: Callable[[], float]
    cost_lower_bound: float
    peak_lower_bound: int = 0


@dataclass(frozen=True)
class Plan:
    """A candidate lowered to a schedule of the full graph, with :func:`solvers.simulate`'s verdict."""

    label: str
    schedule: Schedule
    peak_bytes: int
    cost_seconds: float


def stage_forward_seconds(view: ChainView) -> list[float]:
    """Seconds of one more run of each stage ``0..L-1``: its forward nodes, reserved ones excluded
    (:meth:`ChainView.computes` computes a reserved node only once)."""
    nodes = view.graph.nodes
    return [float(sum(nodes[v]["cost"] for v in view.forward[i] if v not in view.reserved))
            for i in range(view.length)]


def plan_seconds(base_seconds: float, stage_seconds: Sequence[float], runs: Sequence[int]) -> float:
    """Compute cost (seconds) of a chain sequence that runs stage ``i``'s forward ``runs[i]`` times.

    Every node is computed once in any plan (``base_seconds``, the graph's total cost), and the
    backward and the loss run exactly once, so only the forward runs beyond the first add cost.
    """
    return base_seconds + sum((count - 1) * seconds for count, seconds in zip(runs, stage_seconds))


def boundary_bytes(view: ChainView, stage: int) -> int:
    """Bytes that certainly stay held while the checkpoint ``x_stage`` is kept: the last node of
    stage ``stage - 1`` when stage ``stage`` reads it (by construction of the chain view it is the
    only non-reserved forward result crossing the boundary)."""
    last = view.forward[stage - 1][-1]
    graph = view.graph
    if last in view.reserved or not any(s in view.forward[stage] for s in graph.successors(last)):
        return 0
    return int(graph.nodes[last]["mem"])


def checkpoint_bytes(view: ChainView, stages: Iterable[int]) -> int:
    """A lower bound (bytes) on the peak of a schedule holding checkpoints ``x_i``, ``i`` in
    ``stages``, at once: the lowered schedule holds :func:`boundary_bytes` for each (``x_0`` is the
    graph's input and holds nothing)."""
    return sum(boundary_bytes(view, stage) for stage in set(stages) if stage > 0)


def evaluate(view: ChainView, item: Candidate) -> Plan:
    """Lower a candidate's chain sequence to a schedule of the full graph and simulate it."""
    schedule = view.lower(item.build())
    outcome = simulate(view.graph, schedule)
    if not outcome.valid:
        # The lowering of a well-formed chain sequence is always valid; this is a bug, not a user error.
        raise AssertionError(f"{item.label}: the lowered chain sequence is invalid: {outcome.error}")
    return Plan(item.label, schedule, outcome.peak_bytes, outcome.compute_cost)


def store_all_plan(graph) -> Plan:
    """The un-checkpointed schedule: no plan can be cheaper, so every chain method tries it first."""
    schedule = store_all_schedule(graph)
    outcome = simulate(graph, schedule)
    return Plan("store-all (no recomputation)", schedule, outcome.peak_bytes, outcome.compute_cost)


def cheapest_fitting(view: ChainView, candidates: Sequence[Candidate], budget: int) -> tuple[Plan | None, list[Plan]]:
    """The cheapest candidate whose simulated peak fits ``budget`` (ties: the smaller peak).

    Best-first on cost: a heap keyed by each candidate's cost lower bound until its exact cost is
    known, then by its exact cost; a candidate is simulated when it comes out with its exact cost,
    so the first fitting plan is the cheapest and the search stops after its cost level.
    Candidates whose peak lower bound is over the budget are set aside unsimulated. When none
    fits, the second value holds every plan that could have the least peak (the others' peak
    bounds are at least that peak), so its least peak is the least over all candidates.
    """
    heap = [(item.cost_lower_bound, False, index) for index, item in enumerate(candidates)]
    heapq.heapify(heap)
    simulated: list[Plan] = []
    skipped: list[Candidate] = []
    best: Plan | None = None
    while heap:
        key, exact, index = heapq.heappop(heap)
        item = candidates[index]
        if best is not None and key > best.cost_seconds:
            break
        if item.peak_lower_bound > budget:
            skipped.append(item)
            continue
        if not exact:
            heapq.heappush(heap, (item.cost(), True, index))
            continue
        plan = evaluate(view, item)
        simulated.append(plan)
        if plan.peak_bytes <= budget and (best is None or plan.peak_bytes < best.peak_bytes):
            best = plan
    if best is None:
        least = min((plan.peak_bytes for plan in simulated), default=None)
        for item in sorted(skipped, key=lambda item: item.peak_lower_bound):
            if least is not None and item.peak_lower_bound >= least:
                break
            plan = evaluate(view, item)
            simulated.append(plan)
            least = plan.peak_bytes if least is None else min(least, plan.peak_bytes)
    return best, simulated


def as_result(plan: Plan, method: str, optimal: bool) -> Schedule:
    """The schedule to return: store-all is provably cheapest; every other plan is a heuristic."""
    if optimal:
        return plan.schedule.with_info(method=method, status="optimal", gap=0.0, lower_bound=plan.cost_seconds,
                                       message=f"{method}: {plan.label}")
    return plan.schedule.with_info(method=method, status="heuristic", message=f"{method}: {plan.label}")


def infeasible(method: str, budget: int, plans: Sequence[Plan]) -> Infeasible:
    """``Infeasible`` whose ``min_budget`` is the least simulated peak over ``plans``: the smallest budget
    at which the method (which searches the same plans at any budget) succeeds."""
    least = min(plans, key=lambda plan: (plan.peak_bytes, plan.cost_seconds))
    return Infeasible(
        f"{method} needs at least {least.peak_bytes} bytes ({least.label}), more than the budget of {budget} bytes",
        min_budget=least.peak_bytes,
        method=method,
    )


def solve_by_plans(graph, budget: int, method: str,
                   candidates: Callable[[ChainView], Iterable[Candidate]]) -> Schedule:
    """The common frame: store-all if it fits, else the cheapest candidate that fits, else Infeasible.

    ``candidates`` lists the method's plans on a chain view; they are tried on every one of
    :func:`solvers.chain.chain_views`. They must not depend on ``budget``: then the ``min_budget``
    reported here (the least simulated peak over all of them and store-all) is a budget at which
    the same search succeeds.
    """
    baseline = store_all_plan(graph)
    if baseline.peak_bytes <= budget:
        return as_result(baseline, method, optimal=True)
    best: Plan | None = None
    simulated: list[Plan] = []
    for view in chain_views(graph):
        found, tried = cheapest_fitting(view, list(candidates(view)), budget)
        simulated.extend(tried)
        if found is not None and (best is None or (found.cost_seconds, found.peak_bytes) < (best.cost_seconds, best.peak_bytes)):
            best = found
    if best is None:
        raise infeasible(method, budget, [baseline, *simulated])
    return as_result(best, method, optimal=False)


# -- the segment schedule both Chen methods use -------------------------------------------------


def segment_sequence(length: int, starts: Sequence[int]) -> list[Op]:
    """The chain sequence of segment checkpointing (``checkpoint_sequential``'s schedule).

    ``length`` is L (stages ``0..L-1`` before the loss); ``starts`` are the first stages of the
    segments, 0 included, in increasing order: the segment inputs ``x_start`` are the checkpoints.

    Forward: each segment but the last runs without grad from its checkpoint (``CF`` at its start,
    ``Fn`` through it); the last runs with grad (``Fe``), since its results are needed right away.
    Then the loss ``L``, the backward of the last segment, and for every earlier segment, from the
    last to the first, its recomputation with grad from its checkpoint followed by its backward.
    """
    bounds = _segment_bounds(length, starts)
    sequence: list[Op] = []
    for begin, end in bounds[:-1]:
        sequence.append(Op("CF", begin))
        sequence.extend(Op("Fn", i) for i in range(begin + 1, end))
    if bounds:
        begin, end = bounds[-1]
        sequence.extend(Op("Fe", i) for i in range(begin, end))
    sequence.append(Op("L", length))
    for index, (begin, end) in reversed(list(enumerate(bounds))):
        if index < len(bounds) - 1:
            sequence.extend(Op("Fe", i) for i in range(begin, end))
        sequence.extend(Op("B", i) for i in reversed(range(begin, end)))
    return sequence


def _segment_bounds(length: int, starts: Sequence[int]) -> list[tuple[int, int]]:
    """``[(begin, end), ...]`` of the segments starting at ``starts`` (checked: 0 first, increasing)."""
    if length == 0:
        return []
    starts = list(starts)
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= length:
        raise ValueError(f"segment starts must be increasing, begin with 0 and stay below L={length}: {starts}")
    return list(zip(starts, [*starts[1:], length]))


def segment_candidate(view: ChainView, starts: Sequence[int], base_seconds: float,
                      stage_seconds: Sequence[float]) -> Candidate:
    """The segment plan with ``starts`` as a :class:`Candidate`.

    Every stage outside the last segment runs twice (once without grad, once recomputed); the
    checkpoints of the segments but the first and the last are held across the loss (the last
    segment's input is read only by the first pass).
    """
    length = view.length
    starts = tuple(starts)
    bounds = _segment_bounds(length, starts)
    last_begin = bounds[-1][0] if bounds else 0
    runs = [2 if i < last_begin else 1 for i in range(length)]
    cost = plan_seconds(base_seconds, stage_seconds, runs)
    return Candidate(
        label=_describe(starts),
        build=lambda: segment_sequence(length, starts),
        cost=lambda: cost,
        cost_lower_bound=cost,
        peak_lower_bound=checkpoint_bytes(view, starts[1:-1]),
    )


def _describe(starts: Sequence[int]) -> str:
    shown = ", ".join(map(str, starts[:12])) + (", ..." if len(starts) > 12 else "")
    return f"{len(starts)} segment(s) starting at stages [{shown}]"


# -- chen-sqrtn -----------------------------------------------------------------------------------


def sqrtn_starts(length: int) -> list[int]:
    """Starts of ``ceil(sqrt(L))`` segments of nearly equal stage count (Chen et al. §4.1).

    Segment sizes differ by at most one; the longer ones come last, because the last segment is
    the one that is never recomputed (as ``checkpoint_sequential`` leaves its remainder there).
    """
    if length == 0:
        return []
    count = math.isqrt(length - 1) + 1  # ceil(sqrt(L)) for L >= 1, exactly
    short, longer = divmod(length, count)
    sizes = [short] * (count - longer) + [short + 1] * longer
    return [sum(sizes[:k]) for k in range(count)]


def solve_chen_sqrtn(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """``chen-sqrtn``: ``ceil(sqrt(L))`` equal segments on the chain view; no knob, one plan.

    Returns store-all when it fits (status ``optimal``), else the sqrt(L) plan (``heuristic``);
    raises :class:`Infeasible` with ``min_budget`` = the smaller simulated peak of the two.
    ``time_limit`` is accepted and unused: there is nothing to search.
    """

    def candidates(view: ChainView) -> list[Candidate]:
        return [segment_candidate(view, sqrtn_starts(view.length), total_cost(graph), stage_forward_seconds(view))]

    return solve_by_plans(graph, budget, "chen-sqrtn", candidates)


# -- chen-greedy ----------------------------------------------------------------------------------


def stage_bytes(chain: Chain) -> list[int]:
    """Chen's ``size(v)`` per stage: bytes a stage keeps for its backward when run with grad
    (``xbar[i+1]`` of the chain model), i.e. what a segment accumulates while it is recomputed."""
    return [int(chain.xbar[i + 1]) for i in range(chain.length)]


def greedy_starts(sizes: Sequence[int], threshold: float, from_loss: bool = False) -> list[int]:
    """Chen et al. Algorithm 3 on stages: ``temp += size``; at a stage boundary with ``temp > B``,
    keep the boundary (a new segment starts there) and reset ``temp`` to 0.

    The paper walks from the input (``from_loss=False``), which leaves the remainder, often a short
    segment, last. Under ``checkpoint_sequential``'s schedule the last segment is the one never
    recomputed, so a short one wastes recomputation; walking from the loss (``from_loss=True``)
    leaves the remainder first instead. :func:`solve_chen_greedy` tries both.
    """
    length = len(sizes)
    if length == 0:
        return []
    kept = set()
    temp = 0
    if not from_loss:
        for i in range(length - 1):  # the boundary after the last stage is the loss: not a split
            temp += sizes[i]
            if temp > threshold:
                kept.add(i + 1)
                temp = 0
    else:
        for i in range(length - 1, 0, -1):  # boundary i is before stage i; 0 is always a start
            temp += sizes[i]
            if temp > threshold:
                kept.add(i)
                temp = 0
    return [0, *sorted(kept)]


def sqrt_xy_threshold(sizes: Sequence[int], input_bytes: Sequence[int]) -> float:
    """The paper's starting threshold ``sqrt(x * y)`` from the ``B = 0`` plan: ``x`` the bytes of its
    checkpoints (``input_bytes[i]``, the chain's ``x[i]``, for each segment start ``i``), ``y`` the
    largest segment (every stage is its own segment at ``B = 0``)."""
    starts = greedy_starts(sizes, 0)
    x = sum(input_bytes[s] for s in starts)
    y = max(sizes, default=0)
    return math.sqrt(x * y)


def greedy_thresholds(sizes: Sequence[int], input_bytes: Sequence[int], steps_per_octave: int = 8) -> list[float]:
    """The thresholds ``chen-greedy`` tries (bytes), independent of the budget.

    The paper's grid over ``[b/sqrt2, b*sqrt2]`` around ``b = sqrt(x*y)``, then wider: a geometric grid
    (``steps_per_octave`` points per doubling) from the smallest stage to the whole chain, since on
    uneven chains the best threshold can be far from ``b``. ``0`` (every stage a segment) and
    ``inf`` (one segment: the whole forward kept) close the range.
    """
    positive = [s for s in sizes if s > 0]
    if not positive:
        return [0.0]
    b = sqrt_xy_threshold(sizes, input_bytes)
    thresholds = {0.0, math.inf}
    if b > 0:
        thresholds.update(b * 2 ** (k / (2 * steps_per_octave)) for k in range(-steps_per_octave, steps_per_octave + 1))
    low, high = min(positive), sum(positive)
    octaves = math.log2(high / low) if high > low else 0.0
    points = int(math.ceil(octaves * steps_per_octave)) + 1
    thresholds.update(low * 2 ** (k / steps_per_octave) for k in range(points + 1))
    return sorted(thresholds)


def threshold_starts(chain: Chain) -> list[list[int]]:
    """The distinct segmentations of Algorithm 3 over :func:`greedy_thresholds`, walked from either end."""
    sizes = stage_bytes(chain)
    seen: dict[tuple[int, ...], None] = {}
    for threshold in greedy_thresholds(sizes, chain.x):
        for from_loss in (False, True):
            seen.setdefault(tuple(greedy_starts(sizes, threshold, from_loss)), None)
    return [list(starts) for starts in seen]


def greedy_candidate_starts(view: ChainView) -> list[list[int]]:
    """The segmentations ``chen-greedy`` tries: :func:`threshold_starts` plus the sqrt(L) split.

    Why the sqrt(L) split: one threshold over bytes gives segments of (nearly) equal bytes, but the
    best segmentation need not be one. Memory pressure differs along the backward (when segment j is
    recomputed only the checkpoints before it are held) and the cost depends on which stages are
    recomputed, which Algorithm 3 does not see. On some chains (e.g. ``training_graph(8, seed=0)``:
    sqrt(L) peaks at 19 bytes for 76 s, the cheapest threshold plan within 19 bytes costs 81 s) the
    equal-count split beats every threshold plan at its own peak; adding it makes ``chen-greedy``
    never costlier than ``chen-sqrtn`` wherever both fit.
    """
    candidates = threshold_starts(view.chain())
    sqrtn = sqrtn_starts(view.length)
    if sqrtn not in candidates:
        candidates.append(sqrtn)
    return candidates


def solve_chen_greedy(graph, budget: int, time_limit: float | None = None) -> Schedule:
    """``chen-greedy``: Algorithm 3 of Chen et al. over a search of its threshold ``B``.

    The plans are :func:`greedy_candidate_starts` (every threshold of :func:`greedy_thresholds`,
    walked from the input and from the loss, and the sqrt(L) split) on each of the graph's
    :func:`~solvers.chain.chain_views`; they do not depend on the budget. Returns store-all when it
    fits (``optimal``), else the cheapest plan whose simulated peak fits (``heuristic``); raises
    :class:`Infeasible` with ``min_budget`` = the least simulated peak over the plans and store-all.
    ``time_limit`` is accepted and unused (the search is a fixed set of a few dozen plans).
    """

    def candidates(view: ChainView) -> list[Candidate]:
        base, stage_seconds = total_cost(graph), stage_forward_seconds(view)
        return [segment_candidate(view, starts, base, stage_seconds) for starts in greedy_candidate_starts(view)]

    return solve_by_plans(graph, budget, "chen-greedy", candidates)
