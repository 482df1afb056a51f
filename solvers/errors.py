"""Exceptions raised by the solvers."""

from __future__ import annotations


class Infeasible(Exception):
    """No schedule of the method fits the budget.

    ``min_budget`` is the smallest budget (bytes, in the same sense as the ``budget_bytes``
    argument of :func:`solvers.solve`: the schedule's peak, ``fixed_bytes`` excluded) that the
    method can meet on this graph, or ``None`` where the method cannot tell (it then says why).
    """

    def __init__(self, message: str, min_budget: int | None = None, method: str | None = None):
        super().__init__(message)
        self.min_budget = min_budget
        self.method = method


class SolverTimeout(TimeoutError):
    """The time limit passed before the method could answer: no schedule within the budget was
    found, and the budget was not shown to be out of the method's reach with a proven minimum.

    A ``TimeoutError`` (the CLI's exit status 4), never an :class:`Infeasible`: an infeasibility
    verdict would claim a minimum budget that was not proven. The message says what is known (the
    least peak found, a proven lower bound). ``method`` names the solver.
    """

    def __init__(self, message: str, method: str | None = None):
        super().__init__(message)
        self.method = method


class InvalidGraph(ValueError):
    """The cost graph breaks the contract (see docs/costgraph.md): cyclic, bad attributes..."""


class SolverUnavailable(RuntimeError):
    """A backend library (a MILP or CP solver) is missing or failed to start."""
