"""A sweep's results: run records on disk, and the tables and plots rebuilt from them.

A run is done when its record ``runs/<run id>.json`` exists for the run's current settings. The
record is the last file a run writes (after its plan), atomically, so a killed sweep leaves either a
whole record or none; the tables are always rebuilt from the records, never appended to.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import asdict
from collections.abc import Iterable

from ..budget import format_bytes
from ..files import write_atomic
from ..cli.plots import Point, sweep_plot
from .config import Run, Sweep
from .executors import default_executor
from .tasks import ERROR, INFEASIBLE, OK_STATUSES, Outcome, Profiled, profile_facts

RECORD_FORMAT = "plan-checkpoints-run/1"
NOT_RUN = "not run"

CSV_COLUMNS = (
    "model", "budget", "solver", "executor", "method", "status", "budget_bytes", "predicted_peak_bytes",
    "measured_peak_bytes", "unplanned_peak_bytes", "predicted_overhead", "solve_seconds", "gap", "error",
)
# Columns that come from measured or elapsed time: they differ between two sweeps that profile
# anew, and solve_seconds differs between any two sweeps.
TIMING_COLUMNS = ("predicted_overhead", "solve_seconds")


class Results:
    """The output folder of a sweep: plans/, runs/, plots/, results.csv, results.md."""

    def __init__(self, folder: str):
        self.folder = folder

    def record_path(self, run: Run) -> str:
        return os.path.join(self.folder, "runs", f"{run.id}.json")

    def plan_path(self, run: Run) -> str:
        return os.path.join(self.folder, "plans", f"{run.id}.json")

    def plot_path(self, model: str) -> str:
        return os.path.join(self.folder, "plots", f"{model}.png")

    def remove_temporaries(self) -> int:
        """Temporary files of writes a killed sweep did not finish: never read, safe to delete."""
        removed = 0
        for sub in ("", "runs", "plans", "plots"):
            folder = os.path.join(self.folder, sub)
            if os.path.isdir(folder):
                for name in os.listdir(folder):
                    if name.startswith(".tmp-"):
                        os.unlink(os.path.join(folder, name))
                        removed += 1
        return removed

    def read(self, run: Run) -> dict | None:
        """The run's record if it is whole, of this format and made for the run's current settings."""
        try:
            with open(self.record_path(run)) as file:
                record = json.load(file)
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            return None
        if record.get("settings_digest") != run.digest():
            return None  # made for other settings (the model file, kwargs, budget... changed)
        if record.get("status") in OK_STATUSES and not os.path.isfile(self.plan_path(run)):
            return None  # its plan was deleted: make it again
        return record

    def is_done(self, run: Run, retry_failed: bool) -> bool:
        record = self.read(run)
        return record is not None and not (retry_failed and record["status"] not in OK_STATUSES)

    def write(self, run: Run, outcome: Outcome, profiled: Profiled | None) -> dict:
        """The plan (if any), then the record that marks the run done; both atomic."""
        plan_file = None
        if outcome.plan is not None:
            write_atomic(self.plan_path(run), json.dumps(outcome.plan, indent=1))
            plan_file = os.path.relpath(self.plan_path(run), self.folder)
        figures = {k: v for k, v in asdict(outcome).items() if k not in ("plan", "profile")}
        if outcome.profile is not None or run.executor.name == "native":  # a native run profiles for itself
            profile = outcome.profile
        else:
            profile = None if profiled is None else profile_facts(profiled, profiled.cached)
        record = {
            "format": RECORD_FORMAT,
            "run": run.id,
            "model": run.model.name,
            "budget": str(run.budget),
            "solver": run.solver,
            "settings_digest": run.digest(),
            "settings": run.settings(),
            **figures,
            "executor": outcome.executor or run.executor.name,
            "plan_file": plan_file,
            "profile": profile,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_atomic(self.record_path(run), json.dumps(record, indent=1, sort_keys=True, default=str))
        return record

    def write_tables(self, sweep: Sweep) -> list[dict]:
        """results.csv and results.md from the records of the sweep's runs, in the sweep's order."""
        rows = [row_of(run, self.read(run)) for run in sweep.runs]
        write_atomic(os.path.join(self.folder, "results.csv"), csv_table(rows))
        write_atomic(os.path.join(self.folder, "results.md"), markdown_table(rows))
        return rows

    def write_plots(self, sweep: Sweep) -> list[str]:
        """One PNG per model that has at least one plan."""
        written = []
        for model in sweep.models:
            records = [r for r in (self.read(run) for run in sweep.runs_of(model)) if r and r["status"] in OK_STATUSES]
            if not records:
                continue
            points = [Point(_label(r["solver"], r["method"], r["executor"]), r["budget"], r["budget_bytes"],
                            r["predicted_peak_bytes"], r["predicted_overhead"]) for r in records]
            path = self.plot_path(model.name)
            sweep_plot(model.name, points, records[0]["unplanned_peak_bytes"], path)
            written.append(path)
        return written


def _label(solver: str, method: str | None, executor: str | None) -> str:
    """A plot's name for a solver's points: ``dp``, ``auto (regions)``, ``auto (dp, traced)``: the
    method ``auto`` chose, and the executor where it is not planner.plan's default for the solver."""
    what = [m for m in (method if method and method != solver else None,
                        executor if executor and executor != default_executor(solver) else None) if m]
    return f"{solver} ({', '.join(what)})" if what else solver


def row_of(run: Run, record: dict | None) -> dict:
    """A table row: the record's figures, or 'not run' for a run without a record."""
    row = {column: None for column in CSV_COLUMNS}
    row.update(model=run.model.name, budget=str(run.budget), solver=run.solver, executor=run.executor.name,
               status=NOT_RUN, error="")
    if record is not None:
        row.update({column: record.get(column) for column in CSV_COLUMNS if column not in ("model", "budget", "solver")})
        row["executor"] = row["executor"] or run.executor.name
    return row


def csv_table(rows: Iterable[dict]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return text.getvalue()


def _gap(row: dict) -> str:
    if row["status"] == "optimal":
        return "0% (optimal)"
    if row["status"] in ("feasible", "optimal-in-order") and row["gap"] is not None:  # an order-free gap
        return f"{row['gap']:.1%}"
    return "-"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Iterable[dict]) -> str:
    header = ("model", "budget", "solver", "executor", "predicted peak", "measured peak", "predicted overhead",
              "solve time", "status", "proven gap", "error")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in rows:
        planned = row["status"] in OK_STATUSES
        solver = row["solver"] if not row["method"] or row["method"] == row["solver"] else f"{row['solver']} ({row['method']})"
        cells = (
            row["model"], row["budget"], solver, row["executor"],
            format_bytes(row["predicted_peak_bytes"]) if planned else "-",
            format_bytes(row["measured_peak_bytes"]) if planned and row["measured_peak_bytes"] is not None else "-",
            f"{row['predicted_overhead']:+.1%}" if planned else "-",
            f"{row['solve_seconds']:.2f} s" if row["solve_seconds"] is not None else "-",
            row["status"], _gap(row) if planned else "-", row["error"] or "",
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def failures(rows: Iterable[dict]) -> dict[str, int]:
    """Counts of the failed statuses (infeasible, error, not run)."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["status"] not in OK_STATUSES:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


__all__ = ["CSV_COLUMNS", "ERROR", "INFEASIBLE", "NOT_RUN", "Results", "TIMING_COLUMNS", "failures"]
