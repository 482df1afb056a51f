"""The time a searching method has left: one clock for the whole call, model building included."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import SolverTimeout

# Seconds below which what is left counts as nothing: no solver run is worth starting in it.
EXPIRED_SECONDS = 0.05


@dataclass
class Clock:
    """Seconds left of a limit (``limit``: seconds from ``started``, a ``time.perf_counter``
    reading; ``None``: no limit). Everything a method does, building its model included, is
    charged to it, so that a call returns within its limit plus one check's worth of work."""

    limit: float | None
    started: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        """Seconds since the call started."""
        return time.perf_counter() - self.started

    def left(self) -> float | None:
        """Seconds left (never negative), or ``None`` without a limit."""
        return None if self.limit is None else max(0.0, self.limit - self.elapsed())

    def share(self, fraction: float) -> float | None:
        """``fraction`` of the seconds left (at least :data:`EXPIRED_SECONDS`), ``None`` without a limit."""
        left = self.left()
        return None if left is None else max(EXPIRED_SECONDS, left * fraction)

    def expired(self) -> bool:
        """Whether the limit has (all but) passed."""
        left = self.left()
        return left is not None and left <= EXPIRED_SECONDS

    def check(self, method: str, doing: str) -> None:
        """Raise :class:`SolverTimeout` when the limit has passed; called between units of work
        (a stage of a model being built) so that no part of a call runs past the limit unseen."""
        if self.limit is not None and self.elapsed() > self.limit:
            raise SolverTimeout(f"{method}: the time limit of {self.limit:g} s passed while {doing}", method=method)
