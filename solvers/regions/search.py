"""The heuristic region search: the fewest recomputations whose predicted peak fits a budget,
by dropping and splitting regions from whole-depth starts and then choosing save policies. The exact
method (solvers/native/) takes its plan as its first incumbent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import networkx as nx

from ..errors import Infeasible
from .candidates import by_depth, candidate_regions, children_of, segmentations
from .names import parse_segment
from .policies import SAVE_POLICIES, split_policy
from .prediction import RegionPlan, evaluate
from .region_model import RegionModel

METHOD = "regions"


def plan_regions(graph: nx.DiGraph, budget_bytes: int, candidates: Sequence[str] | None = None,
                 sequentials: dict[str, int] | None = None, time_limit: float | None = None,
                 policies: Sequence[str] = tuple(SAVE_POLICIES)) -> RegionPlan:
    """The checkpoint regions with the least recomputation that the search finds within
    ``budget_bytes`` (the schedule's peak, ``fixed_bytes`` excluded, as for :func:`solvers.solve`).

    ``candidates`` are module regions (default :func:`candidate_regions`); ``sequentials`` names the
    ``nn.Sequential`` containers whose children may also be checkpointed in runs (:func:`segmentations`).

    A heuristic, not an optimum: start from each of these checkpointed: every module candidate at one
    depth, every segmentation of a Sequential; then, latest region
    first (the backward reaches it first, when least is held behind it), drop a region when the rest
    still fits, or else replace it by the modules directly inside it and drop as many of those as
    fit. Latest first because a region kept whole holds its activations through the recomputation
    of every earlier region. Last, latest first again, each region takes the save policy of
    ``policies`` (:data:`SAVE_POLICIES`, by name) that makes the predicted step cheapest where the
    peak still fits, and none when none makes it strictly cheaper. The cheapest plan over all starts
    wins. Raises :class:`Infeasible` with the least peak seen when nothing fits.
    """
    started = time.perf_counter()
    if candidates is None:
        candidates = candidate_regions(graph)
    starts = by_depth(list(candidates)) + segmentations(graph, sequentials or {})
    candidates = list(candidates) + [r for start in starts for r in start if parse_segment(r) is not None]
    candidates += [f"{r}@{policy}" for policy in (policies or ()) for r in candidates]
    model = RegionModel(graph)
    cache: dict[frozenset, tuple[int, float]] = {}

    def run(regions) -> tuple[int, float]:
        key = frozenset(regions)
        if key not in cache:
            cache[key] = model.peak_and_cost([c for c in candidates if c in key])
        return cache[key]

    def fits(regions) -> bool:
        return run(regions)[0] <= budget_bytes

    def out_of_time() -> bool:
        return time_limit is not None and time.perf_counter() - started > time_limit

    if fits(()):
        return evaluate(graph, ())
    base_cost = run(())[1]
    best: list[str] | None = None
    least = run(())[0]
    # Each start also with every region under each policy: at a tight budget every block under a
    # policy that recomputes the attention's products can hold less, and cost less, than some blocks
    # checkpointed whole and the others not at all (the benchmark GPT-2 with eager attention: all six
    # blocks "@projections" at 42.2% of the un-checkpointed activations for +21.8% of its step; the
    # plain starts gave +25.0% at 50%), a plan that dropping plain regions, then adding policies, misses.
    starts += [[f"{r}@{policy}" for r in start] for policy in (policies or ()) for start in starts]
    for chosen in starts:
        least = min(least, run(chosen)[0])
        if not fits(chosen):
            chosen = _tighten(chosen, policies or (), run, budget_bytes) if _saves_draws(chosen) else None
            if chosen is None:
                continue
        relaxed = _relax(chosen, candidates, fits, out_of_time)
        relaxed = _with_policies(relaxed, policies or (), run, budget_bytes)
        if best is None or _better(run(relaxed)[1], relaxed, run(best)[1], best, base_cost * TIE):
            best = relaxed
        if out_of_time():
            break
    if best is None:
        raise Infeasible(
            f"no set of checkpointed modules fits {budget_bytes} bytes of activations; the least found holds "
            f"{least}", min_budget=least, method=METHOD)
    return evaluate(graph, [c for c in candidates if c in set(best)])


# Plans whose predicted steps differ by at most this fraction of the un-checkpointed step are taken
# as equal and the fewer regions win (then the names): measured op times vary with the machine's
# load, and the same model planned twice should get the same plan. A threshold on the difference,
# not rounding to buckets of this width: two costs a hair apart on either side of a bucket's edge
# were "different" (a 12-layer GPT-2 at 60% got 8 regions from one profile, 16 from the next). 2%,
# not 1%: with 1% three profiles of that model on a loaded machine still gave two plans at 60% and
# 75% (whole blocks, or their attention and MLP apart: near-equal costs); with 2%, one plan at each
# of 45%, 60% and 75% (benchmarks/plan_stability.py). The price: a plan up to 2% of a step slower.
TIE = 0.02


def _better(cost: float, regions: Sequence[str], incumbent_cost: float, incumbent: Sequence[str],
            tolerance: float) -> bool:
    """Whether ``regions`` (predicted step ``cost``, seconds) should replace ``incumbent``: cheaper by
    more than ``tolerance`` seconds, or as cheap within it and simpler (fewer regions, then names)."""
    if abs(cost - incumbent_cost) > tolerance:
        return cost < incumbent_cost
    return (len(regions), sorted(regions)) < (len(incumbent), sorted(incumbent))


def _with_policies(chosen: list[str], policies: Sequence[str], run, budget_bytes: int) -> list[str]:
    """Latest region first: the region plain or under one of ``policies``, whichever makes the plan
    cheapest within ``budget_bytes`` (``run`` gives a region set's predicted peak and seconds); the
    region as it is unless another is strictly cheaper. Strictly: a policy that saves nothing in a
    region (an LSTM stage, one oneDNN op) predicts the same step as the plain checkpoint, yet its
    selective-checkpoint mode costs time at run time (the LSTM model's three stages at 50%: the same
    peak, and 2.12x eager's step with ``@matmuls``, 1.55x plain: docs/native.md)."""
    current = list(chosen)
    for region in reversed(list(chosen)):
        base, _ = split_policy(region)
        best, best_cost = current, run(current)[1]
        for option in [base, *(f"{base}@{policy}" for policy in policies)]:
            replaced = [option if r == region else r for r in current]
            peak, cost = run(replaced)
            if peak <= budget_bytes and cost < best_cost:
                best, best_cost = replaced, cost
        current = best
    return current


def _saves_draws(regions: Sequence[str]) -> bool:
    """Whether any of ``regions`` is under a policy that saves the random draws."""
    return any(policy is not None and SAVE_POLICIES[policy].draws for policy in (split_policy(r)[1] for r in regions))


def _tighten(chosen: list[str], policies: Sequence[str], run, budget_bytes: int) -> list[str] | None:
    """``chosen`` made to fit ``budget_bytes``, or None: each region's other options (another policy,
    or none) priced once against ``chosen`` (predicted peak freed, step added), then applied in order
    of seconds added per byte freed, at most one per region, until the peak fits. A start with every
    block under a policy that saves the random draws holds a little more than the budget at the peak
    of every block under "matmuls" (the benchmark GPT-2: 252.0 MiB against 246.0, for +5.6% of the
    step against +20.6%): a few blocks under a tighter policy make it fit, where dropping regions
    (:func:`_relax`) only adds bytes. Priced once, not greedily re-priced after each change: the
    greedy search took 20-49 s on the 6-layer GPT-2 and BERT (loaded machine)."""
    if run([split_policy(r)[0] for r in chosen])[0] > budget_bytes:
        return None  # a region holds the least with no policy: then no mix of policies fits either
    peak, cost = run(chosen)
    changes: list[tuple[float, int, str]] = []
    for position, region in enumerate(chosen):
        base, _ = split_policy(region)
        for option in [base, *(f"{base}@{policy}" for policy in policies)]:
            if option == region:
                continue
            trial_peak, trial_cost = run(chosen[:position] + [option] + chosen[position + 1:])
            if trial_peak < peak:
                changes.append(((trial_cost - cost) / (peak - trial_peak), position, option))
    current = list(chosen)
    changed: set[int] = set()
    for _, position, option in sorted(changes):
        if position in changed:
            continue
        trial = current[:position] + [option] + current[position + 1:]
        if run(trial)[0] < run(current)[0]:
            current = trial
            changed.add(position)
            if run(current)[0] <= budget_bytes:
                return current
    return None


def _relax(chosen: list[str], candidates: Sequence[str], fits, out_of_time) -> list[str]:
    """Latest region first: drop it if the rest fits, else try its children in its place."""
    current = list(chosen)
    for region in reversed(list(chosen)):
        if out_of_time():
            break
        without = [r for r in current if r != region]
        if fits(without):
            current = without
            continue
        children = children_of(region, candidates)
        if not children:
            continue
        replaced = without + children
        if not fits(replaced):
            continue
        current = _relax_children(replaced, children, fits)
    return current


def _relax_children(current: list[str], children: list[str], fits) -> list[str]:
    for child in reversed(children):
        without = [r for r in current if r != child]
        if fits(without):
            current = without
    return current

