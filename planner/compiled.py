"""Compile-priced native plans: regions chosen by what the **compiled** step measures.

``planner.plan(model, inputs, budget, compile=True)``. The plan is meant to run as
``torch.compile(planner.apply(model, plan))`` (default inductor), and its figures are that step's:
inductor fuses pointwise ops and frees what eager autograd holds (the bundled GPT-2's un-checkpointed
step peaks at 481.4 MiB eager and 331.8 MiB compiled), so a plan priced on the eager step
checkpoints what the compiled step does not need. There is no model of inductor here: every figure
is measured.

1. The model compiled with nothing checkpointed is measured (peak and step time, one training step
   on the example inputs: :func:`planner.measured.measure_planned_step`, the CPU allocator's events
   replayed, ``max_memory_allocated`` on CUDA). ``"N%"`` budgets are N% of **this** peak. When it
   fits, the plan checkpoints nothing.
2. Otherwise the candidates are eager native plans (planner/native.py, ``plan_native(...,
   measure=False)``) for a sequence of eager targets: first the budget scaled by the compiled peak
   over the eager one (compiled steps hold less), then a safeguarded secant search (bisection when
   the secant leaves the bracket) on the eager target between the largest target whose compiled
   step fits and the smallest that does not. Each new set of regions is applied, compiled and
   measured (planner/repair.py's measure-and-repair loop, the secant its rule for the next
   target); a set met before is not compiled again. At most ``max_compiles`` compiles (the
   un-checkpointed one included); when no candidate has fit by the last one, the last is the eager
   search's least plan, so a refusal's ``min_budget`` is the least compiled peak measured.
3. The plan is the fastest measured candidate within the budget; candidates whose measured steps are
   within :data:`TIE` of the fastest count as equal (this machine's timings drift by more), and the
   one with the least predicted recomputation among them wins.

Each compile runs after ``torch._dynamo.reset()`` (and one more after the search): applying other
regions to the same model must not reuse a graph compiled for the last ones. A side effect: functions
compiled earlier in the process compile again at their next call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

import profiler
from runtime.native import apply_native, remove_native
from solvers import Infeasible

from .budget import Budget, format_bytes
from .measured import measure_planned_step
from .native import plan_native, refuse_wrapped
from .native_plan import NativePlan
from .native_request import native_profile
from .planfile import PlanFileError, _list, _mapping, _seconds, _text, _whole
from .repair import measure_and_repair

MAX_COMPILES = 5  # per plan, the un-checkpointed step's compile included (10-70 s each on GPT-2 on 2 CPU cores)
# Timed steps per candidate (median), after the compiling warm-up and the measured step: the first
# steps after a compile measured 10-25x slower than later ones on a loaded 2-core CPU (a 6-block MLP:
# 1.7-3.1 s, then 0.07-0.6 s), so the median needs the later ones.
REPEATS = 5
TIE = 0.03  # measured steps this close to the fastest count as equal
RESOLUTION = 0.01  # of the eager un-checkpointed peak: a bracket this narrow ends the search


@dataclass(frozen=True)
class CompiledCandidate:
    """One set of regions, compiled and measured. ``eager_target_bytes`` is the eager budget its
    regions were searched for (None for the un-checkpointed step), ``eager_predicted_*`` the eager
    plan's prediction; ``peak_bytes`` and ``seconds`` the compiled step's, measured;
    ``compile_seconds`` the wall time of compiling and measuring it."""

    regions: tuple[str, ...]
    eager_target_bytes: int | None
    eager_predicted_peak_bytes: int
    eager_predicted_seconds: float
    peak_bytes: int
    seconds: float
    compile_seconds: float

    def to_dict(self) -> dict:
        return {"regions": list(self.regions), "eager_target_bytes": self.eager_target_bytes,
                "eager_predicted_peak_bytes": self.eager_predicted_peak_bytes,
                "eager_predicted_seconds": self.eager_predicted_seconds, "peak_bytes": self.peak_bytes,
                "seconds": self.seconds, "compile_seconds": self.compile_seconds}

    @classmethod
    def from_dict(cls, data: dict) -> CompiledCandidate:
        """Read back what :meth:`to_dict` wrote; TypeError/ValueError/KeyError name what is wrong."""
        target = data["eager_target_bytes"]
        return cls(regions=tuple(_text(r) for r in _list(data["regions"])),
                   eager_target_bytes=None if target is None else _whole(target, "eager_target_bytes"),
                   eager_predicted_peak_bytes=_whole(data["eager_predicted_peak_bytes"], "eager_predicted_peak_bytes"),
                   eager_predicted_seconds=_seconds(data["eager_predicted_seconds"], "eager_predicted_seconds"),
                   peak_bytes=_whole(data["peak_bytes"], "peak_bytes"),
                   seconds=_seconds(data["seconds"], "seconds"),
                   compile_seconds=_seconds(data["compile_seconds"], "compile_seconds"))


@dataclass
class CompiledNativePlan(NativePlan):
    """A :class:`NativePlan` priced on the compiled step: run it as
    ``torch.compile(planner.apply(model, plan))``.

    ``predicted_peak_bytes`` / ``measured_peak_bytes`` and ``predicted_seconds`` /
    ``measured_seconds`` are the compiled step's, **measured** (there is no prediction of inductor);
    ``unplanned_*`` the compiled un-checkpointed step's, measured, the base of a ``"N%"`` budget.
    ``candidates``: every set of regions compiled and measured, in order; ``compiles`` how many
    compiles that took; ``planning_seconds`` the whole planning, profile and compiles included.
    ``graph`` and ``schedule`` are the eager model of the chosen regions (solvers/regions/), and
    ``eager_predicted_peak_bytes`` / ``eager_predicted_seconds`` its prediction of the eager step.

    Saved, it keeps the native format with a ``"compiled"`` section; ``planner.load`` reads it back
    as a :class:`CompiledNativePlan`, its compiled figures and candidates included (a reader that
    knows only the native format gets a :class:`NativePlan` with the same regions)."""

    compiles: int = 0
    planning_seconds: float = 0.0
    eager_predicted_peak_bytes: int = 0
    eager_predicted_seconds: float = 0.0
    candidates: tuple[CompiledCandidate, ...] = field(default_factory=tuple)

    @property
    def compiled(self) -> bool:
        return True

    def summary(self) -> str:
        saving = 1 - self.measured_peak_bytes / self.unplanned_peak_bytes if self.unplanned_peak_bytes else 0.0
        shown = ", ".join(self.regions[:8]) + (f" and {len(self.regions) - 8} more" if len(self.regions) > 8 else "")
        return "\n".join([
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            "Executor:          native, priced compiled: run it as torch.compile(planner.apply(model, plan))",
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}) for the whole compiled step"
            + ("; a percentage is of the compiled un-checkpointed step's measured peak" if "%" in self.budget_text
               else ""),
            f"Compiled peak:     {format_bytes(self.measured_peak_bytes)} measured (one step on the example inputs), "
            f"without checkpointing {format_bytes(self.unplanned_peak_bytes)} ({saving:.1%} less)",
            f"Compiled step:     {self.measured_seconds * 1000:.1f} ms measured, {self.predicted_overhead:+.1%} over "
            f"{self.unplanned_seconds * 1000:.1f} ms without checkpointing (timings on a loaded machine drift)",
            f"Search:            {self.compiles} compile(s) of {len(self.candidates)} candidate(s) in "
            f"{self.planning_seconds:.1f} s; eager prediction of these regions "
            f"{format_bytes(self.eager_predicted_peak_bytes)}",
            f"Checkpointed:      {shown or 'nothing (the compiled step fits without checkpointing)'}",
        ])

    def to_dict(self) -> dict:
        data = super().to_dict()
        data["compiled"] = {
            "run_as": "torch.compile(planner.apply(model, plan))",
            "compiles": self.compiles,
            "planning_seconds": self.planning_seconds,
            "eager_predicted_peak_bytes": self.eager_predicted_peak_bytes,
            "eager_predicted_seconds": self.eager_predicted_seconds,
            "candidates": [c.to_dict() for c in self.candidates],
        }
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> CompiledNativePlan:
        native = NativePlan.from_dict(data, source, check_figures=False)  # measured on the compiled step
        try:
            compiled = _mapping(data["compiled"], "compiled")
            figures = {
                "compiles": _whole(compiled["compiles"], "compiled.compiles"),
                "planning_seconds": _seconds(compiled["planning_seconds"], "compiled.planning_seconds"),
                "eager_predicted_peak_bytes": _whole(compiled["eager_predicted_peak_bytes"],
                                                     "compiled.eager_predicted_peak_bytes"),
                "eager_predicted_seconds": _seconds(compiled["eager_predicted_seconds"],
                                                    "compiled.eager_predicted_seconds"),
                "candidates": tuple(CompiledCandidate.from_dict(_mapping(c, "compiled.candidates[]"))
                                    for c in _list(compiled["candidates"])),
            }
        except (KeyError, TypeError, ValueError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {type(error).__name__}: {error}") from None
        fields_ = {name: getattr(native, name) for name in NativePlan.__dataclass_fields__}
        return cls(**fields_, **figures)


class _Search:
    """The candidates compiled and measured so far, by their regions."""

    def __init__(self, model, example_inputs, loss_fn, repeats: int, max_compiles: int):
        self.model, self.inputs, self.loss_fn = model, example_inputs, loss_fn
        self.repeats, self.max_compiles = repeats, max_compiles
        self.measured: dict[tuple[str, ...], CompiledCandidate] = {}

    @property
    def compiles(self) -> int:
        return len(self.measured)

    def measure(self, plan: NativePlan, target: int | None) -> CompiledCandidate:
        regions = tuple(plan.regions)
        if regions not in self.measured:
            started = time.perf_counter()
            step = measure_compiled(self.model, regions, self.inputs, self.loss_fn, self.repeats)
            self.measured[regions] = CompiledCandidate(
                regions, target, int(plan.predicted_peak_bytes), float(plan.predicted_seconds), int(step.peak_bytes),
                float(step.seconds), time.perf_counter() - started)
        return self.measured[regions]


def measure_compiled(model: torch.nn.Module, regions, example_inputs, loss_fn, repeats: int = REPEATS):
    """One training step of ``torch.compile(model)`` with ``regions`` checkpointed (runtime/native.py),
    measured as the user's step would be (:func:`planner.measured.measure_planned_step`: a compiling
    warm-up step, the measured step, then ``repeats`` timed ones; the parameters' ``.grad`` left as
    they were), then undone. ``torch._dynamo.reset()`` before and after."""
    torch._dynamo.reset()
    try:
        apply_native(model, tuple(regions))
        return measure_planned_step(torch.compile(model), example_inputs, loss_fn, repeats)
    finally:
        remove_native(model)
        torch._dynamo.reset()


def plan_compiled_native(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None,
                         time_limit: float | None = None, granularity="module",
                         profile: profiler.Profile | None = None, max_compiles: int = MAX_COMPILES,
                         repeats: int = REPEATS) -> CompiledNativePlan:
    """A :class:`CompiledNativePlan` for ``budget`` (see the module docstring). Raises
    :class:`solvers.Infeasible` with ``min_budget``, the least compiled peak measured, when no
    candidate's compiled step fits."""
    if max_compiles < 2:
        raise ValueError(f"max_compiles={max_compiles}: at least 2 (the un-checkpointed step and one plan)")
    started = time.perf_counter()
    refuse_wrapped(model)
    remove_native(model)
    if profile is None:  # as plan_native traces it: what eager autograd runs
        profile = native_profile(model, example_inputs, loss_fn, granularity=granularity)
    search = _Search(model, example_inputs, loss_fn, repeats, max_compiles)

    def eager(target: int) -> NativePlan:
        return plan_native(model, example_inputs, Budget(bytes=max(int(target), 1)), loss_fn=loss_fn,
                           time_limit=time_limit, profile=profile, measure=False)

    unplanned = plan_native(model, example_inputs, Budget(percent=100.0), loss_fn=loss_fn, time_limit=time_limit,
                            profile=profile, measure=False)
    eager_peak = int(unplanned.unplanned_peak_bytes)  # predicted eager store-all
    plans = {(): unplanned}
    none = search.measure(_without_regions(unplanned), None)
    budget_bytes = budget.resolve(none.peak_bytes)
    if none.peak_bytes > budget_bytes:
        _search(search, eager, plans, eager_peak, none, budget_bytes, unplanned.fixed_bytes)
    fitting = [c for c in search.measured.values() if c.peak_bytes <= budget_bytes]
    if not fitting:
        least = min(search.measured.values(), key=lambda c: c.peak_bytes)
        raise Infeasible(
            f"budget {budget} ({format_bytes(budget_bytes)}) is below every compiled step measured: the least, "
            f"{format_bytes(least.peak_bytes)} ({least.peak_bytes} bytes), checkpoints "
            f"{len(least.regions)} region(s) ({search.compiles} compile(s); the compiled un-checkpointed step "
            f"peaks at {format_bytes(none.peak_bytes)})", min_budget=least.peak_bytes, method="regions")
    chosen = choose(fitting)
    return _compiled_plan(plans[chosen.regions], chosen, none, budget, budget_bytes, search,
                          time.perf_counter() - started)


