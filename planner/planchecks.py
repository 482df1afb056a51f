"""A loaded plan's figures, checked against what its own schedule or regions say (issue 30).

A plan file carries its figures (peak, times, budget) beside the graph and schedule they were
computed from; ``show`` prints them and a user decides on them. Loading recomputes every figure that
can be recomputed (the predicted peak and time: ``solvers.simulate`` of the plan's schedule on its
graph, which for a native plan is the region graph and schedule of solvers/regions/prediction.py; the
un-checkpointed time; what is held besides the schedule) and checks the rest for consistency: a measured figure
cannot be recomputed, but a measured peak over the budget, or one absurdly far from the prediction,
is not a measurement this tool wrote. Each function returns what is wrong, in words, or None;
planner/planfile.py and planner/native_plan.py raise it as a ``PlanFileError``.
"""

from __future__ import annotations

import json
import math

import networkx as nx

from solvers import total_cost
from solvers.regions import RECOMPUTE, parse_segment, split_policy, within

from .budget import BudgetError, format_bytes, parse_budget

# Relative tolerance on recomputed times (seconds): JSON keeps a float's every digit, so only the
# summation order differs.
SECONDS_TOLERANCE = 1e-6
# A traced plan's un-checkpointed time against its graph's total, when the plan is on a finer
# grouping than the one that time was summed on (traced_figures_problem): a view op is copied into
# every group that reads it, and more groups read it on a finer grouping (GPT-2 tiny's op grouping
# summed 5-7% above its module grouping, which failed a 5% slack now and then).
GROUPING_SLACK = 0.10
# A native plan's prediction may sit this far above its budget when its measurement decided
# (planner/native_repair.py, NEAR_MISS; the "100%" plan of a measured eager step): beyond it, edited.
NEAR_MISS = 0.02
# A measured peak this many times above or below the prediction is not one this tool measured (the
# prediction is within a few percent of eager on CPU, docs/native.md; CUDA's allocator adds ~2%).
MEASURED_PEAK_FACTOR = 2.0
# Likewise a measured step time, but times vary with the machine's load far more than peaks (a
# 1.4 ms predicted step measured 37.6 ms on a loaded 2-core machine, 26x; planner/native_measure.py warns
# past 20%): only an absurd ratio is refused.
MEASURED_SECONDS_FACTOR = 1000.0
# Bytes of one saved CPU generator state (a Mersenne Twister; profiler/state.py): what a native
# plan's checkpoints add to the held bytes, per region and one more (planner/native_solve.py, rng_bytes).
CPU_RNG_STATE_BYTES = 5056
# The graph attribute naming the regions a native plan's region graph models (a JSON list; absent
# from plans made before it was recorded): a region edited by hand (another module, another save
# policy) no longer matches it, though its recomputed ops could.
MODELLED_REGIONS = "regions"


def overlapping_regions(regions) -> str | None:
    """Why ``regions`` (a native plan's, ``"layers.3@matmuls"``, ``"layers[2:5]"``) cannot all be
    checkpoint regions at once, or None: an unknown save policy, the model itself, an empty
    segment, or two regions that are the same module or one inside the other. Regions do not nest
    today (solvers/regions/ checks the same when it builds a region graph); were nesting planned,
    this is the one function to change."""
    members: list[tuple[str, list[str]]] = []  # a list: a region given twice is a duplicate, not one entry
    for region in regions:
        try:
            base, _ = split_policy(region)
        except ValueError as error:
            return str(error)
        segment = parse_segment(base)
        if segment is None:
            if not base:
                return "region '' is the model itself, which is never a checkpoint region"
            members.append((region, [base]))
            continue
        path, start, stop = segment
        if start >= stop:
            return f"region {region!r} is an empty run of children"
        members.append((region, [f"{path}.{i}" if path else str(i) for i in range(start, stop)]))
    for i, (first, inside_first) in enumerate(members):
        for second, inside_second in members[i + 1:]:
            if any(within(m, second) for m in inside_first) or any(within(m, first) for m in inside_second):
                return (f"regions {first!r} and {second!r} overlap (the same module, or one inside the other): "
                        "checkpoint regions do not nest")
    return None


def _close(value: float, expected: float) -> bool:
    return abs(value - expected) <= SECONDS_TOLERANCE * max(abs(expected), 1e-9)


