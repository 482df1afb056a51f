"""Tests of ``chen-sqrtn`` and ``chen-greedy`` (solvers/chen.py): the segment sequence, the sqrt(L)
split, Algorithm 3's threshold walk, and both methods on cost graphs.

The budget-sweep helpers here (:func:`with_extras`, :func:`budget_sweep`, :func:`check_method_at`)
are shared with tests/test_revolve.py.
"""

from __future__ import annotations

import math

import pytest
from contract import check_candidate_bounds, check_method_at
from graphs import (
    budget_sweep,
    chain,
    method_sweep_graphs,
    parameter_gradient_graph,
    random_dag,
    store_all_peak,
    training_graph,
    with_extras,
)

from solvers import Infeasible, simulate, solve, total_cost
from solvers.chain import chain_view
from solvers.chainmodel import Op
from solvers.chen import (
    greedy_candidate_starts,
    greedy_starts,
    greedy_thresholds,
    segment_candidate,
    segment_sequence,
    sqrt_xy_threshold,
    sqrtn_starts,
    stage_forward_seconds,
    threshold_starts,
)


def min_budget(graph, method: str) -> int:
    with pytest.raises(Infeasible) as error:
        solve(graph, 0, method=method)
    return error.value.min_budget


# -- the segment sequence ------------------------------------------------------------------------


def text(sequence) -> str:
    return " ".join(map(str, sequence))


def test_segment_sequence_is_checkpoint_sequentials_schedule():
    assert text(segment_sequence(5, [0, 2])) == "CF_0 Fn_1 Fe_2 Fe_3 Fe_4 L B_4 B_3 B_2 Fe_0 Fe_1 B_1 B_0"
    assert text(segment_sequence(4, [0, 1, 3])) == "CF_0 CF_1 Fn_2 Fe_3 L B_3 Fe_1 Fe_2 B_2 B_1 Fe_0 B_0"
    assert text(segment_sequence(3, [0])) == "Fe_0 Fe_1 Fe_2 L B_2 B_1 B_0"  # one segment: nothing recomputed
    assert text(segment_sequence(0, [])) == "L"


@pytest.mark.parametrize("starts", [[], [1], [0, 0, 2], [0, 3, 2], [0, 5]])
def test_segment_sequence_rejects_bad_starts(starts):
    with pytest.raises(ValueError):
        segment_sequence(5, starts)


def test_segment_sequence_forward_count():
    # Every stage outside the last segment runs twice.
    for length in range(1, 30):
        for starts in ([0], sqrtn_starts(length), list(range(length))):
            sequence = segment_sequence(length, starts)
            forward = sum(op.kind in ("CF", "Fn", "Fe") for op in sequence)
            assert forward == length + starts[-1]
            assert [op.stage for op in sequence if op.kind == "B"] == list(reversed(range(length)))


# -- chen-sqrtn ------------------------------------------------------------------------------------


def test_sqrtn_starts():
    assert sqrtn_starts(16) == [0, 4, 8, 12]
    assert sqrtn_starts(10) == [0, 2, 4, 7]  # 4 segments 2, 2, 3, 3: the longer ones last
    assert sqrtn_starts(1) == [0]
    assert sqrtn_starts(2) == [0, 1]
    assert sqrtn_starts(0) == []
    for length in range(1, 300):
        starts = sqrtn_starts(length)
        sizes = [b - a for a, b in zip(starts, [*starts[1:], length])]
        assert len(starts) == math.ceil(math.sqrt(length))
        assert sizes == sorted(sizes) and sizes[-1] - sizes[0] <= 1 and sum(sizes) == length


def test_chen_sqrtn_on_a_unit_training_graph():
    """L = 16 unit stages, k = 4 segments. At the loss the schedule holds the checkpoints x_4 and
    x_8 (x_12 is read only by the first pass of the last segment), the last segment's 4 results,
    the loss and its gradient: 8 = 2 sqrt(16) bytes, against 18 for store-all. The three recomputed
    segments cost 12 stage forwards: 45 s against 33 s, an overhead of 12/33 < one forward (16/33)."""
    graph = training_graph(16, unit=True)
    assert store_all_peak(graph) == 18
    assert min_budget(graph, "chen-sqrtn") == 8
    schedule = solve(graph, 8, method="chen-sqrtn")
    outcome = simulate(graph, schedule)
    assert outcome.peak_bytes == 8 == 2 * math.isqrt(16)
    assert outcome.compute_cost == 33 + 12
    assert outcome.overhead == pytest.approx(12 / 33)
    assert schedule.info.status == "heuristic"
    assert "[0, 4, 8, 12]" in schedule.info.message
    # No knob: any budget between gives the same plan; store-all from its peak on.
    assert simulate(graph, solve(graph, 17, method="chen-sqrtn")).compute_cost == 45
    assert solve(graph, 18, method="chen-sqrtn").info.status == "optimal"


