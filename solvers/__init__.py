"""Recompute schedules for a training step's cost graph under a memory budget.

Pure Python over networkx and the MILP/CP libraries: no torch. See docs/contract.md ("The solver
contract"), docs/costgraph.md for the cost graph and docs/schedule.md for the schedule semantics.

>>> from solvers import solve, simulate, Infeasible
>>> schedule = solve(graph, budget_bytes, method="dp")           # doctest: +SKIP
>>> simulate(graph, schedule).peak_bytes <= budget_bytes          # doctest: +SKIP
True
"""

from .api import METHODS, solve
from .errors import Infeasible, InvalidGraph, SolverTimeout, SolverUnavailable
from .graph import topological_order, total_cost, validate
from .liveness import schedule_from_computes
from .schedule import Schedule, SolverInfo
from .simulate import Simulation, simulate

__all__ = [
    "METHODS",
    "Infeasible",
    "InvalidGraph",
    "Schedule",
    "Simulation",
    "SolverInfo",
    "SolverTimeout",
    "SolverUnavailable",
    "schedule_from_computes",
    "simulate",
    "solve",
    "topological_order",
    "total_cost",
    "validate",
]