def _common_problem(plan, outcome, floor_bytes: int = 0) -> str | None:
    """What every predicted plan owes: its peak and time are its schedule's, and a percentage budget
    is that percentage of its un-checkpointed peak. ``floor_bytes``: a peak outside the schedule that
    the plan's peak is at least (an optimizer's step, planner/optimizer.py)."""
    recomputed = max(plan.fixed_bytes + outcome.peak_bytes, floor_bytes)
    if plan.predicted_peak_bytes != recomputed:
        return (f"its predicted peak {format_bytes(plan.predicted_peak_bytes)} ({plan.predicted_peak_bytes} bytes) is "
                f"not what its own schedule simulates to: {format_bytes(recomputed)} ({recomputed} bytes, "
                f"{plan.fixed_bytes} held besides the schedule)")
    if not _close(plan.predicted_seconds, outcome.compute_cost):
        return (f"its predicted time {plan.predicted_seconds * 1000:.3f} ms is not what its own schedule costs: "
                f"{outcome.compute_cost * 1000:.3f} ms")
    try:
        budget = parse_budget(plan.budget_text)
    except BudgetError:
        budget = None  # a --max-batch plan's "60% of batch 8's peak", or a file's own words
    if budget is not None and budget.percent is not None:
        expected = budget.resolve(plan.unplanned_peak_bytes)
        if plan.budget_bytes != expected:
            return (f"its budget {plan.budget_text} is {format_bytes(expected)} of its un-checkpointed peak "
                    f"{format_bytes(plan.unplanned_peak_bytes)}, not the {plan.budget_bytes} bytes it says")
    return None


def traced_figures_problem(plan, outcome) -> str | None:
    """A traced plan's figures against its schedule's simulation ``outcome`` on its graph."""
    from .footprint import held_besides_schedule  # reads the generator state size through torch

    graph: nx.DiGraph = plan.graph
    try:
        held = held_besides_schedule(graph)
    except (RuntimeError, AssertionError):  # a CUDA plan read where CUDA is not: its states unknown here
        held = None
    if held is not None and plan.fixed_bytes != held:
        return (f"it says the step holds {plan.fixed_bytes} bytes besides its schedule, its graph says {held} "
                "(parameters, buffers, inputs, saved RNG states, the loss value)")
    problem = _common_problem(plan, outcome)
    if problem:
        return problem
    if plan.predicted_peak_bytes > plan.budget_bytes:
        return (f"its predicted peak {format_bytes(plan.predicted_peak_bytes)} is over its budget "
                f"{format_bytes(plan.budget_bytes)}: a traced plan is solved within its budget")
    if plan.unplanned_peak_bytes < plan.predicted_peak_bytes:
        return (f"its un-checkpointed peak {format_bytes(plan.unplanned_peak_bytes)} is below its predicted peak "
                f"{format_bytes(plan.predicted_peak_bytes)}: a plan recomputes only when storing everything does "
                "not fit")
    everything = total_cost(graph)
    from profiler.costgraph import LOG_PROBS_RECOMPUTED

    # The un-checkpointed time is the profiler's grouping's; a plan on a finer grouping sums the same
    # measurements otherwise (GPT-2 tiny at op level: 2224.094 ms against 2222.889 ms), and on the trace
    # that recomputes the loss's log-probabilities the graph costs one op more (planner/api.py, _solve).
    extra_op = max((float(d["cost"]) for _, d in graph.nodes(data=True)), default=0.0) \
        if graph.graph.get(LOG_PROBS_RECOMPUTED) else 0.0
    fits = everything * (1 - GROUPING_SLACK) - extra_op <= plan.unplanned_seconds <= everything * (1 + GROUPING_SLACK)
    if not fits:
        return (f"its un-checkpointed time {plan.unplanned_seconds * 1000:.3f} ms is not its graph's: every node "
                f"once takes {everything * 1000:.3f} ms (within {GROUPING_SLACK:.0%})")
    return None


