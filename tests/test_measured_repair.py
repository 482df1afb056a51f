"""Traced plans on CUDA are measured once and re-solved while over their budget
(planner.api.repaired_on_measurement): the CUDA allocator's block rounding put a traced store-all
GPT-2 at 166.5 MiB measured against 163.6 MiB predicted and budgeted on an H100. These tests drive
the repair loop with stand-in plans and measurements: CI has no GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.api import BudgetInfeasible, repaired_on_measurement


@dataclass(frozen=True)
class _Plan:
    budget_bytes: int
    predicted_peak_bytes: int
    budget_text: str = "1000 B"
    method: str = "dp"


def test_a_plan_measured_within_its_budget_is_kept():
    made = _Plan(1000, 990)
    assert repaired_on_measurement(made, solve=pytest.fail, measure=lambda p: 1000) is made


def test_an_overshoot_is_re_solved_below_the_budget_and_the_budget_asked_is_kept():
    asked = []

    def solve(budget):
        asked.append(budget)
        return _Plan(budget, budget - 5, budget_text=f"{budget} B")

    measured = []

    def measure(plan):  # the allocator adds 30 bytes to every prediction
        measured.append(plan.predicted_peak_bytes + 30)
        return measured[-1]

    made = repaired_on_measurement(_Plan(1000, 1000), solve, measure)
    assert measured[-1] <= 1000 and measured[0] == 1030
    assert asked == [1000 - 30 - 30]
    assert made.budget_bytes == 1000 and made.budget_text == "1000 B"
    assert made.predicted_peak_bytes == 935


def test_plans_that_never_measure_within_the_budget_are_refused():
    def solve(budget):
        return _Plan(budget, budget)

    with pytest.raises(BudgetInfeasible, match="measure above it"):
        repaired_on_measurement(_Plan(1000, 1000), solve, measure=lambda p: 1001)


def test_a_budget_the_solver_cannot_meet_after_an_overshoot_is_refused():
    def solve(budget):
        raise BudgetInfeasible("too small", min_budget=990, method="dp")

    with pytest.raises(BudgetInfeasible, match="last measured 1.00 KiB|last measured"):
        repaired_on_measurement(_Plan(1000, 1000), solve, measure=lambda p: 1030)


def test_a_near_miss_measures_the_least_plan_without_save_policies_too(monkeypatch):
    """Native plans: the least plan predicted just above the budget is measured before refusing; when
    it holds a save policy and measures over, the least plan without policies is measured as well
    (the benchmark U-Net at its per-block baseline's peak: the last decoder block under @matmuls
    measured 1 MB over, plain exactly at the budget; the planner refused). Stand-ins for the search
    and the measurement."""
    import planner.native_repair as native_repair
    from planner.native_solve import no_wrapper
    from profiler.memory import StepMeasurement

    def solve(profile, model, budget, time_limit, extra_bytes=0, wrapper=no_wrapper, policies=()):
        return (_Regions(("merge.2@matmuls",) if policies else ("merge.2",)), 0)

    def measure(model, regions, inputs, loss_fn, warm_up=True):
        peak = 1_010 if regions[0].endswith("@matmuls") else 1_000
        return StepMeasurement(peak, 0, peak, 0.1, 1, "cpu")

    monkeypatch.setattr(native_repair, "solve_native", solve)
    monkeypatch.setattr(native_repair, "measure_native", measure)
    least = native_repair.least_if_it_measures_within(None, None, None, None, no_wrapper, ("matmuls",),
                                                      budget_bytes=1_000, minimum=1_005, measure=True, time_limit=None)
    assert least is not None and least[0].regions == ("merge.2",) and least[2].peak_bytes == 1_000
    assert native_repair.least_if_it_measures_within(None, None, None, None, no_wrapper, ("matmuls",),
                                                     budget_bytes=999, minimum=1_005, measure=True,
                                                     time_limit=None) is None


@dataclass(frozen=True)
class _Regions:
    regions: tuple[str, ...]


def _native_repair_stand_ins(monkeypatch, peak_of):
    """planner/native_repair.py with the search and the measurement stood in: each search returns a
    new region (``h.1``, ``h.2``, ...), each measurement ``peak_of(regions)``; the targets asked are
    recorded. Returns (search_measure_repair's request, resolved budget, the targets asked)."""
    from types import SimpleNamespace

    import planner.native_repair as native_repair
    from planner.budget import Budget
    from planner.native_request import ResolvedBudget
    from planner.native_solve import no_wrapper
    from planner.optimizer import NO_OPTIMIZER
    from profiler.memory import StepMeasurement

    asked = []

    def solve(profile, model, target, time_limit, extra_bytes=0, wrapper=no_wrapper, policies=()):
        asked.append(target)
        return _Regions((f"h.{len(asked)}",)), 0

    def measure(model, regions, inputs, loss_fn, warm_up=True):
        peak = peak_of(tuple(regions))
        return StepMeasurement(peak, 0, peak, 0.1, 1, "cpu")

    monkeypatch.setattr(native_repair, "solve_native", solve)
    monkeypatch.setattr(native_repair, "measure_native", measure)
    request = SimpleNamespace(model=None, example_inputs=None, loss_fn=None, warm=True, iteration=NO_OPTIMIZER,
                              wrapper=no_wrapper, profile=None, time_limit=None, policies=(), measure=True,
                              budget=Budget(bytes=1_000))
    return request, ResolvedBudget(1_000, 2_000, None, False), asked


def test_a_native_plan_measured_over_is_searched_again_for_less_by_the_excess(monkeypatch):
    """Native plans (planner/native_repair.py on planner/repair.py's loop): the first plan measures
    30 bytes over the budget, so the search is asked for 30 bytes less, and that plan fits."""
    import planner.native_repair as native_repair

    request, resolved, asked = _native_repair_stand_ins(monkeypatch, lambda regions: 1_030 if regions == ("h.1",)
                                                        else 990)
    solved, held, measured, _ = native_repair.search_measure_repair(request, resolved)
    assert asked == [1_000, 970]
    assert solved.regions == ("h.2",) and held == 0 and measured.peak_bytes == 990


def test_native_plans_that_never_measure_within_the_budget_are_refused_after_the_repairs(monkeypatch):
    import planner.native_repair as native_repair
    from solvers import Infeasible

    request, resolved, asked = _native_repair_stand_ins(monkeypatch, lambda regions: 1_030)
    with pytest.raises(Infeasible, match="measured over it") as refused:
        native_repair.search_measure_repair(request, resolved)
    assert asked == [1_000, 970, 940, 910] and len(asked) == native_repair.REPAIRS + 1
    assert refused.value.min_budget == 1_030
