"""``plan-checkpoints show plan.json [--out memory.png]``: a saved plan in words, and a picture of
its predicted memory over the schedule's steps against the budget and the un-checkpointed peak."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from solvers import simulate
from solvers.schedule import COMPUTE

from ..budget import format_bytes
from ..loading import load
from ..planfile import Plan
from .plots import memory_plot


class ShowUsageError(ValueError):
    """A bad command line for ``show``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ShowUsageError(message)


def _parser() -> argparse.ArgumentParser:
    from .verbosity import add_verbosity

    parser = _Parser(prog="plan-checkpoints show", description="Describe a saved plan; optionally plot its memory.")
    parser.add_argument("plan", help="a plan file written by plan-checkpoints")
    parser.add_argument("--out", default=None,
                        help="write a PNG of predicted memory over the schedule here (never the plan file itself)")
    add_verbosity(parser)
    return parser


# Terminal control sequences (CSI, OSC, other ESC sequences), other control characters, and the
# bidirectional overrides that reorder what a terminal shows: a plan file's text fields are data.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with terminal escape sequences removed and other control characters shown as '?'
    (newlines kept)."""
    return _CONTROLS.sub("?", _ESCAPES.sub("", text))


@dataclass(frozen=True)
class MemoryProfile:
    """The schedule's memory, whole step (fixed bytes included), per step."""

    memory: tuple[int, ...]  # bytes of the schedule (fixed bytes excluded) during each step
    peak_bytes: int  # of the whole step
    loss_step: int | None  # index of the step computing the loss


def memory_profile(plan: Plan) -> MemoryProfile:
    outcome = simulate(plan.graph, plan.schedule, record_memory=True)
    loss = plan.graph.graph.get("loss_node")
    loss_step = next((i for i, (kind, node) in enumerate(plan.schedule) if kind == COMPUTE and node == loss), None)
    return MemoryProfile(outcome.memory, plan.fixed_bytes + outcome.peak_bytes, loss_step)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.out:  # before reading anything: never over the plan file, never a folder or a device
        from ..files import check_output

        check_output(args.out, inputs=[args.plan])
    plan = load(args.plan)
    print(printable(plan.summary()))
    if args.out:
        profile = memory_profile(plan)
        title = printable(f"{plan.model or 'model'}: {plan.method} at {plan.budget_text}, peak "
                          f"{format_bytes(profile.peak_bytes)} of {format_bytes(plan.budget_bytes)}")
        memory_plot(title, profile.memory, plan.fixed_bytes, plan.budget_bytes, plan.unplanned_peak_bytes,
                    profile.loss_step, args.out)
        print(f"Memory plot written to {args.out}")
    return 0
