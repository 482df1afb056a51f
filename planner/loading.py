"""``planner.load``: a plan file read back as the plan class its format names.

Above the plan classes (planfile.Plan and the native, compiled and old module-chain plans that
extend it), so that none of them imports another to be read.
"""

from __future__ import annotations

import os

from .compiled import CompiledNativePlan
from .fallback import CHAIN_FORMAT, ModuleChainPlan
from .native_plan import NATIVE_FORMAT, NativePlan
from .planfile import Plan, read_plan_data


def plan_from_data(data, source: str) -> Plan:
    """The plan a plan file's JSON value ``data`` describes, by its ``format`` (``source`` names it in
    errors). Raises :class:`planner.planfile.PlanFileError` with the reason."""
    if isinstance(data, dict) and data.get("format") == CHAIN_FORMAT:
        return ModuleChainPlan.from_dict(data, source=source)
    if isinstance(data, dict) and data.get("format") == NATIVE_FORMAT:
        if "compiled" in data:  # priced on the compiled step (planner/compiled.py)
            return CompiledNativePlan.from_dict(data, source=source)
        return NativePlan.from_dict(data, source=source)
    return Plan.from_dict(data, source=source)


def load(path: str | os.PathLike) -> Plan:
    """Read a plan saved by :meth:`Plan.save`. Raises :class:`planner.planfile.PlanFileError` with the reason."""
    path = os.fspath(path)
    return plan_from_data(read_plan_data(path), source=path)


__all__ = ["load", "plan_from_data"]
