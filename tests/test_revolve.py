"""Tests of ``revolve`` (solvers/revolve.py): Griewank & Walther's t(l, s), the binomial sequence, and
the method on cost graphs (every returned schedule fits; every Infeasible's min_budget works)."""

from __future__ import annotations

import math

import pytest
from contract import check_candidate_bounds, check_method_at
from graphs import (
    budget_sweep,
    method_sweep_graphs,
    parameter_gradient_graph,
    training_graph,
    with_extras,
)

from solvers import Infeasible, simulate, solve
from solvers.chain import chain_view
from solvers.chainmodel import Op
from solvers.revolve import (
    extra_forwards,
    optimal_split,
    repetition_number,
    revolve_candidates,
    revolve_sequence,
    solve_revolve,
    split_summary,
)
from solvers.store_all import store_all_schedule

FORWARD = ("CF", "Fn", "Fe")


# -- t(l, s) --------------------------------------------------------------------------------------


def dp_table(max_steps: int, max_slots: int) -> list[list[float]]:
    """The DP form t(l, s) = min_{1<=j<l} j + t(j, s) + t(l-j, s-1), t(1, s) = 0, t(l>1, 0) = inf,
    filled bottom-up (row s needs rows s and s-1 only)."""
    inf = math.inf
    table = [[0.0 if l <= 1 else inf for l in range(max_steps + 1)] for _ in range(max_slots + 1)]
    for s in range(1, max_slots + 1):
        row, below = table[s], table[s - 1]
        for l in range(2, max_steps + 1):
            row[l] = min(j + row[j] + below[l - j] for j in range(1, l))
    return table


@pytest.fixture(scope="module")
def dp():
    return dp_table(200, 20)


def test_extra_forwards_equals_the_dp_form(dp):
    mismatches = [(l, s, extra_forwards(l, s), dp[s][l])
                  for s in range(1, 21) for l in range(1, 201) if extra_forwards(l, s) != dp[s][l]]
    assert mismatches == []


def test_extra_forwards_published_examples():
    assert extra_forwards(10, 2) == 20
    assert extra_forwards(20, 3) == 45
    assert extra_forwards(50, 5) == 122
    assert extra_forwards(60, 10) == 108


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 40, 300])
def test_extra_forwards_boundary_cases(steps):
    assert extra_forwards(steps, 1) == steps * (steps - 1) // 2  # everything again from x_0
    for slots in (max(1, steps - 1), steps, steps + 5):
        assert extra_forwards(steps, slots) == steps - 1  # one untaped pass storing every state
    for slots in (1, 2, 9):
        assert extra_forwards(1, slots) == 0
    assert extra_forwards(0, 3) == 0


def test_repetition_number_brackets_the_length():
    for s in range(1, 8):
        for l in range(2, 150):
            r = repetition_number(l, s)
            assert math.comb(s + r - 1, s) < l <= math.comb(s + r, s)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        extra_forwards(5, 0)
    with pytest.raises(ValueError):
        revolve_sequence(-1, 2)
    with pytest.raises(ValueError):
        solve_revolve(training_graph(4, unit=True), 3, slots=0)


def test_optimal_split_attains_the_dp_optimum(dp):
    for s in range(1, 15):
        for l in range(2, 201):
            j = optimal_split(l, s)
            assert 1 <= j < l
            assert j + dp[s][j] + dp[s - 1][l - j] == dp[s][l], (l, s, j)


# -- the binomial sequence -------------------------------------------------------------------------


def check_chain_sequence(sequence: list[Op], length: int) -> int:
    """Check a chain sequence's structure and return the most checkpoints it ever holds.

    Structure: one ``L``, the backward ops ``B_{L-1}..B_0`` in that order, each right after its taped
    ``Fe_i`` (``Fe_{L-1} L B_{L-1}`` for the last stage). Every forward op of stage i reads an
    instance of ``x_i`` (``x_0`` from the start, else the latest made by a forward op of stage i-1)
    that no ``Fn_i`` has freed. A checkpoint is an instance of some ``x_i`` held across an op: made
    before it and read after it. Counting those over the sequence gives the slots used
    (x_0's included; the working state, made and read on adjacent ops, is not a slot).
    """
    kinds = [op.kind for op in sequence]
    assert kinds.count("L") == 1
    backward = [op.stage for op in sequence if op.kind == "B"]
    assert backward == list(reversed(range(length)))
    for p, op in enumerate(sequence):
        if op.kind == "B":
            before = sequence[p - 2: p] if op.stage == length - 1 else sequence[p - 1: p]
            expected = [Op("Fe", op.stage), Op("L", length)] if op.stage == length - 1 else [Op("Fe", op.stage)]
            assert before == expected, (p, op)
    latest = {0: -1}  # x_i -> position of the op that made the live instance (-1: the input)
    freed: set[int] = set()
    reads: dict[tuple[int, int], list[int]] = {}
    for p, op in enumerate(sequence):
        if op.kind not in FORWARD:
            continue
        i = op.stage
        assert i in latest and (i, latest[i]) not in freed, f"op {p} ({op}) reads x_{i}, which is not held"
        reads.setdefault((i, latest[i]), []).append(p)
        if op.kind == "Fn":
            freed.add((i, latest[i]))
        latest[i + 1] = p
    live = [0] * len(sequence)
    for (_, made), positions in reads.items():
        for p in range(made + 1, max(positions)):
            live[p] += 1
    return max(live, default=0)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 8, 13, 21, 40, 60])