def test_chen_sqrtn_peak_grows_like_sqrt_l():
    peaks = {}
    for layers in (16, 64, 144):
        graph = training_graph(layers, unit=True)
        peaks[layers] = min_budget(graph, "chen-sqrtn")
        outcome = simulate(graph, solve(graph, peaks[layers], method="chen-sqrtn"))
        assert outcome.overhead < layers / (2 * layers + 1)  # less than one extra forward pass
    assert peaks == {16: 8, 64: 16, 144: 24}  # 2 sqrt(L)


# -- chen-greedy -----------------------------------------------------------------------------------


def test_greedy_starts_walks_from_either_end():
    sizes = [1] * 10
    assert greedy_starts(sizes, 2) == [0, 3, 6, 9]  # Algorithm 3: new segment once temp > B
    assert greedy_starts(sizes, 2, from_loss=True) == [0, 1, 4, 7]  # the remainder goes first
    assert greedy_starts(sizes, 0) == list(range(10))
    assert greedy_starts(sizes, math.inf) == [0]
    assert greedy_starts([5, 1, 1, 5, 1], 4) == [0, 1, 4]
    assert greedy_starts([], 3) == []


def test_sqrt_xy_threshold_and_grid():
    # B = 0 keeps every boundary: x = 15 checkpoints of 1 byte, y = the largest segment, 1 byte.
    assert sqrt_xy_threshold([1] * 16, [0] + [1] * 16) == pytest.approx(math.sqrt(15))
    grid = greedy_thresholds([1] * 16, [0] + [1] * 16)
    b = math.sqrt(15)
    assert 0.0 in grid and math.inf in grid
    assert min(grid[1:-1]) <= b / math.sqrt(2) + 1e-9 and any(abs(t - b * math.sqrt(2)) < 1e-9 for t in grid)
    assert max(t for t in grid if t < math.inf) >= 16  # up to the whole chain


def test_chen_greedy_on_a_unit_training_graph():
    graph = training_graph(16, unit=True)
    assert min_budget(graph, "chen-greedy") == 8
    # At 10 bytes the threshold search finds a plan with fewer recomputed stages than sqrt(L).
    outcome = simulate(graph, solve(graph, 10, method="chen-greedy"))
    assert outcome.peak_bytes <= 10
    assert outcome.compute_cost == 41  # 8 stages recomputed, against sqrt(L)'s 12


def greedy_vs_sqrtn_graphs():
    for seed in range(4):
        yield f"training{seed}", training_graph(10 + 5 * seed, seed=seed, skips=seed)
        yield f"params{seed}", parameter_gradient_graph(6 + 3 * seed, seed=seed)
        yield f"chain{seed}", chain(12 + 4 * seed, seed=seed)
        yield f"unit{seed}", training_graph(10 + 7 * seed, unit=True)
    yield "regression", training_graph(8, seed=0)
    yield "no-threshold-plan-fits", training_graph(48, seed=40)


