"""Measured op times on disk, so that profiling the same model again skips the timing.

One JSON file per trace, named by :func:`profiler.api.times_key` (the cost graph's fingerprint, the
traced ops, the device, the torch version), written atomically. A file that cannot be read is a miss:
the model is timed again and the file rewritten.
"""

from __future__ import annotations

import json
import os
import re

from profiler.api import CachedTimes
from profiler.measure import OpTimes

from ..files import write_atomic

FORMAT = "plan-checkpoints-times/2"  # /2: with each op's measured scratch bytes
FIGURES_FORMAT = "plan-checkpoints-figures/1"
_SAFE_KEY = re.compile(r"^[A-Za-z0-9._-]+$")


class ProfileCache:
    """A folder of measured times; implements profiler.api.TimesCache."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = os.fspath(folder)
        self.hits = 0  # loads that found times: a profile that did not time anything

    def path(self, key: str) -> str:
        if not _SAFE_KEY.match(key):  # keys come from times_key(); never let one escape the folder
            raise ValueError(f"not a cache key: {key!r}")
        return os.path.join(self.folder, f"{key}.json")

    def load(self, key: str) -> CachedTimes | None:
        try:
            with open(self.path(key)) as file:
                data = json.load(file)
            if data.get("format") != FORMAT:
                return None
            times = CachedTimes(
                OpTimes({str(k): float(v) for k, v in data["ops"].items()}, int(data["runs"]),
                        float(data["step_seconds"]), {str(k): int(v) for k, v in data["scratch"].items()}),
                float(data["loss_seconds"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        self.hits += 1
        return times

    def store(self, key: str, times: CachedTimes) -> None:
        data = {
            "format": FORMAT,
            "ops": times.ops.seconds,
            "runs": times.ops.runs,
            "step_seconds": times.ops.step_seconds,
            "scratch": times.ops.scratch_bytes,
            "loss_seconds": times.loss_seconds,
        }
        write_atomic(self.path(key), json.dumps(data, sort_keys=True))

    def load_figures(self, key: str, kind: str) -> dict | None:
        """Other measured figures kept under ``key`` (planner/sweep/clockcache.py: ``kind`` "clock"),
        or None when there are none or the file cannot be read."""
        try:
            with open(self.path(f"{key}-{kind}")) as file:
                data = json.load(file)
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != f"{FIGURES_FORMAT}:{kind}":
            return None
        return data.get("figures")

    def store_figures(self, key: str, kind: str, figures: dict) -> None:
        write_atomic(self.path(f"{key}-{kind}"), json.dumps({"format": f"{FIGURES_FORMAT}:{kind}", "figures": figures},
                                                            sort_keys=True))
