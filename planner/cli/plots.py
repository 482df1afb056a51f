"""PNG plots for ``batch`` (overhead against peak, per model) and ``show`` (memory over a schedule).

Matplotlib's Agg back end, through Figure objects rather than pyplot: no display is needed and no
global state is shared between plots. Every PNG is written to a temporary file and renamed.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from collections.abc import Sequence

from ..files import write_atomic

MIB = 2**20


@dataclass(frozen=True)
class Point:
    """One planned run on a model's plot."""

    solver: str
    budget: str
    budget_bytes: int
    peak_bytes: int
    overhead: float


def _figure(width: float = 8.0, height: float = 5.0):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save_png(figure, path: str | os.PathLike) -> None:
    """Write the figure as a PNG at ``path``, atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    write_atomic(path, buffer.getvalue())


def sweep_plot(model: str, points: Sequence[Point], unplanned_peak_bytes: int | None, path: str) -> None:
    """Predicted overhead against predicted peak: one marker set per solver, joined in order of
    peak; each budget a dotted vertical line labelled at the top."""
    figure = _figure()
    axes = figure.subplots()
    markers = "os^Dv<>pX*"
    solvers = list(dict.fromkeys(p.solver for p in points))  # in the sweep's order
    for index, solver in enumerate(solvers):
        mine = sorted((p for p in points if p.solver == solver), key=lambda p: p.peak_bytes)
        axes.plot([p.peak_bytes / MIB for p in mine], [100 * p.overhead for p in mine],
                  marker=markers[index % len(markers)], label=solver, alpha=0.85)
    budgets = {}
    for point in points:
        budgets.setdefault(point.budget_bytes, point.budget)
    for budget_bytes, text in sorted(budgets.items()):
        axes.axvline(budget_bytes / MIB, color="0.6", linestyle=":", linewidth=1)
        axes.annotate(text, (budget_bytes / MIB, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                      ha="right", va="top", fontsize=8, color="0.4")
    if unplanned_peak_bytes:
        axes.axvline(unplanned_peak_bytes / MIB, color="tab:red", linestyle="--", linewidth=1,
                     label="no checkpointing")
    axes.set_xlabel("predicted peak memory of the step (MiB)")
    axes.set_ylabel("predicted overhead (% of the step's time)")
    axes.set_title(f"{model}: overhead against memory, per solver")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    save_png(figure, path)


def memory_plot(title: str, memory: Sequence[int], fixed_bytes: int, budget_bytes: int,
                unplanned_peak_bytes: int, loss_step: int | None, path: str) -> None:
    """Memory of the whole step over the schedule's steps, against the budget and the
    un-checkpointed peak; the loss step splits forward from backward."""
    figure = _figure(9.0, 4.5)
    axes = figure.subplots()
    steps = range(len(memory))
    total = [(fixed_bytes + m) / MIB for m in memory]
    axes.fill_between(steps, 0, fixed_bytes / MIB, color="0.85", step="post",
                      label="parameters, buffers, inputs")
    axes.plot(steps, total, drawstyle="steps-post", color="tab:blue", linewidth=1.2, label="planned step")
    axes.axhline(budget_bytes / MIB, color="tab:orange", linestyle="--", label="budget")
    axes.axhline(unplanned_peak_bytes / MIB, color="tab:red", linestyle=":", label="peak without checkpointing")
    if loss_step is not None:
        axes.axvline(loss_step, color="0.5", linewidth=0.8)
        axes.annotate(" loss: forward | backward", (loss_step, 0.02), xycoords=("data", "axes fraction"),
                      fontsize=8, color="0.4")
    axes.set_xlabel("schedule step")
    axes.set_ylabel("predicted memory (MiB)")
    axes.set_ylim(bottom=0)
    axes.set_xlim(0, max(1, len(memory) - 1))
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper right")
    save_png(figure, path)
