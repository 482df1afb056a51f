"""Whether a native plan's predicted slowdown is what its step measures, judged on a paired timing.

The plan's predicted step time sums op times profiled earlier; its measured step runs later. On a
machine whose load changes between the two, comparing them cried wolf (+1569% on the README's first
command on a busy machine; in all five nanoGPT runs). What the prediction claims, and what a
measurement can check, is a *ratio*: the planned step's time over the un-checkpointed step's. Both
are timed back to back in the order eager, planned, eager (an A-B-A pairing: a load that changes
during the three steps moves the two eager steps apart), and the comparison is made only when the
two eager steps agree within :data:`STEADY`, and each step is long enough for the clock
(:data:`SHORTEST_STEP_SECONDS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STEADY = 0.10  # the two eager steps of a pairing this close (relative): the load held still
SHORTEST_STEP_SECONDS = 1e-3  # shorter steps are timer and scheduler noise on a shared CPU
SLOW_FAST = 0.2  # a measured ratio this far from the predicted one (relative) is worth a warning


@dataclass(frozen=True)
class PairedTiming:
    """One A-B-A pairing, in seconds: the eager step before and after the planned one."""

    eager_before_seconds: float
    planned_seconds: float
    eager_after_seconds: float

    @property
    def trusted(self) -> bool:
        """The load held still across the pairing and every step is long enough to time."""
        before, after = self.eager_before_seconds, self.eager_after_seconds
        steps = (before, self.planned_seconds, after)
        if min(steps) < SHORTEST_STEP_SECONDS:
            return False
        return abs(before - after) <= STEADY * min(before, after)

    @property
    def measured_ratio(self) -> float:
        """The planned step's time over the mean of the two eager steps."""
        return self.planned_seconds / ((self.eager_before_seconds + self.eager_after_seconds) / 2)


def time_paired(time_eager: Callable[[], float], time_planned: Callable[[], float]) -> PairedTiming:
    """Eager, planned, eager: each callable runs one step and returns its seconds."""
    before = time_eager()
    planned = time_planned()
    return PairedTiming(before, planned, time_eager())


def disagreement(timing: PairedTiming, predicted_seconds: float, unplanned_seconds: float) -> str | None:
    """Why the measured slowdown contradicts the predicted one (a warning's text), or None: the
    pairing is not trusted, nothing was predicted, or the two ratios agree within :data:`SLOW_FAST`."""
    if not timing.trusted or predicted_seconds <= 0 or unplanned_seconds <= 0:
        return None
    predicted_ratio = predicted_seconds / unplanned_seconds
    off = timing.measured_ratio / predicted_ratio
    if 1 / (1 + SLOW_FAST) <= off <= 1 + SLOW_FAST:
        return None
    return (f"the planned step measured {timing.measured_ratio - 1:+.1%} against the un-checkpointed step timed beside "
            f"it ({timing.planned_seconds * 1000:.1f} ms against {timing.eager_before_seconds * 1000:.1f} and "
            f"{timing.eager_after_seconds * 1000:.1f} ms), where the profiled op times predicted "
            f"{predicted_ratio - 1:+.1%}: the step runs ops its trace does not show, or their times differ from the "
            "profiled ones; the plan fits its budget either way (its peak was measured), but its choice between "
            "equally small plans may not be the fastest")


__all__ = ["PairedTiming", "SHORTEST_STEP_SECONDS", "SLOW_FAST", "STEADY", "disagreement", "time_paired"]
