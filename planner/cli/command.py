"""``plan-checkpoints``: plan a model file's training step against a memory budget.

    plan-checkpoints MODEL.py --budget 12GB [--solver auto|...] [--device cpu|cuda]
                     [--out plan.json] [--json] [--time-limit SECONDS]
                     [--max-batch [--max-overhead 0.3]] [-v | -q]
    plan-checkpoints batch CONFIG.yaml [--out DIR] [--jobs N]      (planner/sweep/batch.py)
    plan-checkpoints show plan.json [--out memory.png]             (planner/cli/show.py)
    plan-checkpoints --version;  python -m planner ... (the same)

Exit status: 0 on success, 2 for a usage error or a bad model file, budget, plan file, sweep file
or output path, 3 when the budget is below the minimum the solver can reach (the message gives that
minimum) or the device ran out of memory while the planner profiled or measured the step, 4 when
the solver found no schedule within --time-limit, 130 when interrupted (Ctrl-C; nothing is
written); ``batch`` exits with 1 when any of its runs failed. Every error is one line on stderr,
``plan-checkpoints: error: ...``; with ``--json`` it is also a JSON object on stdout,
``{"error": ..., "exit_status": N}``. Output paths are checked before any work, and an output path
that is one of the inputs is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings

from .verbosity import add_verbosity, setup_logging

EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

USAGE = """plan-checkpoints MODEL.py --budget BUDGET [options]   plan one model file's training step
       plan-checkpoints batch CONFIG.yaml [--out DIR] [--jobs N] ...   plan a YAML sweep (docs/batch.md)
       plan-checkpoints show plan.json [--out memory.png]   describe a saved plan
       plan-checkpoints --version"""


def _methods() -> list[str]:
    from solvers import METHODS

    # regions: the native executor's exact search (solvers/native, planner/native_solve.py), listed once
    return ["auto", *dict.fromkeys(["regions", *METHODS])]


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("plan-checkpoints")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump, like every other error of the tool
        raise _UsageError(message)


class _UsageError(Exception):
    pass


GRANULARITY_FORMS = "'module' (the default: the profiler's choice, finer groupings searched too), 'module:N' (N >= 1) or 'op'"


def _granularity(text: str) -> str:
    """profiler.api.parse_granularity's string forms, checked without importing torch."""
    if text in ("op", "module", "auto"):
        return text
    if text.startswith("module:") and text[7:].isdigit() and int(text[7:]) >= 1:
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a granularity; accepted: {GRANULARITY_FORMS}")


