"""The native planner's checkpoint clock kept in the sweep's profile cache, beside the op times.

A native plan is priced with what ``torch.utils.checkpoint`` itself costs per region and per op
under a save policy, measured on the model (planner/checkpoint_clock.py) and put on the profile's op
graph, where :func:`planner.checkpoint_clock.price` finds it and measures nothing again. Those
figures are measured times like the op times: kept with them, every native run of a model in a
sweep, and a later sweep with the same cache, prices its plans with the same clock, so that the
same model, inputs and budget give the same plan (the figures move by several percent between two
measurements on a loaded machine, enough to turn a near tie between two regions).
"""

from __future__ import annotations

from profiler.api import times_key

from ..checkpoint_clock import KEY
from .profilecache import ProfileCache

KIND = "clock"


def _key(profile) -> str:
    """The profile's trace, as its op times are keyed (profiler.api.times_key)."""
    return times_key(profile.joint, profile.grouping, profile.device, profile.times.runs)


def restore_clock(profile, cache: ProfileCache) -> bool:
    """Put the clock kept for ``profile``'s trace on its op graph (``profile.regroup("op")``, the
    graph the native planner prices); False when the cache has none."""
    figures = cache.load_figures(_key(profile), KIND)
    if figures is None:
        return False
    profile.regroup("op").graph.graph[KEY] = figures
    return True


def keep_clock(profile, cache: ProfileCache) -> None:
    """Store the clock the native planner measured on ``profile``'s op graph (nothing when it priced
    with the synthetic figures alone: those are measured again, with the model's own region)."""
    figures = profile.regroup("op").graph.graph.get(KEY)
    if figures is not None and figures.get("source") != "synthetic":
        cache.store_figures(_key(profile), KIND, figures)


__all__ = ["keep_clock", "restore_clock"]
