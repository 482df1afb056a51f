"""Memory budgets as users write them (docs/contract.md, "Budgets").

``12GB`` (10^9 bytes), ``12GiB`` (2^30), ``500MB``, ``500MiB`` (likewise kB/KiB, TB/TiB), plain
bytes as an integer, or ``60%`` (of the un-checkpointed step's peak). A byte budget is the peak of the
whole training step: parameters, buffers and inputs plus everything the step allocates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

ACCEPTED_FORMS = (
    "a whole number of bytes (e.g. 12000000000), a size with a unit (12GB = 12*10^9 bytes, 12GiB = "
    "12*2^30 bytes; also kB/KiB, MB/MiB, TB/TiB; decimals allowed, e.g. 1.5GiB), or a percentage of the "
    "un-checkpointed step's peak between 0% and 100% (e.g. 60%); at most 1 EiB (2^60 bytes)"
)
MAX_BYTES = 2**60  # 1 EiB: far above any device; a larger figure is a typo (or an attack on the arithmetic)

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-zA-Z]+|%)?\s*$")


class BudgetError(ValueError):
    """A budget that is not one of the accepted forms; the message lists them."""


@dataclass(frozen=True)
class Budget:
    """A parsed budget: ``bytes`` of the whole step, or ``percent`` of the un-checkpointed peak."""

    bytes: int | None = None
    percent: float | None = None
    text: str = ""

    def resolve(self, unplanned_peak_bytes: int) -> int:
        """The budget in bytes of the whole step."""
        if self.bytes is not None:
            return self.bytes
        return int(math.floor(unplanned_peak_bytes * self.percent / 100.0))

    def __str__(self) -> str:
        return self.text or (f"{self.percent:g}%" if self.percent is not None else format_bytes(self.bytes))


def parse_budget(value) -> Budget:
    """Parse ``value`` (a string as above, or an int number of bytes); raise :class:`BudgetError`."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool) or value is None:
        raise BudgetError(f"budget {value!r} is not valid; a budget is {ACCEPTED_FORMS}")
    if isinstance(value, int):
        if value <= 0:
            raise BudgetError(f"budget {value} must be more than 0 bytes; a budget is {ACCEPTED_FORMS}")
        if value > MAX_BYTES:
            raise BudgetError(f"budget {_short(value)} is more than 1 EiB (2^60 bytes); a budget is {ACCEPTED_FORMS}")
        return Budget(bytes=value, text=str(value))
    if isinstance(value, float):
        if not math.isfinite(value) or value <= 0 or not value.is_integer():
            raise BudgetError(f"budget {value!r} is not a positive whole number of bytes; a budget is {ACCEPTED_FORMS}")
        return parse_budget(int(value))
    if not isinstance(value, str):
        raise BudgetError(f"budget {value!r} is not valid; a budget is {ACCEPTED_FORMS}")
    match = _PATTERN.match(value) if len(value) <= 1000 else None
    if not match:
        raise BudgetError(f"budget {_short(value)} is not valid; a budget is {ACCEPTED_FORMS}")
    number, unit = match.group("number"), match.group("unit")
    amount = Decimal(number)  # exact: a 400-digit number is too large, not an overflow
    if unit == "%":
        if not 0 < amount <= 100:
            raise BudgetError(f"budget {value!r}: a percentage must be more than 0% and at most 100%")
        return Budget(percent=float(amount), text=value.strip())
    if unit is None:
        if "." in number:
            raise BudgetError(f"budget {value!r}: plain bytes must be a whole number; a budget is {ACCEPTED_FORMS}")
        scale = 1
    else:
        scale = _UNITS.get(unit.lower())
        if scale is None:
            raise BudgetError(f"budget {value!r}: unknown unit {unit!r}; a budget is {ACCEPTED_FORMS}")
    total = int((amount * scale).to_integral_value())
    if total <= 0:
        raise BudgetError(f"budget {value!r} must be more than 0 bytes")
    if total > MAX_BYTES:
        raise BudgetError(f"budget {_short(value)} is more than 1 EiB (2^60 bytes); a budget is {ACCEPTED_FORMS}")
    return Budget(bytes=total, text=value.strip())


def _short(value) -> str:
    """A value for a message: a 400-digit budget is shown by its start and its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


def format_bytes(count: int | float | None) -> str:
    """Human-readable bytes in binary units (``1.50 GiB``)."""
    if count is None:
        return "?"
    count = float(count)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{int(count)} B"