def _time_limit(text: str) -> float:
    """A time limit as solvers.options.check_time_limit accepts it (finite, at most a week)."""
    from solvers.options import TIME_LIMIT_FORMS, check_time_limit

    try:
        return check_time_limit(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time limit; give {TIME_LIMIT_FORMS} (e.g. 30)") from None


def _plan_parser() -> argparse.ArgumentParser:
    from planner.budget import ACCEPTED_FORMS

    parser = _Parser(
        prog="plan-checkpoints",
        usage=USAGE,
        description="Plan activation checkpointing for a model file's training step under a memory budget.",
        epilog="Other commands: 'plan-checkpoints batch CONFIG.yaml' (--help for its options), "
               "'plan-checkpoints show plan.json'. Exit status: 0 planned, 2 a bad argument, model file or "
               "output path, 3 the budget is below the minimum (or out of memory while planning), 4 no schedule "
               "within --time-limit, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"plan-checkpoints {version()}")
    parser.add_argument("model", help="model file defining build_model() and example_inputs()")
    parser.add_argument("--budget", required=True,
                        help=f"peak memory of the whole step on one device (with several processes, each "
                             f"rank's own; with --optimizer, of the whole iteration): {ACCEPTED_FORMS}".replace("%", "%%"))  # argparse formats help with %
    parser.add_argument("--device-memory", default=None,
                        help="bytes the device holds for the step (a size: 8GiB, 8000000000); a larger budget is "
                             "refused, and profiling holds at most the lower of the two (default: the free memory "
                             "on CUDA, an address-space limit's on CPU, else none)")
    parser.add_argument("--solver", default="auto", choices=_methods(), help="solver (default: auto)")
    parser.add_argument("--executor", default=None, choices=["native", "traced"],
                        help="what runs the plan: native (torch.utils.checkpoint on the model's modules; the default "
                             "with --solver auto or regions) or traced (the profiled graph's schedule replayed; the "
                             "default with any other solver)")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"], help="device to profile on (default: where build_model puts it)")
    parser.add_argument("--out", default="plan.json", help="where to write the plan (default: plan.json); never one of the inputs")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of text (errors too)")
    parser.add_argument("--time-limit", type=_time_limit, default=None, help="seconds the solver may search")
    parser.add_argument("--profile-time-limit", type=_time_limit, default=None,
                        help="seconds profiling the model may take (default: no limit); past it, exit status 4")
    parser.add_argument("--model-fn", default="build_model", help="function building the model (default: build_model)")
    parser.add_argument("--inputs-fn", default="example_inputs", help="function giving example inputs (default: example_inputs)")
    parser.add_argument("--granularity", default="module", type=_granularity,
                        help=GRANULARITY_FORMS.replace("%", "%%"))
    parser.add_argument("--max-batch", action="store_true",
                        help="find the largest batch size (dimension 0 of every tensor input) whose plan fits the "
                             "budget, and write that plan")
    parser.add_argument("--optimizer", default=None, type=_optimizer,
                        help="count the training iteration's optimizer in the budget (its state through forward and "
                             "backward, its step's temporaries after them): budget, figures and N%% are then of the "
                             "whole iteration; one of " + _optimizer_names() + " (default: the step alone)")
    parser.add_argument("--optimizer-fn", default=None, metavar="NAME",
                        help="as --optimizer, with the optimizer a function of the model file builds: NAME(model) "
                             "returns a torch.optim.Optimizer over the model's parameters (its class, "
                             "hyper-parameters and param groups are counted)")
    parser.add_argument("--max-overhead", default=None, type=_overhead,
                        help="with --max-batch: the most predicted overhead allowed, as a fraction or a "
                             "percentage (0.3 or 30%%; default: any)")
    add_verbosity(parser)
    return parser


def _optimizer_names() -> str:
    from planner.optimizer import IMPLEMENTATIONS, OPTIMIZER_NAMES

    return ", ".join(OPTIMIZER_NAMES) + ", each optionally with :" + ", :".join(IMPLEMENTATIONS) + " (e.g. adamw:fused)"


def _optimizer(text: str) -> str:
    from planner.optimizer import optimizer_problem

    problem = optimizer_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} is not an optimizer name; accepted: {_optimizer_names()}")
    return text.strip().lower()


def _overhead(text: str) -> float:
    """'0.3' or '30%' -> 0.3."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):  # nan fails too
        raise argparse.ArgumentTypeError(f"{text!r} is not an overhead; give a fraction or a percentage >= 0 "
                                         "(0.3 or 30%: at most 30% slower than without checkpointing)")
    return value


def _summary_json(plan, out: str) -> dict:
    info = plan.schedule.info
    return {
        "plan": out,
        "budget_bytes": plan.budget_bytes,
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "unplanned_peak_bytes": plan.unplanned_peak_bytes,
        "fixed_bytes": plan.fixed_bytes,
        "predicted_overhead": plan.predicted_overhead,
        "predicted_seconds": plan.predicted_seconds,
        "unplanned_seconds": plan.unplanned_seconds,
        "solver": info.method,
        "status": info.status,
        "gap": info.gap,
        "solve_seconds": info.solve_seconds,
        "nodes": plan.graph.number_of_nodes(),
        "recomputed_nodes": len(plan.recomputed()),
        "message": info.message,
        "figures": "measured" if getattr(plan, "fallback", "") else "predicted",
        "fallback": getattr(plan, "fallback", "") or None,
        "optimizer": getattr(plan, "optimizer", None),
        "executor": getattr(plan, "executor", "fallback" if getattr(plan, "fallback", "") else "traced"),
        "executor_notice": plan.executor_notice or None,  # why the planner chose it (planner/executor_choice.py)
        "unrestricted_seconds": plan.unrestricted_seconds,  # the order-free bound (planner/unrestricted.py)
        "unrestricted_note": plan.unrestricted_note or None,
    }


def _join_negative_budget(argv: list[str]) -> list[str]:
    """``--budget -5GB``: argparse would take -5GB for an option; pass it on so that the budget
    parser can say what is wrong with it."""
    joined = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--budget" and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1][1:2].isdigit():
            joined.append(f"--budget={argv[i + 1]}")
            skip = True
        else:
            joined.append(arg)
    return joined


def run_plan(argv: list[str]) -> int:
    from planner.budget import parse_budget

    args = _plan_parser().parse_args(_join_negative_budget(argv))
    if args.max_batch and (args.executor == "native" or args.solver == "regions"):  # before loading the model
        given = "--executor native" if args.executor == "native" else "--solver regions"
        raise _UsageError(f"--max-batch plans traced plans only (it predicts the traced graph's costs at other batch "
                          f"sizes): leave out {given}, or plan native regions without --max-batch at the batch size "
                          "you choose")
    if args.max_overhead is not None and not args.max_batch:
        raise _UsageError("--max-overhead goes with --max-batch (the overhead the largest batch may cost)")
    if args.optimizer is not None and args.optimizer_fn is not None:
        raise _UsageError("--optimizer and --optimizer-fn both name the optimizer: give one of them")
    if (args.optimizer is not None or args.optimizer_fn is not None) and args.max_batch:
        raise _UsageError("--optimizer is not counted by --max-batch (its plans are traced); plan a batch size "
                          "without --max-batch to count the optimizer")
    setup_logging(args.verbose)
    # Every mistake in the arguments before any work, and before importing torch: the budget, the
    # model file's path, the output path (never one of the inputs; its folder writable).
    budget = parse_budget(args.budget)
    device_memory = _device_memory(args.device_memory, budget)
    from planner.files import check_output
    from planner.cli.modelfile import check_model_path

    model_path = check_model_path(args.model)
    check_output(args.out, inputs=[model_path])
    # Absolute now: the model file's code may change the working folder (os.chdir at import).
    out_path = os.path.abspath(args.out)
    from planner.cli.modelfile import guarded, load_model_file
    from planner.cli.progress import Progress

    progress = Progress(enabled=not args.quiet)
    # With --json, stdout is the JSON alone: what the model file's code prints goes to stderr.
    user_output = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with user_output:
        with progress.task(f"Loading {args.model}"):
            model_file = load_model_file(model_path, args.model_fn, args.inputs_fn, args.device,
                                         optimizer_fn=args.optimizer_fn)
        # The model's forward and loss run from here on (profiling, the eager recording's measurements): a
        # sys.exit() or os._exit() in them is the model file's error, not the end of the command.
        with guarded(model_path, "in the model's forward or loss_fn"):
            try:
                if args.max_batch:
                    from planner.cli.maxbatch import find_max_batch

                    found = find_max_batch(model_file.model, model_file.example_inputs, budget, solver=args.solver,
                                           max_overhead=args.max_overhead, loss_fn=model_file.loss_fn,
                                           time_limit=args.time_limit, granularity=args.granularity, progress=progress,
                                           inputs_at=model_file.inputs_at, device_memory=device_memory)
                    plan = found.plan
                else:
                    found = None
                    plan = _make_plan(args, model_file, budget, progress, device_memory)
            except TimeoutError as error:
                raise _out_of_time(error, args) from None
    plan.save(out_path)
    if found is not None:
        return _report_max_batch(args, found)
    if args.json:
        print(json.dumps(_summary_json(plan, args.out), indent=1))
    else:
        print(plan.summary())
        print(f"Plan written to {args.out}")
    return 0


def _device_memory(text: str | None, budget) -> int | None:
    """--device-memory in bytes (checked before importing torch), and a byte budget above it refused."""
    from planner.budget import BudgetError, format_bytes, parse_budget

    if text is None:
        return None
    try:
        parsed = parse_budget(text)
    except BudgetError:
        parsed = None
    if parsed is None or parsed.bytes is None:
        raise _UsageError(f"--device-memory {text!r} is not a size; give a whole number of bytes or a size with a unit "
                          "(8GB = 8*10^9 bytes, 8GiB = 8*2^30 bytes; also MB/MiB, TB/TiB)")
    if budget.bytes is not None and budget.bytes > parsed.bytes:
        raise _UsageError(f"budget {budget} ({format_bytes(budget.bytes)}) is above --device-memory {text} "
                          f"({format_bytes(parsed.bytes)}): a plan for it could not run there; give a budget within "
                          "the device's memory")
    return parsed.bytes


def _make_plan(args, model_file, budget, progress, device_memory: int | None = None):
    import profiler
    from planner import api
    from planner.bounded import check_within_device, device_memory_of, profiling_bound

    from planner.cli.timebound import time_bound

    device_memory = device_memory_of(model_file.model, model_file.example_inputs, device_memory)
    check_within_device(budget, budget.bytes, device_memory)
    untraceable = None
    bound = f"profiling took longer than --profile-time-limit {args.profile_time_limit:g} s" \
        if args.profile_time_limit else ""
    with progress.task(f"Profiling {type(model_file.model).__name__}"), time_bound(args.profile_time_limit, bound):
        try:
            profile = api.profile_for(model_file.model, model_file.example_inputs, loss_fn=model_file.loss_fn,
                                      granularity=args.granularity, solver=args.solver, executor=args.executor,
                                      memory_bound=profiling_bound(budget, device_memory))
        except profiler.TraceError as error:  # planner/untraced.py: a native plan from an eager step instead
            untraceable = error
    optimizer = args.optimizer if args.optimizer is not None else model_file.optimizer
    if untraceable is not None:
        os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the measuring profiler's start/stop lines
        with progress.task("Could not trace the model; recording an eager step and planning on it"):
            return api.plan_untraceable(model_file.model, model_file.example_inputs, budget,
                                        loss_fn=model_file.loss_fn, reason=untraceable.reason,
                                        time_limit=args.time_limit, device_memory=device_memory,
                                        optimizer=optimizer)
    limit = f" (time limit {args.time_limit:g} s)" if args.time_limit else ""
    _import_backend(args.solver)
    with progress.task(f"Solving with {args.solver}{limit}"):
        return api.plan(model_file.model, model_file.example_inputs, budget, solver=args.solver,
                        time_limit=args.time_limit, profile=profile, executor=args.executor,
                        optimizer=optimizer, device_memory=device_memory)


# The libraries behind the searching solvers, imported before the "Solving" line: a Ctrl-C that lands
# in the middle of a library's import can surface as its ImportError ("needs OR-tools"), not as an
# interruption.
_BACKENDS = {"cpsat": "ortools.sat.python.cp_model", "ilp": "highspy"}


def _import_backend(solver: str) -> None:
    import importlib

    name = _BACKENDS.get(solver)
    if name is not None:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the solver says what is missing, in its own words


class _OutOfTime(TimeoutError):
    pass


def _out_of_time(error: TimeoutError, args) -> TimeoutError:
    """The solver's own words are about the activations it schedules; say first what the user asked."""
    from planner.cli.timebound import PhaseTimeout

    if isinstance(error, (_OutOfTime, PhaseTimeout)):
        return error
    limit = f"--time-limit {args.time_limit:g} s" if args.time_limit else "its default time limit"
    detail = " ".join(getattr(error, "detail", str(error)).split())  # planner.api.PlanTimeout: the solver's words
    return _OutOfTime(f"solver {args.solver} found no schedule within budget {args.budget} in {limit}"
                      + (f" ({detail})" if detail else ""))


def _report_max_batch(args, found) -> int:
    profiled = ", ".join(str(b) for b in found.profiled)
    line = (f"Largest batch size: {found.batch_size} (the example inputs have {found.example_batch_size}); "
            f"profiled at {profiled}, {found.solves} predicted plans searched")
    if args.json:
        summary = _summary_json(found.plan, args.out)
        summary.update(batch_size=found.batch_size, example_batch_size=found.example_batch_size,
                       profiled_batch_sizes=found.profiled, max_overhead=args.max_overhead)
        print(json.dumps(summary, indent=1))
    else:
        print(line)
        print(found.plan.summary())
        print(f"Plan for batch size {found.batch_size} written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        code = _main(argv)
    batch = sys.modules.get("planner.sweep.batch")
    pooled = getattr(batch, "POOL_USED", False)  # --jobs N: the solves ran in worker processes, now ended
    if code == EXIT_INTERRUPTED and argv is None and not pooled:  # the command itself, not a call from Python
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """After Ctrl-C, once the error is printed and every file written or removed: end the process
    without the interpreter's teardown, where a native solver's thread that is still winding down
    (CP-SAT) can abort the process ("terminate called without an active exception", status -6)
    instead of letting it exit with 130."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    modelfile = sys.modules.get("planner.cli.modelfile")
    (modelfile._REAL_EXIT if modelfile is not None else os._exit)(code)


def _one_line_warnings(show):
    """The tool's own warnings (the fallback's FallbackWarning, a plan's PlanWarning) as one line
    each, like its errors; any other warning goes where it went before."""

    def show_warning(message, category, filename, lineno, file=None, line=None):
        ours = []
        for module_name, class_name in (("planner.fallback", "FallbackWarning"), ("planner.planfile", "PlanWarning")):
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, class_name):
                ours.append(getattr(module, class_name))
        if ours and issubclass(category, tuple(ours)):
            print(f"plan-checkpoints: warning: {' '.join(str(message).split())}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


# Errors that are the user's to fix: (module, class, exit status). A class can only have been raised
# if its module was imported, so they are looked up in sys.modules, and nothing here imports torch.
_USER_ERRORS = [
    ("planner.api", "BudgetInfeasible", EXIT_INFEASIBLE),
    ("planner.budget", "BudgetError", EXIT_USAGE),
    ("planner.bounded", "DeviceMemoryError", EXIT_USAGE),
    ("profiler.oom", "OutOfMemory", EXIT_INFEASIBLE),
    ("planner.api", "SolverError", EXIT_USAGE),
    ("solvers.errors", "SolverUnavailable", EXIT_USAGE),
    ("planner.cli.modelfile", "ModelFileError", EXIT_USAGE),
    ("planner.planfile", "PlanFileError", EXIT_USAGE),
    ("planner.files", "WriteError", EXIT_USAGE),
    ("profiler.capture", "CaptureError", EXIT_USAGE),
    ("profiler.inputs", "InputMismatch", EXIT_USAGE),
    ("planner.sweep.batch", "BatchUsageError", EXIT_USAGE),
    ("planner.cli.maxbatch", "MaxBatchError", EXIT_USAGE),
    ("planner.cli.show", "ShowUsageError", EXIT_USAGE),
    ("planner.sweep.config", "ConfigError", EXIT_USAGE),
    ("planner.optimizer", "OptimizerSpecError", EXIT_USAGE),
    ("profiler.optimizer", "OptimizerError", EXIT_USAGE),
]


def _user_error(error: BaseException) -> tuple[int, str] | None:
    """(exit status, message) for a user's mistake, None for anything else (a bug: keep the traceback)."""
    if isinstance(error, _UsageError):
        return EXIT_USAGE, str(error)
    for module_name, class_name, code in _USER_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(error, getattr(module, class_name)):
            return code, str(error)
    if isinstance(error, TimeoutError):  # before OSError, of which it is a subclass
        return EXIT_TIMEOUT, (f"{error}; give the solver more time (--time-limit) or choose a faster one "
                              "(chen-greedy, dp)")
    if isinstance(error, OSError) and error.filename is not None:  # a file the user named
        return EXIT_USAGE, f"{error.filename}: {error.strerror}"
    return None


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _report(message: str, code: int, as_json: bool) -> int:
    message = _one_line(message)
    print(f"plan-checkpoints: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_status": code}))
    return code


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv and (not argv or argv[0] not in ("batch", "show"))
    try:
        if argv and argv[0] == "batch":
            from planner.sweep.batch import main as batch_main

            return batch_main(argv[1:])
        if argv and argv[0] == "show":
            from planner.cli.show import main as show_main

            return show_main(argv[1:])
        return run_plan(argv)
    except KeyboardInterrupt:
        if argv and argv[0] == "batch":
            return _report("interrupted (Ctrl-C); finished runs are recorded, the runs in progress are not: run the "
                           "same command again to finish the sweep", EXIT_INTERRUPTED, as_json)
        return _report("interrupted (Ctrl-C); nothing was written", EXIT_INTERRUPTED, as_json)
    except BrokenPipeError:  # stdout closed early (``| head``): stop quietly, as other tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + 13  # killed by SIGPIPE, as a shell reports it
    except Exception as error:
        known = _user_error(error)
        if known is None:
            raise
        code, message = known
        return _report(message, code, as_json)


if __name__ == "__main__":
    sys.exit(main())