def _without_regions(plan: NativePlan) -> NativePlan:
    if plan.regions:  # the search at the eager store-all peak should checkpoint nothing
        raise AssertionError(f"the eager plan at 100% checkpoints {plan.regions}")
    return plan


def choose(fitting: list[CompiledCandidate]) -> CompiledCandidate:
    """The fastest measured candidate; those within :data:`TIE` of it count as equal, and the one
    with the least predicted eager step (the least recomputation) among them wins, then the fewest
    regions."""
    fastest = min(c.seconds for c in fitting)
    equal = [c for c in fitting if c.seconds <= fastest * (1 + TIE)]
    return min(equal, key=lambda c: (c.eager_predicted_seconds, len(c.regions), c.regions))


def _least_plan(eager, error: Infeasible, fixed_bytes: int) -> tuple[int, NativePlan] | None:
    """The least eager target the region search meets, and its plan, from a refusal: the minimum the
    refusal gives (asked again just above the parameters, buffers and inputs when it gave none),
    raised by a little until the search takes it (its minimum is approximate: RNG states)."""
    if error.min_budget is None:
        try:
            return fixed_bytes + 1, eager(fixed_bytes + 1)
        except Infeasible as again:
            error = again
    if error.min_budget is None:
        return None
    least = int(math.ceil(error.min_budget))
    for step in range(6):
        target = least + int(least * 0.001 * 2**step) if step else least
        try:
            return target, eager(target)
        except Infeasible:
            continue
    return None


