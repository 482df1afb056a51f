"""Numbers for CP-SAT: memory in exact integer units, costs as integers rounded down (so that
the model's bound stays a bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from collections.abc import Sequence

from ..graph import NodeCosts

# Inexact cost scaling: the largest possible objective, in model units.
COST_UNITS_TARGET = 1e12


@dataclass(frozen=True)
class MemoryScale:
    """Sizes in model units of ``unit`` bytes; ``exact`` when no size was rounded."""

    unit: int
    mem: tuple[int, ...]
    workspace: tuple[int, ...]
    exact: bool

    def capacity(self, budget_bytes: int) -> int:
        # Rounding down is exact when every size is a multiple of the unit, and safe (never admits
        # a schedule over the budget) when sizes were rounded up.
        return budget_bytes // self.unit

    def units_at_least(self, lower_bytes: int) -> int:
        """A lower bound in bytes as one in model units (sizes are never rounded down)."""
        return -(-lower_bytes // self.unit)

def scale_memory(costs: NodeCosts, horizon: int) -> MemoryScale:
    """Divide sizes by their gcd; coarser (rounded up) only if the cumulative could overflow."""
    sizes = [s for s in (*costs.mem, *costs.workspace) if s > 0]
    unit = reduce(math.gcd, sizes, 0) or 1
    exact = True
    worst = sum(costs.mem) + sum(costs.workspace)
    while (worst // unit + costs.n) * max(horizon, 1) * 4 > 2**60:  # CP-SAT checks sums against int64
        unit *= 2
        exact = False
    return MemoryScale(unit, tuple(-(-m // unit) for m in costs.mem),
                       tuple(-(-w // unit) for w in costs.workspace), exact)

@dataclass(frozen=True)
class CostScale:
    """``units[v] = floor(cost[v] * factor)``; ``exact`` when that lost nothing (within 1e-9)."""

    factor: float
    units: tuple[int, ...]
    exact: bool

    def seconds(self, units: float) -> float:
        return units / self.factor

def scale_costs(cost: Sequence[float], max_instances: int) -> CostScale:
    largest = max(cost, default=0.0)
    if largest <= 0:
        return CostScale(1.0, tuple(0 for _ in cost), True)
    for digits in range(10):  # a power of ten that makes every cost whole, if one does
        factor = 10.0**digits
        if largest * factor * max_instances > COST_UNITS_TARGET:
            break
        units = [round(c * factor) for c in cost]
        if all(abs(c * factor - u) <= 1e-9 * max(1.0, c * factor) for c, u in zip(cost, units)):
            return CostScale(factor, tuple(units), True)
    factor = COST_UNITS_TARGET / (largest * max(max_instances, 1))
    return CostScale(factor, tuple(math.floor(c * factor) for c in cost), False)
