"""One measure-and-repair loop: plan at a target, measure the plan, let a rule pick the next target.

A plan's predicted peak can miss its measured one: a native plan's trace holds a dropout's mask as
a float where eager holds a bool (docs/native.md, "Measured, then repaired"); a traced plan on CUDA
meets the caching allocator's block rounding (planner/api.py, ``repaired_on_measurement``); a
compiled step has no prediction at all, only eager targets that land somewhere (planner/compiled.py).
Each caller asks its planner for a plan at a target (bytes), measures it, and asks again for a
target its rule derives from what was measured. :func:`measure_and_repair` is that loop, once; the
callers give the rule:

- :func:`lower_by_excess` (native plans): the last target lowered by the measured excess over the budget;
- :func:`lower_by_miss_and_excess` (traced plans on CUDA): lowered by what the prediction missed too;
- :func:`starting_at` either of them from another first target (planner/fsdp2_exact.py: the budget
  plus what FSDP2's upper bound over-counts, each plan "measured" by its exact per-rank peak);
- the compiled search's safeguarded secant over a bracket of eager targets (planner/compiled.py).

Stopping rules, all in bytes (the loop stops at the first that holds):

1. the rule returns None: for :func:`lower_by_excess` and :func:`lower_by_miss_and_excess`, once
   the last plan's measured peak is at most the budget (the plan fits by measurement);
2. ``solve`` raises :class:`solvers.Infeasible` (no plan for that target): the refusal and the
   target it refused are returned, with the attempts measured before it;
3. ``max_attempts`` plans have been measured.

The loop returns what happened (:class:`Repair`); what a caller makes of a loop that ended without
a fitting plan (a refusal, the least plan, the fastest candidate measured) is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from solvers import Infeasible

P = TypeVar("P")


@dataclass(frozen=True)
class Attempt(Generic[P]):
    """One plan asked for ``target_bytes`` and measured at ``measured_bytes`` (its peak, bytes)."""

    target_bytes: int
    plan: P
    measured_bytes: int

    def fits(self, budget_bytes: int) -> bool:
        """Whether the measured peak is within ``budget_bytes``."""
        return self.measured_bytes <= budget_bytes


@dataclass(frozen=True)
class Repair(Generic[P]):
    """What :func:`measure_and_repair` did: the ``attempts`` in order, and the ``refusal`` of
    ``solve`` that ended it (for ``refused_target_bytes``), if one did."""

    budget_bytes: int
    attempts: tuple[Attempt[P], ...]
    refusal: Infeasible | None = None
    refused_target_bytes: int | None = None

    @property
    def last(self) -> Attempt[P] | None:
        """The last plan measured, None when none was."""
        return self.attempts[-1] if self.attempts else None

    @property
    def fitting(self) -> Attempt[P] | None:
        """The last plan measured, when it measured within the budget; else None."""
        last = self.last
        return last if last is not None and last.fits(self.budget_bytes) else None


# The next target (bytes) from the attempts so far and the budget (bytes), or None to stop. Called
# first with no attempts: the first target.
NextTarget = Callable[[Sequence[Attempt], int], "int | None"]


def measure_and_repair(solve: Callable[[int], P], measure: Callable[[P], int], budget_bytes: int,
                       next_target: NextTarget, max_attempts: int, first: P | None = None) -> Repair[P]:
    """Plan with ``solve(target_bytes)``, measure with ``measure(plan)`` (its peak, bytes), and go on
    at ``next_target(attempts, budget_bytes)`` until one of the stopping rules of the module
    docstring holds. ``first``: a plan already made for the first target (it is measured, not
    solved again)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts}: at least 1")
    attempts: list[Attempt[P]] = []
    target = next_target((), budget_bytes)
    plan = first
    while target is not None and len(attempts) < max_attempts:
        if plan is None:
            try:
                plan = solve(target)
            except Infeasible as error:
                return Repair(budget_bytes, tuple(attempts), error, target)
        attempts.append(Attempt(target, plan, int(measure(plan))))
        plan = None
        target = next_target(tuple(attempts), budget_bytes)
    return Repair(budget_bytes, tuple(attempts))


def lower_by_excess(attempts: Sequence[Attempt], budget_bytes: int) -> int | None:
    """First the budget; after a plan measured over it, the last target lowered by the excess (the
    prediction missed by about that much: ask for less); None once a plan measured within it."""
    if not attempts:
        return budget_bytes
    last = attempts[-1]
    if last.fits(budget_bytes):
        return None
    return last.target_bytes - (last.measured_bytes - budget_bytes)


def lower_by_miss_and_excess(predicted_bytes: Callable[[P], int]) -> NextTarget:
    """First the budget; after a plan measured over it, the last target lowered by what the
    prediction missed (measured less ``predicted_bytes(plan)``, the plan's predicted peak) and by the
    excess over the budget; None once a plan measured within it. For a miss that grows with the
    plan (the CUDA allocator's rounding of each block), where lowering by the excess alone repeats it."""

    def next_target(attempts: Sequence[Attempt], budget_bytes: int) -> int | None:
        if not attempts:
            return budget_bytes
        last = attempts[-1]
        if last.fits(budget_bytes):
            return None
        missed = last.measured_bytes - predicted_bytes(last.plan)
        return last.target_bytes - missed - (last.measured_bytes - budget_bytes)

    return next_target


def starting_at(first_target_bytes: int, rule: NextTarget) -> NextTarget:
    """``rule``, but for its first target: ``first_target_bytes``."""

    def next_target(attempts: Sequence[Attempt], budget_bytes: int) -> int | None:
        return first_target_bytes if not attempts else rule(attempts, budget_bytes)

    return next_target


__all__ = ["Attempt", "NextTarget", "Repair", "lower_by_excess", "lower_by_miss_and_excess", "measure_and_repair",
           "starting_at"]