@dataclass
class _Bracket:
    """The compiled search's state, eager targets in bytes: the largest known to fit compiled
    (``lo``) and the smallest known not to (``hi``), with their compiled peaks; the least target the
    eager search reaches (``floor``, once known); the last (target, compiled peak) measured."""

    hi: float
    hi_peak: int
    previous: tuple[float, int]
    lo: float | None = None
    lo_peak: int | None = None
    floor: int | None = None


@dataclass(frozen=True)
class _Candidate:
    """An eager plan and the eager target it was made for: the least target the search reaches when
    the one asked for was refused."""

    target_bytes: int
    plan: NativePlan


def _search(search: _Search, eager, plans: dict, eager_peak: int, none: CompiledCandidate, budget_bytes: int,
            fixed_bytes: int) -> None:
    """Measure candidates for eager targets until the bracket between the largest target that fits
    compiled (``lo``) and the smallest that does not (``hi``) is narrower than :data:`RESOLUTION`,
    or the compiles run out: planner/repair.py's loop, with the safeguarded secant as its rule."""
    bracket = _Bracket(hi=eager_peak, hi_peak=none.peak_bytes, previous=(eager_peak, none.peak_bytes))

    def solve(target: int) -> _Candidate:
        try:
            return _Candidate(target, eager(target))
        except Infeasible as error:
            if bracket.floor is not None and target <= bracket.floor:
                raise  # the least the eager search reaches was tried already: stop
            least = _least_plan(eager, error, fixed_bytes)
            if least is None:
                raise
            bracket.floor, plan = least
            return _Candidate(bracket.floor, plan)

    def measure(candidate: _Candidate) -> int:
        plans.setdefault(tuple(candidate.plan.regions), candidate.plan)
        return search.measure(candidate.plan, candidate.target_bytes).peak_bytes

    def next_target(attempts, budget: int) -> int | None:
        if not attempts:
            guess = budget * eager_peak / none.peak_bytes  # compiled steps hold less than eager ones
        else:
            last = attempts[-1]
            guess = _secant_step(bracket, last.plan.target_bytes, last.measured_bytes, budget, eager_peak)
            if guess is None:
                return None
        return _within_compiles(search, bracket, eager, fixed_bytes, guess)

    # A target whose regions were measured before costs no compile: more attempts than compiles.
    measure_and_repair(solve, measure, budget_bytes, next_target, max_attempts=4 * search.max_compiles)


