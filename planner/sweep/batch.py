"""``plan-checkpoints batch CONFIG.yaml [--out DIR] [--jobs N]``: every model x budget x solver x
executor of a YAML file (docs/batch.md), one plan per run, a results table (CSV, Markdown) and a
plot per model.

How the work is scheduled: for its traced runs each model is profiled once, and those runs are
solved from that profile, in parallel over ``--jobs`` worker processes. A native run plans and
measures the model itself (planner/sweep/native_runs.py), its op times from the profile cache after
the model's first. The tasks that time a model (a profile, a native run) go one at a time, so that
one model is not timed while another is; runs of a profiled model go before the next timed task,
so results arrive model by model. Finished runs are never redone: each writes its plan and then its
record atomically, and a run with a record for its current settings is skipped.

Exit status: 0 when every run made a plan, 1 when any run failed (its status and error are in the
table), 2 for a sweep file that cannot be run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from ..cli.progress import Progress
from .reports import Results, failures
from .config import ModelSpec, Run, Sweep, load_sweep
from .executors import solver_label
from .native_runs import plan_native_run
from .tasks import OK_STATUSES, Outcome, Profiled, failed_profile, profile_model, solve_run, worker_setup

EXIT_FAILED_RUNS = 1


class BatchUsageError(ValueError):
    """A bad command line for ``batch``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other error of the tool
        raise BatchUsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plan-checkpoints batch",
                     description="Plan every model x budget x solver x executor of a YAML sweep file (docs/batch.md).")
    parser.add_argument("config", help="the sweep's YAML file")
    parser.add_argument("--out", default=None, help="output folder (default: CONFIG's name + '-results', here)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes solving in parallel (default: 1)")
    parser.add_argument("--cache-dir", default=None,
                        help="where measured op times are kept between sweeps (default: OUT/.profile-cache)")
    parser.add_argument("--no-cache", action="store_true", help="time every model afresh and keep nothing")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again (finished ones are kept)")
    from ..cli.verbosity import add_verbosity

    add_verbosity(parser)
    return parser


