"""Which executor plans a budget: the native one, or the traced one where only it reaches the budget.

``planner.plan``'s default executor is the native one (torch.utils.checkpoint on the model's own
modules, planner/native.py). It can only recompute what a module's call computes: activations made
by ops of a forward that no submodule holds (a model that applies its weights with functional ops,
a loss computed in the root) stay held whatever it wraps. The traced executor (runtime/module.py)
replays any schedule of the traced graph, every op recomputable, so it reaches budgets the native
one refuses. Issue 28, item 3: no budget is refused that some executor reaches.

- The caller did not choose (``executor=None`` with ``solver="auto"``): a native refusal
  (``BudgetInfeasible``) is followed by the traced executor's plan at the same budget, on its own
  trace. It comes back with a notice (a :class:`planner.planfile.PlanWarning`, and
  ``Plan.executor_notice``, in its summary and its file) naming the native executor's least
  budget and what the traced plan runs as. Where the traced executor refuses too, one refusal
  names the least budget of each; its ``min_budget`` is the lower (asking for it plans).
- The caller pinned the executor (``executor="native"``, or ``solver="regions"``, which only the
  native executor runs): the refusal stands, and says that ``executor="traced"`` may reach the
  budget (the traced executor is not run: no figure).
- What the traced executor does not count (``distributed=``, ``optimizer=``; ``compile=True``
  prices native plans only), or a model it cannot trace: the native refusal stands, saying why.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from profiler.errors import CaptureError
from profiler.oom import OutOfMemory
from solvers import Infeasible

from .budget import format_bytes
from .planfile import Plan, PlanWarning

# What the traced attempt may raise instead of a plan or a refusal; the native refusal then stands,
# with the traced executor's words: a model it cannot trace (CaptureError, TraceError among them), a
# solver out of time (TimeoutError: PlanTimeout), a solver refusing the problem (ValueError:
# SolverError, DeviceMemoryError), an allocation the device refused while profiling or measuring.
TRACED_FAILURES = (CaptureError, TimeoutError, ValueError, OutOfMemory)

NATIVE_WORDS = "the native executor (torch.utils.checkpoint on the model's own modules)"
TRACED_WORDS = "the traced executor (executor='traced': any schedule of the traced graph, any op recomputed)"


@dataclass(frozen=True)
class ExecutorChoice:
    """How :func:`planned` picks the executor: ``executor`` plans first (``"native"`` or
    ``"traced"``); ``pinned`` when the caller named it (``executor=``) or a solver only it runs;
    ``traced_cannot``: why the traced executor cannot stand in for the native one ("" when it can)."""

    executor: str
    pinned: bool
    traced_cannot: str = ""


def executor_choice(asked: str | None, executor: str, solver: str, distributed=None, optimizer=None,
                    compile: bool = False, eager: bool = False) -> ExecutorChoice:
    """The choice for ``planner.plan``'s arguments: ``asked`` is its ``executor=`` as given (None:
    not given), ``executor`` that resolved (planner/api.py ``_executor``); ``eager``: the profile
    given was recorded eagerly (planner/untraced.py: the tracer cannot follow the model)."""
    cannot = ["the tracer cannot follow this model (its profile was recorded eagerly)"] if eager else []
    if distributed is not None:
        cannot.append("it does not count distributed= (a wrapper's memory per device)")
    if optimizer is not None:
        cannot.append("it does not count optimizer= (the optimizer's state and step)")
    if compile:
        cannot.append("compile=True prices native plans only")
    return ExecutorChoice(executor=executor, pinned=asked is not None or solver != "auto",
                          traced_cannot="; ".join(cannot))


def planned(choice: ExecutorChoice, plan: Callable[[], Plan], traced_instead: Callable[[], Plan]) -> Plan:
    """``plan()`` (the chosen executor's plan), or where the native executor refused the budget and
    the choice allows it, ``traced_instead()`` with its notice (the module docstring). Raises the
    native refusal's class (``BudgetInfeasible``), its message saying what the traced executor
    does with the budget."""
    if choice.executor != "native":
        return plan()
    try:
        return plan()
    except Infeasible as error:
        refused = error
    # Outside the except block: what the traced attempt raises must not carry the refusal as its
    # context (the profiler tells the model's errors from ours by the frames they were raised in).
    if choice.traced_cannot:
        raise _again(refused, f"{refused}; {TRACED_WORDS} cannot stand in here: {choice.traced_cannot}")
    if choice.pinned:
        raise _again(refused, f"{refused}; {TRACED_WORDS} may reach it (not tried: the executor was chosen): plan "
                              "with executor='traced', or leave executor unset and the planner falls back to it "
                              "where only it reaches the budget")
    try:
        made = traced_instead()
    except Infeasible as also:
        raise both_refused(refused, also) from None
    except TRACED_FAILURES as failed:
        words = " ".join(str(failed).split())
        raise _again(refused, f"{refused}; {TRACED_WORDS} was tried instead and did not plan it "
                              f"({type(failed).__name__}: {words})") from None
    made.executor_notice = traced_notice(made, refused.min_budget)
    warnings.warn(made.executor_notice, PlanWarning, stacklevel=3)  # planner.plan's caller
    return made


def traced_notice(made: Plan, native_least: int | None) -> str:
    """Why ``made`` is a traced plan: the native executor's least budget (bytes), and what the plan
    runs as under ``planner.apply``."""
    least = (f": its least is {format_bytes(native_least)} ({native_least} bytes)" if native_least is not None
             else "")
    return (f"budget {made.budget_text} ({format_bytes(made.budget_bytes)}) is below what {NATIVE_WORDS} reaches"
            f"{least}; this plan is the traced executor's, which reaches it: planner.apply returns a module that "
            "replays the traced graph's schedule (sharing the model's parameters), not the model with its modules "
            "under torch.utils.checkpoint in place; plan with executor='native' to have the budget refused instead")


def both_refused(native: Infeasible, traced: Infeasible) -> Infeasible:
    """One refusal for a budget neither executor reaches: the native refusal's words, then the traced
    executor's least budget; ``min_budget`` is the lower of the two (planning it falls back where
    the traced one is lower)."""
    leasts = [least for least in (native.min_budget, traced.min_budget) if least is not None]
    if traced.min_budget is not None:
        theirs = f"its least is {format_bytes(traced.min_budget)} ({traced.min_budget} bytes)"
    else:
        theirs = " ".join(str(traced).split())
    refusal = _again(native, f"{native}; {TRACED_WORDS} does not reach it either: {theirs}")
    refusal.min_budget = min(leasts) if leasts else None
    if traced.min_budget is not None and (native.min_budget is None or traced.min_budget < native.min_budget):
        refusal.method = traced.method
    return refusal


def _again(refused: Infeasible, message: str) -> Infeasible:
    """``refused``'s class (``BudgetInfeasible``) with ``message``, its least budget and method kept."""
    return type(refused)(message, min_budget=refused.min_budget, method=refused.method)


__all__ = ["ExecutorChoice", "TRACED_FAILURES", "both_refused", "executor_choice", "planned", "traced_notice"]
