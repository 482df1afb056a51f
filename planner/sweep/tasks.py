"""What a ``batch`` worker does: profile a model once, solve one run. Both take and return plain,
picklable data, so that they run the same inline (``--jobs 1``) or in a worker process.

A model is profiled once per sweep; its runs are solved from a :class:`Profiled`, which carries the
cost graph and the few facts a Plan records about the traced step, not the traced step itself.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import networkx as nx

from .config import ModelSpec, Run

OK_STATUSES = ("optimal", "optimal-in-order", "feasible", "heuristic")  # a plan was made (solvers' own statuses)
INFEASIBLE = "infeasible"  # the budget is below what the solver reaches
ERROR = "error"  # the model file, the profiler or the solver failed


@dataclass(frozen=True)
class Profiled:
    """A model's profile as the runs need it (picklable: the graph is plain data)."""

    model_class: str
    graph: nx.DiGraph
    tangent_outputs: tuple[int, ...]
    tangent_specs: tuple
    inputs: tuple[str, ...]
    granularity: str
    device: str
    seconds: float
    cached: bool  # the op times came from the profile cache: nothing was timed
    # (granularity, graph) of every finer grouping, for planner/granularity.py's search; empty when
    # the sweep fixed the granularity.
    finer: tuple[tuple[str, nx.DiGraph], ...] = ()

    def as_profile(self):
        """A profiler.Profile holding what planner.plan reads (graph, loss and input facts); it has
        no traced step, so a plan made from it is saved, never applied in place."""
        from types import SimpleNamespace

        import profiler

        joint = SimpleNamespace(
            loss=SimpleNamespace(tangent_outputs=self.tangent_outputs, tangent_specs=self.tangent_specs),
            layout=SimpleNamespace(signature=list(self.inputs)),
        )
        finer = tuple(profiler.Profile(graph, joint, None, None, granularity, self.device, self.seconds, ())
                      for granularity, graph in self.finer)
        return profiler.Profile(self.graph, joint, None, None, self.granularity, self.device, self.seconds, finer)


@dataclass(frozen=True)
class Outcome:
    """A run's result: figures for the table, and the plan as its JSON dict when one was made."""

    status: str
    method: str = ""
    executor: str = ""  # what the plan runs under: native or traced (the run's executor when none was made)
    error: str = ""
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None  # native plans: the planned step as planner.plan measured it
    unplanned_peak_bytes: int | None = None
    fixed_bytes: int | None = None
    predicted_seconds: float | None = None
    unplanned_seconds: float | None = None
    predicted_overhead: float | None = None
    solve_seconds: float | None = None
    gap: float | None = None
    min_budget_bytes: int | None = None
    notes: tuple[str, ...] = ()  # the planner's warnings about this plan, one line each
    profile: dict | None = None  # facts of the profile the run made itself (a native run); see profile_facts
    plan: dict | None = None


def profile_facts(profile, cached: bool) -> dict:
    """What a run's record says of the profile it was planned on (a :class:`Profiled` or a
    profiler.Profile): seconds profiling took, whether the op times came from the cache, the graph's
    size and fingerprint, the granularity and the device."""
    return {"seconds": profile.seconds, "cached": cached, "nodes": profile.graph.number_of_nodes(),
            "fingerprint": profile.graph.graph.get("fingerprint"), "granularity": profile.granularity,
            "device": profile.device}


