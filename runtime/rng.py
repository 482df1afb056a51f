"""Random ops replay the RNG state of their first run, and the step leaves the global RNG where an
unplanned step would.

Random groups are contiguous runs of the trace, so each one's draws are a contiguous stretch of the
original step's random stream: the generator state before its first random op is all a replay
needs. When the schedule first computes the random groups in trace order, those states are taken on
the fly ("lazy"). When it does not, a pre-pass at the start of the forward advances the generator
through each group's draws in trace order (running the same random ops on empty tensors of the same
shapes: what an op draws depends on its shapes and arguments, not on the values) and records the
state before each; every computation is then a replay.

The recorded states belong to one call of the planned module, not to the module: a training loop
may run two forwards before their backwards (R-Drop's ``f(m(x)) + f(m(x))``, ``l1.backward();
l2.backward()``), and the second forward's states must not replace the first's, or the first
backward replays the second forward's dropout masks (measured: gradients up to 48% off). So
:meth:`RngReplay.start_step` returns a fresh :class:`CallStates` that the executor keeps with that
call's held values, and :meth:`RngReplay.run` reads and writes only the states it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from profiler.state import RngState, get_rng_state, set_rng_state


def _dummy(value):
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device=value.device)
    if isinstance(value, (list, tuple)):
        return type(value)(_dummy(v) for v in value)
    return value


@dataclass
class CallStates:
    """One call's record of the generator state before each random group's draws."""

    states: dict[str, RngState] = field(default_factory=dict)


@dataclass(frozen=True)
class RngReplay:
    """How a schedule's random groups draw: which groups, in which order, and whether a pre-pass
    records their states. Holds no per-call state (see the module docstring)."""

    devices: list[int]
    random_order: list[str]
    random_ops: dict[str, list]
    prepass: bool

    def start_step(self) -> CallStates:
        """The states of a new call (the pre-pass, when the schedule needs it, fills them now)."""
        call = CallStates()
        if not self.prepass:
            return call
        with torch.no_grad():
            for group in self.random_order:
                call.states[group] = get_rng_state(self.devices)
                for op, args, kwargs in self.random_ops[group]:
                    op(*_dummy(args), **_dummy(kwargs))
        return call

    def run(self, call: CallStates, group: str, function, *args):
        """Run a random group: the first time in trace order draws from the global generator;
        any other time replays the state recorded in ``call`` and puts the global generator back."""
        if group not in call.states:
            call.states[group] = get_rng_state(self.devices)
            return function(*args)
        current = get_rng_state(self.devices)
        set_rng_state(call.states[group])
        try:
            return function(*args)
        finally:
            set_rng_state(current)


def first_computations_in_order(steps, random_order: list[str], forward_end: int) -> bool:
    """Whether the schedule computes each random group first within the forward phase, in trace order."""
    first_seen: list[str] = []
    seen: set[str] = set()
    random = set(random_order)
    for position, (kind, node) in enumerate(steps):
        if kind == "compute" and node in random and node not in seen:
            if position > forward_end:
                return False
            seen.add(node)
            first_seen.append(node)
    return first_seen == random_order


__all__ = ["CallStates", "RngReplay", "first_computations_in_order", "get_rng_state", "set_rng_state"]