def native_figures_problem(plan, outcome) -> str | None:
    """A native plan's figures against its region schedule's simulation ``outcome`` on its region
    graph (solvers/regions/names.py: one ``recompute:`` twin per recomputed op), and its measured
    figures for consistency."""
    graph: nx.DiGraph = plan.graph
    problem = overlapping_regions(plan.regions) or _twins_problem(graph, plan.regions)
    if problem:
        return problem
    base = int(graph.graph.get("fixed_bytes", 0)) + int(graph.graph.get("loss_value_bytes", 0))
    # The generator states the checkpoints save (an optimizer's state is held besides them too).
    states = plan.fixed_bytes - base - plan.wrapper_bytes - plan.optimizer_state_bytes
    expected_cpu = (len(plan.regions) + 1) * CPU_RNG_STATE_BYTES if plan.regions else 0
    on_cpu = not str(plan.device).startswith("cuda")
    if (on_cpu and states != expected_cpu) or states < expected_cpu \
            or (plan.regions and states % (len(plan.regions) + 1)) or (not plan.regions and states):
        return (f"it says the step holds {plan.fixed_bytes} bytes besides its schedule; its graph and "
                f"{len(plan.regions)} region(s) say {base + plan.wrapper_bytes + plan.optimizer_state_bytes + expected_cpu}"
                + ("" if on_cpu else " and the CUDA generators' states"))
    problem = _common_problem(plan, outcome, plan.optimizer_step_peak_bytes)
    if problem:
        return problem
    # Every op once, without what the checkpoints themselves cost (put on each region's entry op).
    ops_once = sum(float(d["cost"]) - float(d.get("checkpoint_overhead", 0.0))
                   for _, d in graph.nodes(data=True) if d.get("kind") != RECOMPUTE)
    if not _close(plan.unplanned_seconds, ops_once):
        return (f"its un-checkpointed time {plan.unplanned_seconds * 1000:.3f} ms is not its graph's: every op "
                f"once takes {ops_once * 1000:.3f} ms")
    if plan.predicted_peak_bytes > plan.unplanned_peak_bytes * (1 + NEAR_MISS) + CPU_RNG_STATE_BYTES:
        return (f"its un-checkpointed peak {format_bytes(plan.unplanned_peak_bytes)} is below its predicted peak "
                f"{format_bytes(plan.predicted_peak_bytes)}")
    return _measured_problem(plan)


def _measured_problem(plan) -> str | None:
    measured, predicted, budget = plan.measured_peak_bytes, plan.predicted_peak_bytes, plan.budget_bytes
    if measured is None:
        if predicted > budget * (1 + NEAR_MISS):
            return f"its predicted peak {format_bytes(predicted)} is over its budget {format_bytes(budget)}"
    else:
        if measured > budget:
            return (f"its measured peak {format_bytes(measured)} is over its budget {format_bytes(budget)}: a native "
                    "plan is returned only when its measured step fits")
        if not predicted / MEASURED_PEAK_FACTOR <= measured <= predicted * MEASURED_PEAK_FACTOR:
            return (f"its measured peak {format_bytes(measured)} is too far from its predicted peak "
                    f"{format_bytes(predicted)} to be a measurement of this plan")
        if predicted > budget * (1 + NEAR_MISS):
            return f"its predicted peak {format_bytes(predicted)} is over its budget {format_bytes(budget)}"
    seconds = plan.measured_seconds
    if seconds is not None:
        if not (math.isfinite(seconds) and seconds > 0):
            return f"its measured step time {seconds!r} s is not a measured time"
        if plan.predicted_seconds > 0 and not (plan.predicted_seconds / MEASURED_SECONDS_FACTOR <= seconds
                                               <= plan.predicted_seconds * MEASURED_SECONDS_FACTOR):
            return (f"its measured step time {seconds * 1000:.3f} ms is too far from its predicted "
                    f"{plan.predicted_seconds * 1000:.3f} ms to be a measurement of this plan")
    return None


def _twins_problem(graph: nx.DiGraph, regions) -> str | None:
    """Every recomputed op (a ``recompute:`` twin) belongs to exactly one region, and every region is
    a module the trace ran: a region renamed, dropped or added by hand no longer matches the graph."""
    modelled = graph.graph.get(MODELLED_REGIONS)
    if modelled is not None and modelled != json.dumps(list(regions)):
        return f"its regions {list(regions)} are not the ones its graph models: {modelled[:200]}"
    modules = {str(d.get("module", "")) for _, d in graph.nodes(data=True) if d.get("kind") == "forward"}
    for region in regions:
        if not any(within(module, region) for module in modules):
            return f"region {region!r} is not a module its graph's forward runs"
    for node, data in graph.nodes(data=True):
        if data.get("kind") != RECOMPUTE:
            continue
        module = str(data.get("module", ""))
        owners = [r for r in regions if within(module, r)]
        if len(owners) != 1:
            return (f"its graph recomputes {str(node)[:60]!r} of module {module!r}, which "
                    + ("no region holds" if not owners else f"regions {owners[:2]} both hold"))
    return None
