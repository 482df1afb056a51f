"""plan-checkpoints: the fastest training step that fits a memory budget.

>>> import planner
>>> plan = planner.plan(model, example_inputs, budget="12GB")      # doctest: +SKIP
>>> fast = planner.apply(model, plan)                             # doctest: +SKIP
>>> fast = planner.checkpoint(model, example_inputs, budget="60%")  # doctest: +SKIP
"""

from .api import BudgetInfeasible, FallbackWarning, SolverError, apply, checkpoint, load, plan, plan_untraceable
from .budget import ACCEPTED_FORMS, Budget, BudgetError, format_bytes, parse_budget
from .plan import Plan, PlanFileError

__all__ = [
    "ACCEPTED_FORMS",
    "Budget",
    "BudgetError",
    "BudgetInfeasible",
    "FallbackWarning",
    "Plan",
    "PlanFileError",
    "SolverError",
    "apply",
    "checkpoint",
    "format_bytes",
    "load",
    "parse_budget",
    "plan",
    "plan_untraceable",
]