def _secant_step(bracket: _Bracket, target: int, peak: int, budget_bytes: int, eager_peak: int) -> float | None:
    """The next eager target after ``target`` measured at compiled ``peak`` (bytes), the bracket
    updated; None to stop: the least target the eager search reaches does not fit compiled, or the
    bracket is narrower than :data:`RESOLUTION` of the eager peak. The secant through the last two
    measured points, aimed at the budget, kept inside the bracket's middle half (bisection when it
    leaves it)."""
    if peak <= budget_bytes:
        bracket.lo, bracket.lo_peak = target, peak
    else:
        if bracket.floor is not None and target <= bracket.floor:
            return None  # the least the eager search reaches does not fit compiled
        bracket.hi, bracket.hi_peak = target, peak
    lo, hi = bracket.lo, bracket.hi
    if lo is not None and hi - lo < RESOLUTION * eager_peak:
        return None
    point, previous = (target, peak), bracket.previous
    bracket.previous = point
    if lo is None:
        low_end = bracket.floor if bracket.floor is not None else 0
        guess = _secant(previous, point, budget_bytes)
        step = RESOLUTION * eager_peak
        return max(min(guess if guess is not None else (low_end + hi) / 2, hi - step), low_end)
    guess = _secant((lo, bracket.lo_peak), (hi, bracket.hi_peak), budget_bytes)
    quarter = (hi - lo) / 4
    return (lo + hi) / 2 if guess is None else min(max(guess, lo + quarter), hi - quarter)


