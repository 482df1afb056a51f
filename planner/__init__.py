"""plan-checkpoints: the fastest training step that fits a memory budget.

>>> import planner
>>> plan = planner.plan(model, example_inputs, budget="12GB")      # doctest: +SKIP
>>> fast = planner.apply(model, plan)                             # doctest: +SKIP
>>> fast = planner.checkpoint(model, example_inputs, budget="60%")  # doctest: +SKIP
>>> plan = planner.plan_from_profile(profiler.profile(model, example_inputs), "60%")  # doctest: +SKIP
"""

import importlib

# Imported on first use: the command line parses its arguments and budget, and reports mistakes in
# them, without paying for torch.
_EXPORTS = {
    "BudgetInfeasible": ".api", "EXECUTORS": ".api", "FallbackWarning": ".api", "FSDP2": ".native",
    "NativePlan": ".native_plan", "PlanTimeout": ".api", "PlanWarning": ".planfile",
    "SolverError": ".api", "apply": ".api",
    "checkpoint": ".api", "load": ".api", "plan": ".api", "plan_from_profile": ".api", "plan_untraceable": ".api",
    "profile_for": ".api", "plan_of": ".attached", "NoPlan": ".attached",
    "ACCEPTED_FORMS": ".budget", "Budget": ".budget", "BudgetError": ".budget", "format_bytes": ".budget",
    "parse_budget": ".budget", "Plan": ".planfile", "PlanFileError": ".planfile",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [
    "ACCEPTED_FORMS",
    "Budget",
    "BudgetError",
    "BudgetInfeasible",
    "EXECUTORS",
    "FSDP2",
    "FallbackWarning",
    "NativePlan",
    "NoPlan",
    "Plan",
    "PlanFileError",
    "PlanTimeout",
    "PlanWarning",
    "SolverError",
    "apply",
    "checkpoint",
    "format_bytes",
    "load",
    "parse_budget",
    "plan",
    "plan_from_profile",
    "plan_of",
    "plan_untraceable",
    "profile_for",
]
