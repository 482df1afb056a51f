"""The Python API: ``plan``, ``plan_from_profile``, ``checkpoint``, ``apply``, ``load`` (docs/contract.md, "The Python API")."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

import profiler
import runtime
from runtime.hf_cache import cache_off_while_planning
from profiler.api import parse_granularity
from profiler.oom import reported_out_of_memory
from profiler.state import cuda_devices
from solvers import Infeasible, SolverTimeout, simulate
from solvers.options import check_time_limit
from solvers.store_all import store_all_schedule

from .bounded import check_within_device, device_memory_of, parse_device_memory, profiling_bound
from .executor_choice import executor_choice, planned
from .budget import format_bytes, parse_budget
from .fallback import FallbackWarning, ModuleChainPlan
from .measured import measure_planned_step
from .footprint import held_besides_schedule
from .granularity import methods_on_finer_groupings, noted, solve_over_groupings
from .least import refusal_below_floor
from .native import distributed_problem, plan_native
from .native_plan import NativePlan
from .native_request import native_profile
from .fsdp2_exact import is_fsdp2, plan_fsdp2
from .sharded import is_meta_model, plan_sharded
from .attached import NoPlan, attach, plan_of
from .autocast import planning_under
from .optimizer import OptimizerSpecError, optimizer_problem
from .untraced import is_eager, plan_untraced
from .unrestricted import with_unrestricted_bound
from .loading import load
from .planfile import Plan, PlanWarning, profile_fields
from .repair import lower_by_miss_and_excess, measure_and_repair
from .trainmode import NOTE as TRAINING_NOTE
from .trainmode import training_step
from .unplannable import unplannable_reason

__all__ = ["BudgetInfeasible", "EXECUTORS", "profile_for", "FallbackWarning", "NativePlan", "NoPlan", "PlanTimeout",
           "SolverError", "Plan", "apply", "checkpoint", "load", "plan", "plan_of", "plan_from_profile",
           "plan_untraceable"]

# native: torch.utils.checkpoint on the model's own modules (the default); traced: the profiled
# graph's schedule replayed by runtime/module.py (any schedule, any solver).
EXECUTORS = ("native", "traced")
NATIVE_SOLVERS = ("auto", "regions")


class BudgetInfeasible(Infeasible):
    """The budget is below what the solver can reach. ``min_budget`` is in bytes of the whole step
    (parameters, buffers and inputs included), comparable with the budget the user gave."""


class PlanTimeout(SolverTimeout):
    """The time limit passed before the solver found a schedule within the user's budget. The
    message quotes the budget as the user gave it (whole-step bytes); ``detail`` is the solver's own
    words, whose byte figures are of the activations alone, with the bytes held besides them, so
    that the command line and sweeps can put it after their own first words."""

    def __init__(self, message: str, detail: str, method: str | None = None):
        super().__init__(message, method=method)
        self.detail = detail


class SolverError(ValueError):
    """The solver refused the problem as asked (an unknown method, a bad time limit, a graph too
    large for the method); the message says why and, where there is one, what to use instead."""


def plan(
    model: torch.nn.Module,
    example_inputs,
    budget="100%",
    solver: str = "auto",
    loss_fn: Callable | None = None,
    time_limit: float | None = None,
    granularity="module",
    profile: profiler.Profile | None = None,
    executor: str | None = None,
    distributed: str | None = None,
    compile: bool = False,
    optimizer=None,
    device_memory=None,
    autocast=None,
) -> Plan:
    """Profile ``model``'s training step on ``example_inputs`` and solve for ``budget``.

    ``executor`` says what will run the plan. ``"native"`` (the default with ``solver="auto"`` or
    ``"regions"``): a :class:`NativePlan`, a set of the model's modules to wrap in non-reentrant
    ``torch.utils.checkpoint`` (planner/native.py), predicted from the trace and measured once on the
    example inputs. ``"traced"`` (the default with any other solver): any schedule of the profiled
    graph, run by replaying the trace (runtime/module.py); the solvers of ``solvers.METHODS``. With
    ``executor=None`` and ``solver="auto"``, a budget the native executor refuses and the traced one
    reaches gets the traced plan, with a :class:`PlanWarning` and ``Plan.executor_notice`` naming
    the native executor's least budget (planner/executor_choice.py).

    ``distributed`` (native plans) counts a wrapper's memory in the budget of each device:
    ``"ddp"``, DistributedDataParallel's gradient buckets (one copy of the trainable parameters);
    ``"fsdp2"`` (or ``planner.native.FSDP2(world_size, units)``), per-block ``fully_shard``: the
    shards, the gathered units and their collectives' buffers in place of the whole parameters
    (planner/native.py, wrapper_bytes and fsdp2_bytes). Plan and apply before wrapping.

    ``budget``: bytes of the whole step (``"12GB"``, ``"500MiB"``, an int) or a percentage of the
    un-checkpointed step's peak (``"60%"``). ``solver``: ``"auto"`` or a method of
    ``solvers.METHODS``. ``loss_fn(output) -> scalar`` is the loss to plan for (default: the sum of the
    output's floating-point tensors). ``time_limit`` (seconds) bounds the searching solvers.
    ``profile`` reuses an earlier :func:`profiler.profile` of the same model and inputs.
    ``granularity`` is the profiler's (``"module"``: its choice, ``"module:N"``, ``"op"``); with
    the default, the chain methods (``auto``'s fast planners, or the chain method asked for) also
    plan every finer grouping of the same measurements and the cheapest schedule wins
    (planner/granularity.py); the plan records the grouping it schedules.

    A budget out of reach is tried again on the trace whose cross-entropy backward recomputes its
    log-probabilities from the logits (profiler/fusions.py), with the same ``time_limit`` again; the
    plan records which trace it runs.
    Raises :class:`BudgetInfeasible` (with ``min_budget``, the lower of the two) when the budget
    cannot be met.

    ``compile=True`` (native executor only) prices the plan on the step as it will run compiled,
    ``torch.compile(planner.apply(model, plan))``: a :class:`planner.compiled.CompiledNativePlan`
    whose peak and step time are the compiled step's, measured (the model compiled with candidate
    regions checkpointed, a few compiles: planner/compiled.py), and a ``"N%"`` budget is N% of the
    compiled un-checkpointed step's measured peak. It calls ``torch._dynamo.reset()`` before each
    compile. ``BudgetInfeasible.min_budget`` is then the least compiled peak measured.

    A model whose forward the tracer cannot follow (Python control flow on tensor values,
    data-dependent shapes) gets a :class:`NativePlan` planned on its step recorded eagerly, whatever
    the executor asked for (no trace, no traced schedule; see :func:`plan_untraceable`).

    ``optimizer`` (native plans): a ``torch.optim.Optimizer`` over the model's parameters, or a name
    (``"adamw"``, ``"sgd-momentum"``...: planner.optimizer.OPTIMIZER_NAMES). The budget, the figures
    and a ``"N%"`` budget's base are then of the whole training iteration: zero_grad(set_to_none=True),
    forward, backward and ``optimizer.step()``, its state held through the forward and backward and
    its step's temporaries beside the gradients (planner/optimizer.py, sizes measured on fake tensors).

    ``device_memory`` (bytes, or a size such as ``"8GiB"``; planner/bounded.py) is what the device
    holds for the step; by default on CUDA its free memory, on CPU an address-space limit's, else
    none. A byte budget above it is refused (:class:`planner.bounded.DeviceMemoryError`) before
    anything runs; profiling holds at most the lower of the two (evicting and recomputing values:
    profiler/rematerialize.py), and a ``"N%"`` budget is of the predicted un-checkpointed peak when
    that step would not fit the device (it is not run). An allocation the device refuses while
    profiling or measuring raises :class:`profiler.oom.OutOfMemory`.

    ``autocast`` (``torch.bfloat16``, ``"bf16"``, ``"cuda:float16"``...): plan the step as it will
    run under ``torch.autocast`` on the model's device (planner/autocast.py); a plan made inside a
    ``with torch.autocast(...)`` block is planned under it without asking. The plan records it
    (``Plan.autocast``, in its summary), and a native plan warns once when its training step runs
    under another (runtime/autocast_check.py).

    """
    if model is None:
        raise TypeError("plan() profiles and plans a model: pass the model and its example inputs; to plan from "
                        "a profile alone use planner.plan_from_profile(profile, budget)")
    parsed = parse_budget(budget)
    time_limit = _time_limit(time_limit)
    asked, executor = executor, _executor(executor, solver)
    if autocast is not None:
        try:
            under = planning_under(model, autocast)
        except ValueError as error:
            raise SolverError(str(error)) from None
        with under:
            return plan(model, example_inputs, budget, solver, loss_fn, time_limit, granularity, profile, asked,
                        distributed, compile, optimizer=optimizer, device_memory=device_memory)
    if distributed_problem(distributed):
        raise SolverError(distributed_problem(distributed) + " (docs/native.md, 'Several processes')")
    _refuse_unplannable(model, example_inputs, distributed)
    if optimizer_problem(optimizer):
        raise OptimizerSpecError(optimizer_problem(optimizer))
    if optimizer is not None:
        _check_optimizer_with(executor, compile, distributed)
    device = device_memory_of(model, example_inputs, device_memory)
    check_within_device(parsed, parsed.bytes, device)
    choice = executor_choice(asked, executor, solver, distributed, optimizer, compile, eager=is_eager(profile))
    with training_step(model, PlanWarning) as switched:  # an eval-mode model: its training step (planner/trainmode.py)
        # Where the native executor refuses the budget, the traced one's plan (planner/executor_choice.py).
        made = planned(choice, lambda: _plan(model, example_inputs, parsed, solver, loss_fn, time_limit, granularity,
                                             profile, executor, distributed, compile, optimizer, device),
                       lambda: _traced_instead(model, example_inputs, parsed, loss_fn, time_limit, granularity, device))
    if switched:
        message = made.schedule.info.message
        made.schedule = made.schedule.with_info(message=f"{message}; {TRAINING_NOTE}" if message else TRAINING_NOTE)
    return made


def _plan(model, example_inputs, parsed, solver, loss_fn, time_limit, granularity, profile, executor, distributed,
          compile, optimizer, device) -> Plan:
    """:func:`plan` once its arguments are checked, the model in training mode."""
    if compile:
        with cache_off_while_planning(model):  # the training step as it runs planned (runtime/hf_cache.py)
            return _plan_compiled(model, example_inputs, parsed, solver, executor, loss_fn, time_limit, granularity,
                                  profile, distributed)
    if executor == "native":
        with cache_off_while_planning(model):
            return _plan_native(model, example_inputs, parsed, loss_fn, time_limit, granularity, profile, distributed,
                                optimizer, device)
    if distributed is not None:
        raise SolverError("distributed= is accounted for by native plans only: use executor='native' (the default)")
    if is_eager(profile):  # no trace to schedule: the native plan its first plan was
        return plan_untraceable(model, example_inputs, parsed, loss_fn=loss_fn, time_limit=time_limit, profile=profile)
    if profile is None:
        try:
            profile = profiler.profile(model, example_inputs, loss_fn=loss_fn, granularity=granularity,
                                       memory_bound=profiling_bound(parsed, device))
        except profiler.TraceError as error:
            return plan_untraceable(model, example_inputs, parsed, loss_fn=loss_fn, reason=error.reason,
                                    time_limit=time_limit)
    search = parse_granularity(granularity) == "auto"  # the profiler's choice: finer groupings are tried too

    def solve(budget_):
        return plan_from_profile(profile, budget_, solver=solver, time_limit=time_limit, finer=search,
                                 model_name=type(model).__name__)

    made = solve(parsed)
    check_within_device(parsed, made.budget_bytes, device)
    if not cuda_devices([*model.parameters()]):
        return made  # the CPU allocator's events are what the profiler replays: the prediction is the peak
    return repaired_on_measurement(made, solve, lambda p: _measure_traced(model, p, example_inputs, loss_fn))


def _traced_instead(model, example_inputs, parsed, loss_fn, time_limit, granularity, device) -> Plan:
    """The traced executor's plan for a budget the native one refused (planner/executor_choice.py), on
    its own trace: a model the tracer cannot follow raises profiler.TraceError (its eager plan is the
    native plan refused)."""
    profile = profile_for(model, example_inputs, loss_fn, granularity, executor="traced",
                          memory_bound=profiling_bound(parsed, device))
    return _plan(model, example_inputs, parsed, "auto", loss_fn, time_limit, granularity, profile, "traced", None,
                 False, None, device)


def repaired_on_measurement(made: Plan, solve: Callable[[int], Plan], measure: Callable[[Plan], int],
                            attempts: int = 3) -> Plan:
    """``made``, or a re-solved plan, whose measured peak (``measure(plan)``, bytes) is within
    ``made.budget_bytes``.

    Why: on CUDA ``max_memory_allocated`` can read above the sum of the tensors the trace predicts
    (a traced store-all GPT-2 on an H100: 166.5 MiB measured, 163.6 MiB predicted and budgeted; the
    allocation events of that step peaked at the prediction, so the excess is the caching
    allocator's block accounting, by our reading: docs/benchmarks/cuda.md). Each attempt lowers the budget the solver is
    given by the last measured excess over the prediction, and by the excess over the budget
    (planner/repair.py's loop, its rule :func:`~planner.repair.lower_by_miss_and_excess`; at most
    ``attempts`` plans measured); the plan keeps the budget it was asked for.
    Raises :class:`BudgetInfeasible` when no attempt measures within it."""
    budget_bytes, asked = made.budget_bytes, made
    repair = measure_and_repair(solve, measure, budget_bytes, lower_by_miss_and_excess(lambda p: p.predicted_peak_bytes),
                                max_attempts=attempts, first=made)
    if repair.fitting is not None:
        fitted = repair.fitting.plan
        return fitted if fitted is asked else replace(fitted, budget_bytes=budget_bytes, budget_text=asked.budget_text)
    measured = repair.last.measured_bytes
    raise BudgetInfeasible(
        f"budget {asked.budget_text} ({format_bytes(budget_bytes)}): the plans the solver makes for it measure above it "
        f"on this device (last measured {format_bytes(measured)}; the CUDA allocator holds more than the "
        "predicted tensors): give a larger budget", min_budget=measured, method=asked.method)


def _measure_traced(model: torch.nn.Module, made: Plan, example_inputs, loss_fn) -> int:
    with reported_out_of_memory("measuring the planned step"):
        return measure_planned_step(runtime.apply(model, made), example_inputs, loss_fn, repeats=1).peak_bytes


def plan_from_profile(profile: profiler.Profile, budget="100%", solver: str = "auto",
                      time_limit: float | None = None, finer: bool = True, model_name: str = "") -> Plan:
    """A traced plan (``executor="traced"``) solved on ``profile`` alone: no model is run or measured.

    What sweeps and ``--max-batch`` plan from: a :func:`profiler.profile`, or a stand-in holding its
    graph and its loss and input facts (planner/sweep/tasks.py, ``Profiled.as_profile``). The
    plan it returns is what :func:`plan` returns for a traced executor on the same profile, except
    that ``Plan.model`` is ``model_name`` (the model's class name, for the plan file; empty when not
    given).

    ``budget``: bytes of the whole step (``"12GB"``, an int, a :class:`planner.Budget`) or a
    percentage of the un-checkpointed step's peak predicted on ``profile`` (``"60%"``). ``solver``:
    ``"auto"`` or a method of ``solvers.METHODS`` (not ``"regions"``, which plans native regions of
    a model). ``time_limit`` (seconds) bounds the searching solvers. ``finer``: the chain methods
    also plan every finer grouping ``profile`` holds and the cheapest schedule wins
    (planner/granularity.py); :func:`plan` passes True when the granularity was the profiler's choice
    (``"module"``). A budget out of reach is tried again on the trace whose loss backward
    recomputes its log-probabilities (profiler/fusions.py), as in :func:`plan`.

    Raises :class:`BudgetInfeasible` (``min_budget`` in whole-step bytes) when the budget cannot be
    met, :class:`SolverError` when the solver refuses the problem as asked.

    >>> prof = profiler.profile(model, example_inputs)                          # doctest: +SKIP
    >>> planner.plan_from_profile(prof, "60%", solver="dp").predicted_peak_bytes  # doctest: +SKIP
    """
    parsed = parse_budget(budget)
    time_limit = _time_limit(time_limit)
    _executor("traced", solver)
    graph = profile.graph
    fixed = held_besides_schedule(graph)
    store_all = simulate(graph, store_all_schedule(graph))
    unplanned_peak = fixed + store_all.peak_bytes
    budget_bytes = parsed.resolve(unplanned_peak)

    def least_for(method: str) -> int | None:
        try:
            _solve(profile, 0, method, time_limit, finer)
        except Infeasible as error:
            return None if error.min_budget is None else int(error.min_budget)
        except (ValueError, TimeoutError):
            return None
        return None

    finest = [profile.finer()[-1].graph] if finer and profile.finer() and methods_on_finer_groupings(solver) else []
    refusal = refusal_below_floor(graph, str(parsed), budget_bytes, fixed, unplanned_peak, solver, least_for, finest)
    if refusal is not None:  # out of every solver's reach: no search (planner/least.py)
        raise BudgetInfeasible(str(refusal), min_budget=refusal.min_budget, method=refusal.method)
    try:
        solved = _solve(profile, budget_bytes, solver, time_limit, finer)
    except ValueError as error:  # solvers raise ValueError for what they were asked, not for a bug
        raise SolverError(f"solver {solver!r}: {error}") from error
    except TimeoutError as error:  # the solver's figures are of the activations: say the user's budget first
        detail = (f"{' '.join(str(error).split())}; its byte figures are of the activations alone, the step holding "
                  f"{format_bytes(fixed)} ({fixed} bytes) besides them")
        raise PlanTimeout(f"no schedule within budget {parsed} ({format_bytes(budget_bytes)}, {budget_bytes} bytes of "
                          f"the whole step) was found in the time limit ({detail})", detail,
                          method=getattr(error, "method", None) or solver) from None
    except Infeasible as error:
        minimum = error.min_budget
        if minimum is None:
            minimum = _minimum_budget(profile, solver, time_limit, finer, unplanned_peak)
        raise BudgetInfeasible(
            f"budget {parsed} ({format_bytes(budget_bytes)}) is below the minimum the {error.method or solver} solver "
            f"can reach for this model: {format_bytes(minimum)} ({minimum} bytes: parameters, buffers, inputs and "
            f"saved RNG states {format_bytes(fixed)} plus activations {format_bytes(minimum - fixed)})",
            min_budget=minimum,
            method=error.method or solver,
        ) from None
    profile, schedule = solved.profile, solved.schedule
    graph = profile.graph
    fixed = held_besides_schedule(graph)
    outcome = simulate(graph, schedule)
    return Plan(
        schedule=schedule,
        graph=graph,
        budget_bytes=budget_bytes,
        budget_text=str(parsed),
        fixed_bytes=fixed,
        predicted_peak_bytes=fixed + outcome.peak_bytes,
        unplanned_peak_bytes=unplanned_peak,
        predicted_seconds=outcome.compute_cost,
        unplanned_seconds=store_all.compute_cost,
        fingerprint=profile.fingerprint,
        granularity=profile.granularity,
        **profile_fields(profile, model_name),
    )


def profile_for(model: torch.nn.Module, example_inputs, loss_fn: Callable | None = None, granularity="module",
                solver: str = "auto", executor: str | None = None, memory_bound: int | None = None,
                times_cache: profiler.api.TimesCache | None = None) -> profiler.Profile:
    """The profile :func:`plan` makes for these arguments, to pass back as ``plan(..., profile=)``: the
    native executor plans what eager autograd runs (the cross-entropy backward unfused), the traced
    one what its trace runs (fused, profiler/fusions.py). ``memory_bound``: bytes profiling may hold
    (planner/bounded.py, ``profiling_bound``). ``times_cache``: op times measured before
    (:func:`profiler.profile`'s; sweeps pass planner/sweep/profilecache.py's)."""
    native = _executor(executor, solver) == "native"
    _refuse_unplannable(model, example_inputs)
    if not native:
        return profiler.profile(model, example_inputs, loss_fn=loss_fn, granularity=granularity, fuse_loss=True,
                                memory_bound=memory_bound, times_cache=times_cache)
    return native_profile(model, example_inputs, loss_fn, granularity=granularity, memory_bound=memory_bound,
                          times_cache=times_cache)


def _refuse_unplannable(model, example_inputs, distributed=None) -> None:
    """A :class:`SolverError` before anything runs for a model on the meta device (unless planned
    for FSDP2) or already under Hugging Face's gradient checkpointing (planner/unplannable.py)."""
    reason = unplannable_reason(model, example_inputs, distributed) if isinstance(model, torch.nn.Module) else None
    if reason:
        raise SolverError(reason)


def _time_limit(time_limit) -> float | None:
    """``time_limit`` checked before any work (solvers.options.check_time_limit: finite, at most a
    week), for the traced solvers and the native search alike."""
    try:
        return check_time_limit(time_limit)
    except ValueError as error:
        raise SolverError(str(error)) from None


def _executor(executor: str | None, solver: str) -> str:
    if executor is None:
        return "native" if solver in NATIVE_SOLVERS else "traced"
    if executor not in EXECUTORS:
        raise SolverError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}")
    if executor == "native" and solver not in NATIVE_SOLVERS:
        raise SolverError(
            f"solver {solver!r} makes schedules of the traced graph, which only executor='traced' runs; the native "
            f"executor takes solver {' or '.join(repr(s) for s in NATIVE_SOLVERS)}")
    if executor == "traced" and solver == "regions":
        raise SolverError("solver 'regions' plans for executor='native'")
    return executor


def _check_optimizer_with(executor: str, compile: bool, distributed) -> None:
    """optimizer= is counted by eager native plans, unwrapped or under DDP (planner/optimizer.py)."""
    if executor != "native" or compile:
        raise SolverError("optimizer= is counted by native plans only (the default executor, without compile=True): "
                          "plan with executor='native', or without optimizer= and a budget that leaves the optimizer's "
                          "state and step free")
    if distributed is not None and distributed != "ddp":
        raise SolverError("optimizer= with distributed='fsdp2' is not counted: FSDP2 keeps the optimizer's state and "
                          "its step on each rank's shards; plan without optimizer= and leave them free in the budget")


def _plan_native(model, example_inputs, parsed, loss_fn, time_limit, granularity, profile, distributed,
                 optimizer=None, device_memory: int | None = None) -> Plan:
    if is_meta_model(model):  # only fits sharded, planned without its weights (planner/sharded.py)
        try:
            return plan_sharded(model, example_inputs, parsed, loss_fn, time_limit, distributed,
                                device_memory=device_memory)
        except BudgetInfeasible:
            raise
        except Infeasible as error:
            raise BudgetInfeasible(str(error), min_budget=error.min_budget, method=error.method) from None
    if is_fsdp2(distributed) and not is_eager(profile):  # its per-rank peak exact (planner/fsdp2_exact.py)
        try:
            return plan_fsdp2(model, example_inputs, parsed, loss_fn, time_limit, distributed, profile,
                              device_memory=device_memory)
        except profiler.TraceError:
            pass  # recorded eagerly below, its per-rank peak by FSDP2's upper bound
        except BudgetInfeasible:
            raise
        except Infeasible as error:
            raise BudgetInfeasible(str(error), min_budget=error.min_budget, method=error.method) from None
    if is_eager(profile):  # recorded eagerly (a model the tracer cannot follow): planned as its first plan was
        return plan_untraceable(model, example_inputs, parsed, loss_fn=loss_fn, time_limit=time_limit,
                                distributed=distributed, profile=profile, device_memory=device_memory,
                                optimizer=optimizer)
    try:
        started = time.perf_counter()
        made = plan_native(model, example_inputs, parsed, loss_fn=loss_fn, time_limit=time_limit,
                           granularity=granularity, profile=profile, distributed=distributed, optimizer=optimizer,
                           device_memory=device_memory)
        return with_unrestricted_bound(made, time.perf_counter() - started)  # the class's cost beside it
    except profiler.TraceError as error:  # recorded eagerly instead (planner/untraced.py)
        return plan_untraceable(model, example_inputs, parsed, loss_fn=loss_fn, reason=error.reason,
                                time_limit=time_limit, distributed=distributed, device_memory=device_memory,
                                optimizer=optimizer)
    except BudgetInfeasible:
        raise
    except Infeasible as error:
        raise BudgetInfeasible(str(error), min_budget=error.min_budget, method=error.method) from None


def _plan_compiled(model, example_inputs, parsed, solver, executor, loss_fn, time_limit, granularity, profile,
                   distributed) -> Plan:
    """plan(..., compile=True): the native executor's regions priced on the compiled step."""
    if executor != "native":
        raise SolverError(
            f"compile=True prices native plans only (torch.utils.checkpoint regions run under torch.compile); "
            f"executor={executor!r} with solver {solver!r} is not accepted: use executor='native' (the default) with "
            f"solver {' or '.join(repr(s) for s in NATIVE_SOLVERS)}, or for a traced plan plan without compile= and "
            "run it compiled with planner.apply(model, plan, compile=True)")
    if distributed is not None:
        raise SolverError("compile=True measures the compiled step in this process, unwrapped: distributed= is not "
                          "counted there; plan without one of them")
    from .compiled import plan_compiled_native

    try:
        return plan_compiled_native(model, example_inputs, parsed, loss_fn=loss_fn, time_limit=time_limit,
                                    granularity=granularity, profile=profile)
    except profiler.TraceError as error:
        raise SolverError(f"compile=True plans regions from the model's trace, and this model's step cannot be traced "
                          f"({error.reason}): plan without compile=True (a native plan from an eager step) and wrap "
                          "the result in torch.compile") from None
    except BudgetInfeasible:
        raise
    except Infeasible as error:
        raise BudgetInfeasible(str(error), min_budget=error.min_budget, method=error.method) from None


def _solve(profile, budget_bytes: int, solver: str, time_limit, search: bool):
    """:func:`solve_over_groupings`, and when the budget is out of its reach, again on the trace whose
    cross-entropy backward recomputes its log-probabilities from the logits (a logits' worth less
    held through the loss, a log-softmax's time more: profiler/fusions.py). Raises the Infeasible
    with the lower minimum. Only then: where both fit, it gains too little for a second solve
    (benchmarks/log_probs.py, predicted at Hugging Face per-layer's peak: GPT-2 0.8% slower, BERT 3%
    faster)."""
    try:
        return solve_over_groupings(profile, budget_bytes, solver, time_limit, finer=search)
    except Infeasible as error:
        recomputed = profile.with_log_probs_recomputed()
        if recomputed is None:
            raise
        try:
            solved = solve_over_groupings(recomputed, budget_bytes, solver, time_limit, finer=search)
        except Infeasible as again:
            def minimum(e: Infeasible) -> float:
                return float("inf") if e.min_budget is None else e.min_budget

            raise (again if minimum(again) < minimum(error) else error) from None
        return noted(solved, "the loss's backward recomputes its log-probabilities from the logits: "
                             "the budget needs it")


def _minimum_budget(profile, solver: str, time_limit, search: bool, unplanned_peak: int) -> int:
    """The whole-step minimum for the message when the error had none: what the search reports when
    asked for nothing, else the un-checkpointed peak."""
    try:
        _solve(profile, 0, solver, time_limit, search)
    except Infeasible as again:
        if again.min_budget is not None:
            return int(again.min_budget)
    return unplanned_peak


def plan_untraceable(model: torch.nn.Module, example_inputs, budget="100%", loss_fn: Callable | None = None,
                     reason: str = "", time_limit: float | None = None, distributed=None,
                     profile: profiler.Profile | None = None, device_memory=None, optimizer=None) -> NativePlan:
    """The plan for a model the tracer cannot follow: a :class:`NativePlan` like any other, its
    step recorded eagerly op by op instead of traced (planner/untraced.py, profiler/eager.py),
    predicted, measured once and repaired as native plans are. ``reason``: the tracer's error, kept
    in the plan's solver message. ``profile``: the plan's ``profile`` (an eager one) from an earlier
    call, to plan another budget without recording the step again. Raises :class:`BudgetInfeasible`
    as :func:`plan` does. ``device_memory`` (bytes or a size): the eager step is refused before it
    would hold more (profiler/eager_bound.py). ``optimizer``: the whole iteration, as :func:`plan`."""
    parsed = parse_budget(budget)
    try:
        return plan_untraced(model, example_inputs, parsed, loss_fn=loss_fn, time_limit=time_limit, reason=reason,
                             distributed=distributed, profile=profile,
                             device_memory=parse_device_memory(device_memory), optimizer=optimizer)
    except BudgetInfeasible:
        raise
    except Infeasible as error:
        raise BudgetInfeasible(str(error), min_budget=error.min_budget, method=error.method) from None


def apply(model: torch.nn.Module, plan: Plan, compile: bool = False) -> torch.nn.Module:
    """The model, made to run ``plan`` in training.

    A :class:`NativePlan` checkpoints its regions in ``model`` itself and returns ``model``, the same
    object (runtime/native.py); :func:`runtime.native.remove_native` undoes it. A traced plan returns
    a module sharing ``model``'s parameters whose training step replays the schedule (runtime.apply;
    ``compile=True`` runs it as two inductor-compiled graphs, one per side of the loss); a fallback
    plan checkpoints its blocks (runtime.apply_module_chain). :func:`plan_of` gives the plan back."""
    if not isinstance(plan, Plan):
        raise TypeError(f"apply() takes a planner.Plan (from plan() or load()), got {type(plan).__name__}")
    if isinstance(plan, NativePlan):
        if compile:
            raise ValueError(
                "compile=True compiles a traced plan's schedule; a native plan runs the model's own forward with "
                "torch.utils.checkpoint, which torch.compile honours: call torch.compile(model) after apply() (and plan with "
                "compile=True to price the plan on the compiled step)")
        return attach(runtime.apply_native_plan(model, plan), plan)
    if isinstance(plan, ModuleChainPlan):
        if compile:
            raise ValueError(
                "compile=True compiles a traced plan's schedule; this is a fallback plan for a model the tracer "
                "cannot follow (it checkpoints whole blocks with torch.utils.checkpoint): apply it without "
                "compile=True, and wrap the result in torch.compile if you want it compiled"
            )
        return runtime.apply_module_chain(model, plan)
    return runtime.apply(model, plan, compile=compile)


def checkpoint(model: torch.nn.Module, example_inputs, budget="100%", compile: bool = False,
               **options) -> torch.nn.Module:
    """``apply(model, plan(model, example_inputs, budget, **options), compile)``.

    With the default native executor this is the one-call counterpart of Hugging Face's
    ``model.gradient_checkpointing_enable()``: the same model object comes back, its chosen modules
    checkpointed in place, sized to ``budget`` instead of every layer. A traced plan's module
    carries its plan as ``.plan``.

    ``compile=True`` with the native executor: the plan is priced on the compiled step
    (``plan(..., compile=True)``: ``budget`` is of the compiled step, ``"N%"`` of its measured peak)
    and the model is compiled in place (``torch.nn.Module.compile``): the same object, its
    ``state_dict`` keys unchanged. With a traced plan the schedule runs as two inductor-compiled
    graphs (``apply(..., compile=True)``)."""
    if compile and _executor(options.get("executor"), options.get("solver", "auto")) == "native":
        made = plan(model, example_inputs, budget, compile=True, **options)
        apply(model, made)
        model.compile()
        return model
    return apply(model, plan(model, example_inputs, budget, **options), compile=compile)


load = load
