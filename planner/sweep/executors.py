"""Which executor each run of a sweep plans for (docs/batch.md, "Executors").

A sweep file's ``executor`` is ``native``, ``traced`` or a list of both (to compare the two
executors side by side); without one, each solver gets the executor ``planner.plan`` gives it by
default (planner/api.py ``EXECUTORS``, ``NATIVE_SOLVERS``): native for ``auto`` and ``regions``,
traced for the traced graph's solvers. A run made with a named executor passes it to
``planner.plan`` as ``executor=``; one without passes nothing, so that ``auto`` means in a sweep
exactly what it means in ``planner.plan`` and on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("native", "traced")  # planner.api.EXECUTORS, without importing torch to read a sweep file
EXECUTOR_MEANINGS = {
    "native": "torch.utils.checkpoint on the model's own modules; planner.plan's default for auto and regions",
    "traced": "the profiled graph's schedule replayed; the executor of every other solver",
}
ACCEPTED_EXECUTORS = ("; ".join(f"{name} ({EXECUTOR_MEANINGS[name]})" for name in EXECUTORS)
                      + f", or a list of them to compare executors side by side ([{', '.join(EXECUTORS)}])")


def planner_executor(executor: str | None, solver: str) -> str:
    """planner.plan's own check and default of an executor for a solver (planner/api.py
    ``_executor``; raises its SolverError), so that a sweep accepts and resolves exactly the pairs
    planner.plan does: one definition, not a copy. Imported when a sweep's runs are resolved, so
    that a mistake found before them is reported without importing torch."""
    from ..api import _executor

    return _executor(executor, solver)


@dataclass(frozen=True)
class ExecutorChoice:
    """What a run plans for: ``name`` (``"native"`` or ``"traced"``), and whether the sweep file
    named it (``given``) or it is planner.plan's default for the solver."""

    name: str
    given: bool

    @property
    def plan_argument(self) -> str | None:
        """``planner.plan``'s ``executor=``: the executor named, or None for planner.plan's default."""
        return self.name if self.given else None


def default_executor(solver: str) -> str:
    """The executor ``planner.plan(..., solver=solver)`` plans for when none is named."""
    return planner_executor(None, solver)


def solver_label(solver: str, executor: str) -> str:
    """A run's solver in messages: ``dp``, ``auto`` (each planner.plan's default executor), or with
    the executor where the run asks for another (``auto (traced)``)."""
    return solver if executor == default_executor(solver) else f"{solver} ({executor})"


def runs_with(executor: str, solver: str) -> bool:
    """Whether ``executor`` plans with ``solver`` (native: auto and regions; traced: every solver
    but regions), as planner.plan decides."""
    from ..api import SolverError

    try:
        planner_executor(executor, solver)
    except SolverError:
        return False
    return True


def refusal(executors: list[str], solver: str) -> str | None:
    """Why ``solver`` cannot be planned by any of ``executors`` (the ones a model's runs name), or
    None when at least one of them plans it."""
    if any(runs_with(executor, solver) for executor in executors):
        return None
    if executors == ["traced"]:
        return (f"solver {solver} plans the native executor (torch.utils.checkpoint on the model's modules), and the "
                f"sweep asks for executor traced only; executor traced accepts auto and the traced graph's solvers; "
                f"for {solver} give executor: native or [native, traced]")
    return (f"solver {solver} makes schedules of the traced graph, which only executor traced runs, and the sweep asks "
            f"for executor native only; executor native accepts {', '.join(_native_solvers())}; for {solver} give "
            "executor: traced or [native, traced]")


def _native_solvers() -> tuple[str, ...]:
    from ..api import NATIVE_SOLVERS

    return NATIVE_SOLVERS


def choices(executors: list[str] | None, solver: str) -> list[ExecutorChoice]:
    """The executors one solver is planned with: each of ``executors`` that runs it (None: planner.plan's
    default for the solver)."""
    if executors is None:
        return [ExecutorChoice(default_executor(solver), given=False)]
    return [ExecutorChoice(name, given=True) for name in executors if runs_with(name, solver)]


__all__ = ["ACCEPTED_EXECUTORS", "EXECUTORS", "ExecutorChoice", "choices", "default_executor", "refusal", "runs_with", "solver_label"]