def test_revolve_sequence_has_l_plus_t_forward_ops_and_at_most_s_checkpoints(length):
    for slots in range(1, 12):
        sequence = revolve_sequence(length, slots)
        forward = sum(op.kind in FORWARD for op in sequence)
        taped = sum(op.kind == "Fe" for op in sequence)
        # L taped forwards (one right before each B_i) + t(L, s) untaped ones.
        assert taped == length
        assert forward == length + extra_forwards(length, slots)
        used = check_chain_sequence(sequence, length)
        assert used <= slots
        if slots <= length - 1:
            assert used == slots  # the binomial schedule uses every slot it is given


def test_revolve_sequence_small_cases_exactly():
    text = lambda seq: " ".join(map(str, seq))  # noqa: E731
    assert text(revolve_sequence(0, 1)) == "L"
    assert text(revolve_sequence(1, 1)) == "Fe_0 L B_0"
    assert text(revolve_sequence(3, 1)) == "CF_0 Fn_1 Fe_2 L B_2 CF_0 Fe_1 B_1 Fe_0 B_0"
    assert text(revolve_sequence(3, 2)) == "CF_0 CF_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0"
    # 2 slots, 4 steps: t(4, 2) = 4 (= 2*4 - C(4, 3)); x_1 is stored, then x_2 is reached again from x_1.
    assert text(revolve_sequence(4, 2)) == "CF_0 CF_1 Fn_2 Fe_3 L B_3 CF_1 Fe_2 B_2 Fe_1 B_1 Fe_0 B_0"


def test_revolve_sequence_scales():
    # A stack, not recursion: thousands of stages and slots.
    sequence = revolve_sequence(3000, 2999)
    assert sum(op.kind in FORWARD for op in sequence) == 2 * 3000 - 1
    assert sum(op.kind in FORWARD for op in revolve_sequence(400, 1)) == 400 + 400 * 399 // 2


@pytest.mark.parametrize("length,slots", [(1, 1), (6, 1), (10, 2), (17, 3), (33, 4), (40, 39)])
def test_split_summary_matches_the_sequence(length, slots):
    sequence = revolve_sequence(length, slots)
    summary = split_summary(length, slots)
    assert list(summary.runs) == [sum(1 for op in sequence if op.kind in FORWARD and op.stage == i)
                                  for i in range(length)]
    turn = sequence.index(Op("L", length))

    def first_after_turn(stages) -> int | None:
        return next((p for p in range(turn + 1, len(sequence))
                     if sequence[p].kind in FORWARD and sequence[p].stage in stages), None)

    # x_i (i > 0) is held across the loss when it was made before it and, after it, is read (a
    # stage i op) before it is made again (a stage i-1 op).
    held = {i for i in range(1, length)
            if any(op.kind in FORWARD and op.stage == i - 1 for op in sequence[:turn])
            and first_after_turn({i}) is not None and first_after_turn({i - 1, i}) == first_after_turn({i})}
    assert set(summary.held_at_loss) == held


# -- the method on cost graphs ---------------------------------------------------------------------


def sweep_graphs():
    yield from method_sweep_graphs()


@pytest.mark.parametrize("name,graph", list(sweep_graphs()))
def test_revolve_fits_or_reports_a_working_min_budget(name, graph):
    for budget in budget_sweep(graph):
        check_method_at(graph, budget, "revolve")


def test_revolve_on_a_unit_training_graph():
    graph = training_graph(8, unit=True)  # 17 nodes: forward 0..8 (8 = loss), gradients 9..16
    top = simulate(graph, store_all_schedule(graph)).peak_bytes
    assert top == 10
    with pytest.raises(Infeasible) as error:
        solve(graph, 2, method="revolve")
    # s = 1: x_0 costs nothing, so at the loss only x_7 (the working state), the loss and its
    # gradient are held: 3 bytes, the least of any schedule (Checkmate's L=8 graph: B=2 infeasible).
    assert error.value.min_budget == 3
    schedule = solve(graph, 3, method="revolve")
    outcome = simulate(graph, schedule)
    assert outcome.peak_bytes == 3
    assert outcome.compute_cost == 17 + extra_forwards(8, 1)  # every stage costs 1 s
    assert schedule.info.status == "heuristic"
    # More memory buys slots: each step of budget above 3 holds one more checkpoint.
    for budget in range(4, 10):
        outcome = simulate(graph, solve(graph, budget, method="revolve"))
        assert outcome.peak_bytes <= budget
        assert outcome.compute_cost == 17 + extra_forwards(8, budget - 2)
    assert solve(graph, top, method="revolve").info.status == "optimal"  # store-all fits


def test_revolve_fixed_slots_option():
    graph = training_graph(12, unit=True)
    schedule = solve_revolve(graph, 100 // 10, slots=3)
    assert simulate(graph, schedule).compute_cost == 25 + extra_forwards(12, 3)
    with pytest.raises(Infeasible) as error:
        solve_revolve(graph, 4, slots=3)
    assert error.value.min_budget == 5  # two real checkpoints + working state, loss, gradient


def test_candidate_costs_and_bounds_are_exact_or_sound():
    for graph in (training_graph(14, seed=3, skips=3), parameter_gradient_graph(7, seed=1),
                  with_extras(training_graph(11, seed=2, skips=2), seed=2)):
        view = chain_view(graph)
        for item in revolve_candidates(view):
            check_candidate_bounds(graph, view, item)


def test_revolve_costs_fall_as_the_budget_grows():
    graph = training_graph(20, seed=5)
    costs = []
    top = simulate(graph, store_all_schedule(graph)).peak_bytes
    try:
        solve(graph, 0, method="revolve")
    except Infeasible as error:
        low = error.min_budget
    for budget in range(low, top + 1, max(1, (top - low) // 8)):
        costs.append(simulate(graph, solve(graph, budget, method="revolve")).compute_cost)
    assert costs == sorted(costs, reverse=True)
    assert costs[0] > costs[-1]