def _within_compiles(search: _Search, bracket: _Bracket, eager, fixed_bytes: int, target: float) -> int | None:
    """``target`` as the next eager target (whole bytes), None when the compiles are spent; at the
    last compile with nothing fitting yet, the least target the eager search reaches instead, so
    that a refusal's minimum is the least compiled peak."""
    if search.compiles >= search.max_compiles:
        return None
    if bracket.lo is None and search.compiles == search.max_compiles - 1:
        if bracket.floor is None:
            try:
                eager(1)
            except Infeasible as error:
                least = _least_plan(eager, error, fixed_bytes)
                bracket.floor = None if least is None else least[0]
        if bracket.floor is not None:
            target = bracket.floor
    return int(target)


def _secant(a: tuple[int, int], b: tuple[int, int], goal: int) -> float | None:
    """The eager target at which the line through two (target, compiled peak) points reaches
    ``goal``; None when the points do not rise with the target."""
    (t1, c1), (t2, c2) = a, b
    if t1 == t2 or (c2 - c1) * (t2 - t1) <= 0:
        return None
    return t1 + (goal - c1) * (t2 - t1) / (c2 - c1)


def _compiled_plan(eager_plan: NativePlan, chosen: CompiledCandidate, none: CompiledCandidate, budget: Budget,
                   budget_bytes: int, search: _Search, seconds: float) -> CompiledNativePlan:
    fields_ = {name: getattr(eager_plan, name) for name in NativePlan.__dataclass_fields__}
    fields_.update(
        budget_bytes=budget_bytes, budget_text=str(budget),
        predicted_peak_bytes=chosen.peak_bytes, unplanned_peak_bytes=none.peak_bytes,
        predicted_seconds=chosen.seconds, unplanned_seconds=none.seconds,
        measured_peak_bytes=chosen.peak_bytes, measured_seconds=chosen.seconds,
    )
    return CompiledNativePlan(**fields_, compiles=search.compiles, planning_seconds=seconds,
                              eager_predicted_peak_bytes=chosen.eager_predicted_peak_bytes,
                              eager_predicted_seconds=chosen.eager_predicted_seconds,
                              candidates=tuple(search.measured.values()))


__all__ = ["CompiledCandidate", "CompiledNativePlan", "MAX_COMPILES", "measure_compiled", "plan_compiled_native"]