def describe(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    from ..cli.modelfile import ModelFileError

    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, ModelFileError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- a model file with keyword arguments ------------------------------------------------------------
def load_model(spec: ModelSpec, device: str | None):
    """Build the model and its inputs from the spec's file, functions and keyword arguments. Only
    functions the file defines itself are called (planner/cli/modelfile.py); a sweep file is code all
    the same, since it names the file (docs/batch.md)."""
    from ..cli.modelfile import load_model_file

    return load_model_file(spec.file, spec.model_fn, spec.inputs_fn, device, model_kwargs=spec.model_kwargs,
                           inputs_kwargs=spec.inputs_kwargs, loss_fn=spec.loss_fn, loss_kwargs=spec.loss_kwargs)


_BUSY = False  # a task is running in this (worker) process


def _interrupted(signum, frame) -> None:
    if _BUSY:  # the task unwinds (a CP-SAT solve stops) and fails; the pool's shutdown then ends this worker
        raise KeyboardInterrupt
    # idle, maybe inside the task queue's read: nothing to stop; the shutdown's sentinel ends it


def _busy(function):
    @functools.wraps(function)
    def task(*args, **kwargs):
        global _BUSY
        _BUSY = True
        try:
            return function(*args, **kwargs)
        finally:
            _BUSY = False

    return task


# -- the two tasks ------------------------------------------------------------------------------------
@_busy
def profile_model(spec: ModelSpec, device: str | None, cache_dir: str | None) -> Profiled:
    """Load and profile one model (the op times from ``cache_dir`` when it was measured before)."""
    import profiler
    from profiler.api import parse_granularity

    from .profilecache import ProfileCache

    from ..cli.modelfile import guarded

    model_file = load_model(spec, device)
    cache = ProfileCache(cache_dir) if cache_dir else None
    with guarded(spec.file, "in the model's forward or loss_fn"):  # sys.exit() there fails this model only
        profile = profiler.profile(model_file.model, model_file.example_inputs, loss_fn=model_file.loss_fn,
                                   granularity=spec.granularity, times_cache=cache)
    searched = parse_granularity(spec.granularity) == "auto"  # as planner.plan: the profiler's choice
    finer = tuple((p.granularity, p.graph) for p in profile.finer()) if searched else ()
    return Profiled(
        model_class=type(model_file.model).__name__, graph=profile.graph,
        tangent_outputs=tuple(profile.joint.loss.tangent_outputs),
        tangent_specs=tuple(profile.joint.loss.tangent_specs), inputs=tuple(profile.joint.layout.signature),
        granularity=profile.granularity, device=profile.device, seconds=profile.seconds,
        cached=bool(cache is not None and cache.hits), finer=finer,
    )


@_busy
def solve_run(run: Run, profiled: Profiled) -> Outcome:
    """Plan one budget x solver on a profiled model for the traced executor (what planner.plan does for
    executor="traced" on the same profile); failures become an Outcome, never an exception."""
    from profiler.api import parse_granularity

    from ..api import BudgetInfeasible, plan_from_profile

    started = time.perf_counter()
    try:
        made = plan_from_profile(profiled.as_profile(), run.budget, solver=run.solver, time_limit=run.model.time_limit,
                                 finer=parse_granularity(run.model.granularity) == "auto",
                                 model_name=profiled.model_class)
    except BudgetInfeasible as error:
        unplanned = _unplanned_peak(profiled.graph)
        return Outcome(INFEASIBLE, method=error.method or run.solver, executor="traced",
                       error=str(error).strip().splitlines()[0],
                       budget_bytes=run.budget.resolve(unplanned), unplanned_peak_bytes=unplanned,
                       min_budget_bytes=error.min_budget, solve_seconds=time.perf_counter() - started)
    except TimeoutError as error:  # the solver's words are about activation bytes: say the user's budget first
        limit = f"{run.model.time_limit:g} s" if run.model.time_limit else "the solver's default time limit"
        detail = " ".join(getattr(error, "detail", str(error)).split())  # planner.api.PlanTimeout: the solver's
        return Outcome(ERROR, method=run.solver, executor="traced",
                       error=f"no schedule within budget {run.budget} found in {limit}"
                       + (f" ({detail})" if detail else ""), solve_seconds=time.perf_counter() - started)
    except Exception as error:  # a solver failure is this run's failure; the sweep goes on
        return Outcome(ERROR, method=run.solver, executor="traced", error=describe(error),
                       solve_seconds=time.perf_counter() - started)
    made.profile = None  # a stand-in without a trace: the plan is saved, never applied
    info = made.schedule.info
    return Outcome(
        status=info.status, method=info.method, executor="traced", error="", budget_bytes=made.budget_bytes,
        predicted_peak_bytes=made.predicted_peak_bytes, unplanned_peak_bytes=made.unplanned_peak_bytes,
        fixed_bytes=made.fixed_bytes, predicted_seconds=made.predicted_seconds,
        unplanned_seconds=made.unplanned_seconds, predicted_overhead=made.predicted_overhead,
        solve_seconds=info.solve_seconds, gap=info.gap, plan=made.to_dict(),
    )


def _unplanned_peak(graph: nx.DiGraph) -> int:
    from solvers import simulate
    from solvers.store_all import store_all_schedule

    from ..footprint import held_besides_schedule

    return held_besides_schedule(graph) + simulate(graph, store_all_schedule(graph)).peak_bytes


def failed_profile(error: BaseException | str) -> Outcome:
    """The outcome of every run of a model that could not be loaded or profiled."""
    return Outcome(ERROR, error=error if isinstance(error, str) else describe(error))


def worker_setup(threads: int, sweep_pid: int) -> None:
    """In each worker process: share the cores between the jobs, leave Ctrl-C to the sweep (which
    stops its workers with SIGTERM, raised here as KeyboardInterrupt so that a solve unwinds), and exit
    when the sweep's process is gone. (Workers are children of the forkserver, not of the sweep, and
    an idle one would otherwise wait on its task queue for ever after the sweep is killed.)"""
    import signal
    import threading

    import torch

    torch.set_num_threads(max(1, threads))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _interrupted)  # the sweep was interrupted: stop this task, unwinding
    threading.Thread(target=_exit_with, args=(sweep_pid,), daemon=True, name="exit-with-sweep").start()


def _exit_with(pid: int, every: float = 0.5) -> None:
    while _alive(pid):
        time.sleep(every)
    os._exit(1)  # a result now would have no one to receive it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # killed but not yet reaped by its parent: a zombie is gone too
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