# -- executors ------------------------------------------------------------------------------------
class InlineExecutor(Executor):
    """``--jobs 1``: run each task in this process when it is submitted."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


POOL_USED = False  # worker processes were started (planner/cli/command.py then lets the interpreter exit normally)


def _pool(jobs: int) -> Executor:
    global POOL_USED
    if jobs == 1:
        return InlineExecutor()
    POOL_USED = True
    # forkserver: workers fork from a clean process that has imported torch once; never from this
    # one (forking a process that may hold threads is unsafe, spawning re-imports torch per worker).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["planner.sweep.tasks", "planner.sweep.native_runs", "torch"])
    threads = max(1, (os.cpu_count() or 1) // jobs)
    return ProcessPoolExecutor(jobs, mp_context=context, initializer=worker_setup, initargs=(threads, os.getpid()))


# -- the scheduler ----------------------------------------------------------------------------------
@dataclass
class _Task:
    kind: str  # "profile" (for the traced runs), "run" (a traced run) or "native" (a native run)
    model: ModelSpec
    run: Run | None = None


@dataclass
class SweepState:
    sweep: Sweep
    results: Results
    progress: Progress
    total: int
    done: int
    profiles: dict[str, Profiled] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)  # ids of the runs this invocation did

    def finish(self, run: Run, outcome: Outcome) -> None:
        self.results.write(run, outcome, self.profiles.get(run.model.name))
        self.done += 1
        self.ran.append(run.id)
        self.progress.note(f"[{self.done}/{self.total} done] {_describe_run(run)}: {_describe_outcome(outcome)}")


TIMED = ("profile", "native")  # the tasks that time the model: one at a time


def _describe_run(run: Run) -> str:
    return f"{run.model.name} at {run.budget} with {solver_label(run.solver, run.executor.name)}"


def _describe_outcome(outcome: Outcome) -> str:
    if outcome.status not in OK_STATUSES:
        return f"{outcome.status}: {outcome.error}"
    from ..budget import format_bytes

    method = f" ({outcome.method})" if outcome.method else ""
    measured = (f" (measured {format_bytes(outcome.measured_peak_bytes)})"
                if outcome.measured_peak_bytes is not None else "")
    notes = "".join(f"; {note}" for note in outcome.notes)
    return (f"{outcome.status}{method}, peak {format_bytes(outcome.predicted_peak_bytes)}{measured}, overhead "
            f"{outcome.predicted_overhead:+.1%}, solved in {outcome.solve_seconds:.2f} s{notes}")


def timed_tasks(models: tuple[ModelSpec, ...], todo: list[Run]) -> deque[_Task]:
    """The tasks that time a model, in the sweep's order: each model's profile (when it has traced
    runs to do), then its native runs."""
    tasks: deque[_Task] = deque()
    for model in models:
        mine = [run for run in todo if run.model.name == model.name]
        if any(run.executor.name == "traced" for run in mine):
            tasks.append(_Task("profile", model))
        tasks.extend(_Task("native", model, run) for run in mine if run.executor.name == "native")
    return tasks


def execute(state: SweepState, todo: list[Run], jobs: int, cache_dir: str | None) -> None:
    """Profile each model with traced runs to do, then solve them, and plan its native runs; at most
    ``jobs`` tasks at a time, and one of them timing a model. Without a cache folder (--no-cache),
    the native runs share a temporary one, removed at the end: a model is timed once per sweep."""
    if cache_dir is None and any(run.executor.name == "native" for run in todo):
        with tempfile.TemporaryDirectory(prefix="plan-checkpoints-times-") as temporary:
            return _execute(state, todo, jobs, None, temporary)
    return _execute(state, todo, jobs, cache_dir, cache_dir)


def _execute(state: SweepState, todo: list[Run], jobs: int, cache_dir: str | None, native_cache_dir: str | None):
    timed = timed_tasks(state.sweep.models, todo)
    ready: deque[Run] = deque()
    waiting = {task.model.name: [r for r in todo if r.model.name == task.model.name and r.executor.name == "traced"]
               for task in timed if task.kind == "profile"}
    in_flight: dict[Future, _Task] = {}
    executor = _pool(jobs)
    try:
        while timed or ready or in_flight:
            while len(in_flight) < jobs:
                if ready:
                    run = ready.popleft()
                    state.progress.note(f"Solving {_describe_run(run)}...")
                    future = executor.submit(solve_run, run, state.profiles[run.model.name])
                    in_flight[future] = _Task("run", run.model, run)
                elif timed and not any(t.kind in TIMED for t in in_flight.values()):
                    task = timed.popleft()
                    if task.kind == "profile":
                        state.progress.note(f"Profiling {task.model.name} ({task.model.file})...")
                        future = executor.submit(profile_model, task.model, state.sweep.device, cache_dir)
                    else:
                        state.progress.note(f"Planning {_describe_run(task.run)}: profiling, solving and measuring...")
                        future = executor.submit(plan_native_run, task.run, native_cache_dir)
                    in_flight[future] = task
                else:
                    break
            finished, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            broken = False
            for future in finished:
                task = in_flight.pop(future)
                error = future.exception()
                broken = broken or isinstance(error, BrokenProcessPool)
                if task.kind == "profile":
                    if error is not None:
                        reason = _worker_died(error) or error
                        state.progress.note(f"{task.model.name}: could not be profiled: {failed_profile(reason).error}")
                        for run in waiting.pop(task.model.name):
                            state.finish(run, failed_profile(reason))
                        continue
                    profiled: Profiled = future.result()
                    state.profiles[task.model.name] = profiled
                    where = "op times from the profile cache" if profiled.cached else "timed"
                    state.progress.note(f"Profiled {task.model.name}: {profiled.graph.number_of_nodes()} nodes "
                                        f"({profiled.granularity}, {where}) in {profiled.seconds:.1f} s")
                    ready.extend(waiting.pop(task.model.name))
                else:
                    outcome = failed_profile(_worker_died(error) or error) if error is not None else future.result()
                    state.finish(task.run, outcome)
            if broken:  # a worker died (killed, out of memory): the pool cannot be used again
                executor.shutdown(wait=False, cancel_futures=True)
                for task in list(in_flight.values()):
                    if task.kind == "run":
                        ready.appendleft(task.run)
                    else:
                        timed.appendleft(task)
                in_flight.clear()
                executor = _pool(jobs)
    except KeyboardInterrupt:  # Ctrl-C: the runs in progress are abandoned, unrecorded
        _stop_workers(executor)
        in_flight.clear()
        raise
    finally:
        executor.shutdown(wait=not in_flight, cancel_futures=True)


def _stop_workers(executor: Executor) -> None:
    """Stop the workers' tasks now: they ignore SIGINT (a Ctrl-C goes to the whole process group, and
    the sweep decides), and would finish their solves first. SIGTERM makes a worker's running task
    raise KeyboardInterrupt (tasks.worker_setup); the pool's shutdown then ends every worker
    cleanly, its queues and semaphores released."""
    for process in list((getattr(executor, "_processes", None) or {}).values()):  # none for --jobs 1
        try:
            process.terminate()
        except (OSError, ValueError, AttributeError):
            pass


def _worker_died(error: BaseException) -> str | None:
    if isinstance(error, BrokenProcessPool):
        return "the worker process died while on this task (killed, or out of memory?)"
    return None


# -- the command ------------------------------------------------------------------------------------
def _default_out(config: str) -> str:
    return f"{os.path.splitext(os.path.basename(config))[0]}-results"


def _check_folders(sweep: Sweep, out: str, cache_dir: str | None) -> None:
    """--out and --cache-dir before any work: folders (or to be made), writable, and no file the sweep
    writes is its sweep file or one of its model files."""
    from ..files import WriteError, check_output

    inputs = [sweep.path, *(m.file for m in sweep.models)]
    for folder, option in ((out, "--out"), (cache_dir, "--cache-dir")):
        if folder is None:
            continue
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise WriteError(folder, f"it is a file, not a folder; {option} names the folder the sweep writes into")
        for name in ("results.csv", "results.md") if option == "--out" else ("probe",):
            check_output(os.path.join(folder, name), inputs=inputs, option=option)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        raise BatchUsageError(f"--jobs must be at least 1, got {args.jobs}")
    from ..cli.verbosity import setup_logging

    setup_logging(args.verbose)
    sweep = load_sweep(args.config)  # every error in the file before any work
    out = args.out or _default_out(args.config)
    cache_dir = None if args.no_cache else (args.cache_dir or os.path.join(out, ".profile-cache"))
    _check_folders(sweep, out, cache_dir)
    # Absolute before any model file runs: its code may change the working folder (os.chdir).
    results = Results(os.path.abspath(out))
    cache_dir = os.path.abspath(cache_dir) if cache_dir else None
    results.remove_temporaries()
    todo = [run for run in sweep.runs if not results.is_done(run, args.retry_failed)]
    progress = Progress(enabled=not args.quiet)
    already = len(sweep.runs) - len(todo)
    progress.note(f"Sweep {args.config}: {len(sweep.runs)} runs over {len(sweep.models)} models"
                  + (f", {already} already done in {out}" if already else "") + f"; {args.jobs} job(s)")
    state = SweepState(sweep, results, progress, total=len(sweep.runs), done=already)
    execute(state, todo, min(args.jobs, max(1, len(todo))), cache_dir)
    rows = results.write_tables(sweep)
    plots = results.write_plots(sweep)
    failed = failures(rows)
    planned = len(rows) - sum(failed.values())
    reused = f" ({already} from an earlier sweep)" if already else ""
    summary = (f"{len(rows)} runs: {planned} planned{reused}"
               + (", " + ", ".join(f"{count} {status}" for status, count in sorted(failed.items())) if failed else "")
               + f"; table {os.path.join(out, 'results.md')}, {len(plots)} plot(s) in {os.path.join(out, 'plots')}")
    print(summary)
    if failed:
        for row in rows:
            if row["status"] not in OK_STATUSES:
                print(f"plan-checkpoints: {row['model']} at {row['budget']} with {solver_label(row['solver'], row['executor'])}: "
                      f"{row['status']}: {row['error']}", file=sys.stderr)
        return EXIT_FAILED_RUNS
    return 0
