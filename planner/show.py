"""``plan-checkpoints show plan.json [--out memory.png]``: a saved plan in words, and a picture of
its predicted memory over the schedule's steps against the budget and the un-checkpointed peak."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from solvers import simulate
from solvers.schedule import COMPUTE

from .budget import format_bytes
from .planfile import Plan, load
from .plots import memory_plot


class ShowUsageError(ValueError):
    """A bad command line for ``show``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ShowUsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plan-checkpoints show", description="Describe a saved plan; optionally plot its memory.")
    parser.add_argument("plan", help="a plan file written by plan-checkpoints")
    parser.add_argument("--out", default=None, help="write a PNG of predicted memory over the schedule here")
    return parser


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
    plan = load(args.plan)
    print(plan.summary())
    if args.out:
        profile = memory_profile(plan)
        title = (f"{plan.model or 'model'}: {plan.method} at {plan.budget_text}, peak "
                 f"{format_bytes(profile.peak_bytes)} of {format_bytes(plan.budget_bytes)}")
        memory_plot(title, profile.memory, plan.fixed_bytes, plan.budget_bytes, plan.unplanned_peak_bytes,
                    profile.loss_step, args.out)
        print(f"Memory plot written to {args.out}")
    return 0
