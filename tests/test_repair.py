"""planner/repair.py: the one measure-and-repair loop the native, traced and compiled planners share,
driven by stand-in solvers and measurements (bytes), each stopping rule on its own."""

from __future__ import annotations

import pytest

from planner.repair import Attempt, lower_by_excess, lower_by_miss_and_excess, measure_and_repair
from solvers import Infeasible


def _solver(asked: list[int], refuse_below: int | None = None):
    """A solve that records each target and returns it as the plan (a plan's prediction is its target)."""

    def solve(target: int) -> int:
        asked.append(target)
        if refuse_below is not None and target < refuse_below:
            raise Infeasible(f"nothing below {refuse_below}", min_budget=refuse_below)
        return target

    return solve


def test_a_plan_measured_within_the_budget_ends_the_loop_after_one_solve():
    asked = []
    repair = measure_and_repair(_solver(asked), lambda plan: plan - 10, 1_000, lower_by_excess, max_attempts=4)
    assert asked == [1_000]
    assert repair.fitting == Attempt(1_000, 1_000, 990) and repair.refusal is None


def test_lower_by_excess_asks_for_less_by_what_the_measurement_exceeded():
    asked = []
    # The measurement runs 30 bytes over whatever is asked for: one repair, 30 bytes lower, fits.
    repair = measure_and_repair(_solver(asked), lambda plan: plan + 30, 1_000, lower_by_excess, max_attempts=4)
    assert asked == [1_000, 970]
    assert [a.measured_bytes for a in repair.attempts] == [1_030, 1_000]
    assert repair.fitting.plan == 970


def test_lower_by_miss_and_excess_also_subtracts_what_the_prediction_missed():
    """The traced planner's rule: a miss that grows with the plan is not cured by the excess alone."""
    rule = lower_by_miss_and_excess(lambda plan: plan["predicted"])
    first = Attempt(1_000, {"predicted": 990}, 1_020)  # missed by 30, over the budget by 20
    assert rule((), 1_000) == 1_000
    assert rule((first,), 1_000) == 1_000 - 30 - 20
    assert rule((Attempt(950, {"predicted": 940}, 999),), 1_000) is None


def test_at_most_max_attempts_plans_are_measured():
    asked = []
    repair = measure_and_repair(_solver(asked), lambda plan: 2_000, 1_000, lower_by_excess, max_attempts=3)
    assert len(asked) == 3 and len(repair.attempts) == 3
    assert repair.fitting is None and repair.refusal is None
    assert repair.last.measured_bytes == 2_000


def test_a_refusal_ends_the_loop_with_the_target_it_refused():
    asked = []
    repair = measure_and_repair(_solver(asked, refuse_below=990), lambda plan: plan + 50, 1_000, lower_by_excess,
                                max_attempts=4)
    assert asked == [1_000, 950]
    assert isinstance(repair.refusal, Infeasible) and repair.refused_target_bytes == 950
    assert repair.last == Attempt(1_000, 1_000, 1_050) and repair.fitting is None


def test_a_plan_made_already_is_measured_not_solved_again():
    asked = []
    repair = measure_and_repair(_solver(asked), lambda plan: 900, 1_000, lower_by_excess, max_attempts=3, first=1_000)
    assert asked == [] and repair.fitting.plan == 1_000


def test_a_rule_may_stop_before_anything_is_solved():
    asked = []
    repair = measure_and_repair(_solver(asked), pytest.fail, 1_000, lambda attempts, budget: None, max_attempts=3)
    assert asked == [] and repair.attempts == () and repair.last is None


def test_max_attempts_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        measure_and_repair(_solver([]), lambda plan: 0, 1_000, lower_by_excess, max_attempts=0)
