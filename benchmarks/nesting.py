"""Does nesting non-reentrant checkpoints pay? Measured against the best flat native plan.

A stack of ``groups`` groups (``nn.Sequential``) of ``per_group`` residual blocks
(benchmarks/models.py ``ResidualBlock``), trained on CPU with one torch thread. Measured (peak by the
allocator's events, profiler.measure_step; seconds the median of ``--repeats`` steps):

- no checkpointing; every group checkpointed; every block checkpointed (both flat);
- nested: every group checkpointed and every block inside it too (two levels of
  ``torch.utils.checkpoint(use_reentrant=False)``);
- the native planner's plan (flat regions, the exact method) at the nested plan's measured peak
  (``planner.plan(model, inputs, budget=<bytes>)``): measured too, or refused with its least budget.

Nesting pays where the flat planner cannot reach the nested plan's peak, or reaches it with a
slower step (docs/native.md, "Nested checkpoints").

    python benchmarks/nesting.py [--groups 4] [--per-group 4] [--width 256] [--hidden 1024] [--batch 512]
                                 [--repeats 5] [--out docs/benchmarks/nesting.md]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)  # after the project root: benchmarks/solvers.py must not shadow the solvers package
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import planner  # noqa: E402
from profiler.memory import measure_step  # noqa: E402

from models import ResidualBlock  # noqa: E402
from tables import markdown_table, publish  # noqa: E402


class Grouped(nn.Module):
    def __init__(self, groups: int, per_group: int, width: int, hidden: int):
        super().__init__()
        torch.manual_seed(0)
        self.groups = nn.ModuleList(nn.Sequential(*[ResidualBlock(width, hidden) for _ in range(per_group)])
                                    for _ in range(groups))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for group in self.groups:
            x = group(x)
        return self.head(x)


def _loss(output):
    return output.float().pow(2).mean()


def checkpointed(modules):
    """Wrap each module's forward in non-reentrant checkpointing; returns an undo function."""
    originals = []
    for module in modules:
        original = module.forward
        module.forward = (lambda f: lambda *args: checkpoint(f, *args, use_reentrant=False))(original)
        originals.append((module, original))

    def undo():
        for module, _ in reversed(originals):
            del module.forward

    return undo


def measured(model, inputs, modules, repeats: int):
    undo = checkpointed(modules)
    try:
        return measure_step(model, (inputs,), loss_fn=_loss, repeats=repeats)
    finally:
        undo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--per-group", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Grouped(args.groups, args.per_group, args.width, args.hidden)
    inputs = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))
    groups = list(model.groups)
    blocks = [block for group in groups for block in group]
    rows = []
    plans = {"none": [], "groups (flat)": groups, "blocks (flat)": blocks, "groups and their blocks (nested)": blocks + groups}
    results = {}
    for name, modules in plans.items():
        results[name] = measured(model, inputs, modules, args.repeats)
    base = results["none"]
    for name, outcome in results.items():
        rows.append((name, f"{outcome.peak_bytes:,}", f"{outcome.peak_bytes / base.peak_bytes:.1%}",
                     f"{outcome.seconds * 1000:.0f}", f"{outcome.seconds / base.seconds - 1:+.1%}"))
    nested = results["groups and their blocks (nested)"]
    try:
        plan = planner.plan(model, (inputs,), budget=int(nested.peak_bytes), loss_fn=_loss)
        again = measured(model, inputs, [], args.repeats)  # the eager step again, beside the plan's
        shown = ", ".join(plan.regions[:6]) + (" ..." if len(plan.regions) > 6 else "")
        rows.append((f"native planner at the nested peak ({plan.status}): {shown}", f"{plan.measured_peak_bytes:,}",
                     f"{plan.measured_peak_bytes / base.peak_bytes:.1%}", f"{plan.measured_seconds * 1000:.0f}",
                     f"{plan.measured_seconds / again.seconds - 1:+.1%}"))
    except planner.BudgetInfeasible as error:
        rows.append((f"native planner at the nested peak: refused, least {error.min_budget:,} B", "-", "-", "-", "-"))
    text = ("# Nested checkpoints against flat native plans\n\n"
            f"`python benchmarks/nesting.py --groups {args.groups} --per-group {args.per_group} --width {args.width} "
            f"--hidden {args.hidden} --batch {args.batch} --repeats {args.repeats}` (CPU, one thread, load "
            f"{os.getloadavg()[0]:.1f}).\n\n"
            + markdown_table(("plan", "measured peak B", "of no checkpointing", "step ms", "step over none"), rows) + "\n")
    publish(text, args.out)


if __name__ == "__main__":
    main()
