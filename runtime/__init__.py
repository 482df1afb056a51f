"""Run a plan: rewrite a module so that its training step executes the plan's schedule.

>>> import runtime
>>> fast = runtime.apply(model, plan)      # shares model's parameters   # doctest: +SKIP
"""

from .chain import apply_module_chain, checkpoint_blocks
from .executor import ScheduleError
from .module import InputMismatch, PlanMismatch, apply
from .native import ShapeTooLarge, apply_native, apply_native_plan, remove_native

__all__ = ["InputMismatch", "PlanMismatch", "ScheduleError", "ShapeTooLarge", "apply", "apply_module_chain",
           "apply_native", "apply_native_plan", "checkpoint_blocks", "remove_native"]