@pytest.mark.parametrize("name,graph", list(greedy_vs_sqrtn_graphs()))
def test_chen_greedy_never_costlier_than_sqrtn(name, graph):
    low = min_budget(graph, "chen-sqrtn")
    top = store_all_peak(graph)
    for budget in sorted({low, (low + top) // 2, top - 1}):
        if budget < low:
            continue
        sqrtn = simulate(graph, solve(graph, budget, method="chen-sqrtn"))
        greedy = simulate(graph, solve(graph, budget, method="chen-greedy"))
        assert greedy.compute_cost <= sqrtn.compute_cost + 1e-9, (name, budget)


def test_why_greedy_also_tries_the_sqrtn_split():
    """One threshold over bytes gives segments of equal bytes; on this chain every such plan that
    fits the sqrt(L) plan's peak is costlier than it. chen-greedy therefore adds the sqrt(L) split
    to its candidates (greedy_candidate_starts)."""
    graph = training_graph(10, seed=14)  # a plain chain of 10 stages, one node each
    view = chain_view(graph)
    base, seconds = total_cost(graph), stage_forward_seconds(view)
    sqrtn = sqrtn_starts(view.length)
    assert sqrtn == [0, 2, 4, 7]
    sqrtn_outcome = simulate(graph, view.lower(segment_sequence(view.length, sqrtn)))
    assert (sqrtn_outcome.peak_bytes, sqrtn_outcome.compute_cost) == (18, 84)
    fitting = []
    for starts in threshold_starts(view.chain()):
        assert starts != sqrtn
        outcome = simulate(graph, view.lower(segment_sequence(view.length, starts)))
        assert segment_candidate(view, starts, base, seconds).cost() == pytest.approx(outcome.compute_cost)
        if outcome.peak_bytes <= sqrtn_outcome.peak_bytes:
            fitting.append(outcome.compute_cost)
    assert min(fitting) == 87 > sqrtn_outcome.compute_cost
    assert sqrtn in greedy_candidate_starts(view)
    assert simulate(graph, solve(graph, 18, method="chen-greedy")).compute_cost == 84


def test_candidate_costs_and_bounds_are_exact_or_sound():
    for graph in (training_graph(20, seed=3, skips=3), parameter_gradient_graph(9, seed=1),
                  with_extras(training_graph(15, seed=2, skips=2), seed=2), random_dag(14, seed=4)):
        view = chain_view(graph)
        base, seconds = total_cost(graph), stage_forward_seconds(view)
        for starts in greedy_candidate_starts(view):
            check_candidate_bounds(graph, view, segment_candidate(view, starts, base, seconds))


# -- both methods on cost graphs -------------------------------------------------------------------


def sweep_graphs():
    yield from method_sweep_graphs()
    yield "extras-params", with_extras(parameter_gradient_graph(7, seed=5), seed=5)
    yield "extras-dag", with_extras(random_dag(12, seed=7), seed=7)


@pytest.mark.parametrize("method", ["chen-sqrtn", "chen-greedy"])
@pytest.mark.parametrize("name,graph", list(sweep_graphs()))
def test_fits_or_reports_a_working_min_budget(name, graph, method):
    for budget in budget_sweep(graph):
        check_method_at(graph, budget, method)


def test_chen_sqrtn_min_budget_is_its_plan_peak():
    graph = training_graph(25, seed=4, skips=2)
    view = chain_view(graph)
    plan = simulate(graph, view.lower(segment_sequence(view.length, sqrtn_starts(view.length))))
    assert min_budget(graph, "chen-sqrtn") == min(plan.peak_bytes, store_all_peak(graph))


@pytest.mark.parametrize("method", ["chen-sqrtn", "chen-greedy", "revolve"])
def test_byte_sized_budgets_scale(method):
    """Real budgets are ~1e9 bytes: scaling every size by 2**27 scales the peaks and keeps the plans."""
    small = with_extras(training_graph(18, seed=6, skips=2), seed=6)
    big = small.copy()
    scale = 2 ** 27
    for node in big.nodes:
        big.nodes[node]["mem"] *= scale
        if "workspace" in big.nodes[node]:
            big.nodes[node]["workspace"] *= scale
    low = min_budget(small, method)
    assert min_budget(big, method) == low * scale
    for budget in (low, (low + store_all_peak(small)) // 2):
        a = simulate(small, solve(small, budget, method=method))
        b = simulate(big, solve(big, budget * scale, method=method))
        assert b.peak_bytes == a.peak_bytes * scale
        assert b.compute_cost == a.compute_cost


def test_chain_methods_plan_the_chain_views_stages():
    graph = training_graph(30, seed=1, skips=5)
    view = chain_view(graph)
    starts = sqrtn_starts(view.length)
    schedule = solve(graph, min_budget(graph, "chen-sqrtn"), method="chen-sqrtn")
    assert schedule.computes() == view.computes(segment_sequence(view.length, starts))
    assert all(isinstance(op, Op) for op in segment_sequence(view.length, starts))
