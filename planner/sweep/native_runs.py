"""A sweep's run for the native executor: what ``plan-checkpoints MODEL.py --budget B`` does, in a worker.

A native plan is measured on the model itself (its peak and step time, repaired when the
measurement is over the budget: planner/native.py), so a native run cannot be solved from a
profile alone, as a traced run is (planner/sweep/tasks.py). Each native run loads its model,
profiles it with :func:`planner.api.profile_for` and plans it with :func:`planner.api.plan`, the
calls the command line makes: a sweep's native row is the plan planner.plan returns for the same
model, inputs and budget. The op times, the expensive part of the profile, and the checkpoint
clock the plans are priced with come from the sweep's profile cache (planner/sweep/profilecache.py,
clockcache.py) after the model's first run, so the runs of one model after the first only trace it,
and price their plans with the same figures.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

from .config import Run
from .tasks import ERROR, INFEASIBLE, Outcome, _busy, describe, load_model, profile_facts


@_busy
def plan_native_run(run: Run, cache_dir: str | None) -> Outcome:
    """Load, profile and plan one run as planner.plan does for ``run.executor``; failures become
    an Outcome, never an exception. The planner's warnings about the plan go in ``Outcome.notes``."""
    from ..fallback import FallbackWarning
    from ..planfile import PlanWarning

    with warnings.catch_warnings(record=True) as caught:
        for category in (PlanWarning, FallbackWarning):  # each run's own, even where an earlier run said the same
            warnings.simplefilter("always", category)
        outcome = _planned(run, cache_dir)
    for other in (w for w in caught if not _about_the_plan(w)):  # shown as they would have been
        warnings.showwarning(other.message, other.category, other.filename, other.lineno)
    notes = tuple(dict.fromkeys(" ".join(str(w.message).split()) for w in caught if _about_the_plan(w)))
    return replace(outcome, notes=notes) if notes else outcome


def _about_the_plan(caught: warnings.WarningMessage) -> bool:
    """The planner's own warnings (PlanWarning, FallbackWarning), not libraries' deprecations."""
    from ..fallback import FallbackWarning
    from ..planfile import PlanWarning

    return issubclass(caught.category, (PlanWarning, FallbackWarning))


def _planned(run: Run, cache_dir: str | None) -> Outcome:
    import profiler

    from ..api import BudgetInfeasible, plan, plan_untraceable, profile_for
    from ..bounded import device_memory_of, profiling_bound
    from ..cli.modelfile import guarded
    from .clockcache import keep_clock, restore_clock
    from .profilecache import ProfileCache

    spec, executor = run.model, run.executor.plan_argument
    started = time.perf_counter()
    try:
        model_file = load_model(spec, run.device)
    except Exception as error:  # the model file raised: this run's error, the sweep goes on
        return Outcome(ERROR, method=run.solver, executor=run.executor.name, error=describe(error))
    model, inputs, loss_fn = model_file.model, model_file.example_inputs, model_file.loss_fn
    cache = ProfileCache(cache_dir) if cache_dir else None
    profile = None
    try:
        with guarded(spec.file, "in the model's forward or loss_fn"):  # sys.exit() there fails this run only
            # As the command line: profiling holds at most a byte budget (or the device's memory).
            device_memory = device_memory_of(model, inputs)
            try:
                profile = profile_for(model, inputs, loss_fn=loss_fn, granularity=spec.granularity, solver=run.solver,
                                      executor=executor, memory_bound=profiling_bound(run.budget, device_memory),
                                      times_cache=cache)
            except profiler.TraceError as error:  # as the command line: a native plan of the eager step
                made = plan_untraceable(model, inputs, run.budget, loss_fn=loss_fn, reason=error.reason,
                                        time_limit=spec.time_limit)
            else:
                clock_kept = cache is not None and restore_clock(profile, cache)
                try:
                    made = plan(model, inputs, run.budget, solver=run.solver, loss_fn=loss_fn,
                                time_limit=spec.time_limit, granularity=spec.granularity, profile=profile,
                                executor=executor, device_memory=device_memory)
                finally:  # measured for a refused budget too: the model's next runs price with it
                    if cache is not None and not clock_kept:
                        keep_clock(profile, cache)
    except BudgetInfeasible as error:
        return Outcome(INFEASIBLE, method=error.method or run.solver, executor=run.executor.name,
                       error=str(error).strip().splitlines()[0], budget_bytes=run.budget.bytes,
                       min_budget_bytes=error.min_budget, solve_seconds=time.perf_counter() - started,
                       profile=_facts(profile, cache))
    except TimeoutError as error:
        limit = f"{spec.time_limit:g} s" if spec.time_limit else "the solver's default time limit"
        detail = " ".join(getattr(error, "detail", str(error)).split())
        return Outcome(ERROR, method=run.solver, executor=run.executor.name,
                       error=f"no plan within budget {run.budget} found in {limit}" + (f" ({detail})" if detail else ""),
                       solve_seconds=time.perf_counter() - started, profile=_facts(profile, cache))
    except Exception as error:  # the profiler, the planner or the model's forward failed: this run's error
        return Outcome(ERROR, method=run.solver, executor=run.executor.name, error=describe(error),
                       solve_seconds=time.perf_counter() - started, profile=_facts(profile, cache))
    return _outcome(made, _facts(made.profile if profile is None else profile, cache))


def _facts(profile, cache) -> dict | None:
    if profile is None:
        return None
    return profile_facts(profile, cached=bool(cache is not None and cache.hits))


def _outcome(made, facts: dict | None) -> Outcome:
    """The figures of a plan planner.plan made (a NativePlan, or a traced plan where planner.plan
    chose the traced executor), its file as a dict."""
    from ..api import NativePlan

    info = made.schedule.info
    native = isinstance(made, NativePlan)
    made.profile = None  # the plan is saved, not applied: its file holds no profile
    return Outcome(
        status=info.status, method=info.method, executor=made.executor if native else "traced",
        budget_bytes=made.budget_bytes, predicted_peak_bytes=made.predicted_peak_bytes,
        measured_peak_bytes=made.measured_peak_bytes if native else None,
        unplanned_peak_bytes=made.unplanned_peak_bytes, fixed_bytes=made.fixed_bytes,
        predicted_seconds=made.predicted_seconds, unplanned_seconds=made.unplanned_seconds,
        predicted_overhead=made.predicted_overhead, solve_seconds=info.solve_seconds, gap=info.gap,
        plan=made.to_dict(), profile=facts,
    )


__all__ = ["plan_native_run"]
