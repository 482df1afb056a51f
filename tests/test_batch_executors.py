"""Sweeps for both executors (docs/batch.md, "Executors"): ``executor: [native, traced]`` plans each
run natively and traced side by side, a sweep's native row is the plan ``planner.plan`` returns for
the same model, inputs and budget, its plan file is a native plan file that ``show`` and
``planner.load`` read, and executor mistakes in a sweep file are one-line errors naming what is
accepted."""

import json
import os

import pytest
import yaml

from test_batch import SWEEP_MODEL, assert_sweep_file_refused, rows, write
from test_cli import ROOT, assert_clean_error, run, run_here

import planner

OK = {"optimal", "optimal-in-order", "feasible", "heuristic"}
EXECUTORS_CONFIG = os.path.join(ROOT, "configs", "gpt2-executors.yaml")


def _model_file(config: dict):
    """The example config's model, built in this process as the sweep builds it (the model file's
    functions with the config's keyword arguments)."""
    from planner.cli.modelfile import load_model_file

    entry = config["models"][0]
    return load_model_file(os.path.join(ROOT, "configs", entry["file"]), model_kwargs=entry["model_kwargs"],
                           inputs_kwargs=entry["inputs_kwargs"])


def test_a_sweep_compares_executors_and_its_native_row_is_planner_plans(tmp_path, capsys):
    from planner.sweep.clockcache import restore_clock
    from planner.sweep.profilecache import ProfileCache

    config = yaml.safe_load(open(EXECUTORS_CONFIG))
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = run("batch", EXECUTORS_CONFIG, "--out", out, "--cache-dir", cache)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("2 runs: 2 planned;"), result.stdout
    assert "Traceback" not in result.stderr
    table = {row["executor"]: row for row in rows(out)}
    assert sorted(table) == ["native", "traced"]
    for row in table.values():
        assert row["status"] in OK and row["solver"] == "auto" and row["budget"] == "60%", row
        assert int(row["predicted_peak_bytes"]) <= int(row["budget_bytes"]), row
    native, traced = table["native"], table["traced"]
    # The native row: regions measured as planner.plan measures its plans, within the budget, in a
    # native plan file that planner.load reads.
    plan = planner.load(out / "plans" / "gpt2-tiny__60pct__auto__native.json")
    assert isinstance(plan, planner.NativePlan) and plan.regions and plan.method == native["method"] == "regions"
    assert plan.predicted_peak_bytes == int(native["predicted_peak_bytes"])
    assert int(native["measured_peak_bytes"]) == plan.measured_peak_bytes <= int(native["budget_bytes"])
    # The traced row: auto's choice among the traced graph's solvers, predicted (not measured on a CPU).
    record = json.load(open(out / "runs" / "gpt2-tiny__60pct__auto__traced.json"))
    assert traced["method"] != "regions" and traced["measured_peak_bytes"] == ""
    assert record["executor"] == "traced" and record["settings"]["executor_given"]
    saved = json.load(open(out / "plans" / "gpt2-tiny__60pct__auto__traced.json"))
    assert saved["predicted_peak_bytes"] == int(traced["predicted_peak_bytes"]) and "schedule" in saved
    markdown = (out / "results.md").read_text().splitlines()
    assert markdown[0].startswith("| model | budget | solver | executor | predicted peak | measured peak |")
    assert json.load(open(out / "runs" / "gpt2-tiny__60pct__auto__native.json"))["profile"]["cached"] is False

    code, shown, _ = run_here(capsys, "show", out / "plans" / "gpt2-tiny__60pct__auto__native.json")
    assert code == 0 and "Executor:          native" in shown and "Checkpointed:" in shown, shown

    # planner.plan on the same model, inputs, budget and measurements (the sweep's cache) gives the same plan.
    loaded = _model_file(config)
    model, inputs, loss_fn = loaded.model, loaded.example_inputs, loaded.loss_fn
    times = ProfileCache(cache)
    profile = planner.profile_for(model, inputs, loss_fn=loss_fn, times_cache=times)
    assert times.hits == 1 and restore_clock(profile, times)  # the op times and checkpoint clock the sweep measured
    made = planner.plan(model, inputs, "60%", loss_fn=loss_fn, time_limit=config["time_limit"], profile=profile)
    assert made.regions == plan.regions
    assert made.predicted_seconds == plan.predicted_seconds  # priced with the same clock (re-measured, it differs)
    assert made.predicted_peak_bytes == int(native["predicted_peak_bytes"])
    assert made.method == native["method"] and made.status == native["status"]


def test_without_an_executor_each_solver_gets_planner_plans_default(tmp_path):
    """No ``executor`` key: ``auto`` and ``regions`` plan natively (planner.plan's default), the traced
    graph's solvers traced; the run ids are those of a sweep without executors."""
    from planner.sweep import executors
    from planner.sweep.config import load_sweep

    assert executors.EXECUTORS == planner.EXECUTORS  # the sweep file's names are planner.plan's
    write(tmp_path / "model.py", SWEEP_MODEL)
    write(tmp_path / "sweep.yaml", """
        budgets: [60%]
        solvers: [auto, regions, dp]
        models:
          - {file: model.py}
          - {name: both, file: model.py, executor: [native, traced], solvers: [auto, regions, dp]}
          - {name: traced, file: model.py, executor: traced, solvers: [auto, dp]}
    """)
    sweep = load_sweep(str(tmp_path / "sweep.yaml"))
    planned = [(run.id, run.executor.name, run.executor.plan_argument) for run in sweep.runs]
    assert planned == [
        ("model__60pct__auto", "native", None), ("model__60pct__regions", "native", None),
        ("model__60pct__dp", "traced", None),
        ("both__60pct__auto__native", "native", "native"), ("both__60pct__auto__traced", "traced", "traced"),
        ("both__60pct__regions__native", "native", "native"), ("both__60pct__dp__traced", "traced", "traced"),
        ("traced__60pct__auto", "traced", "traced"), ("traced__60pct__dp", "traced", "traced"),
    ]
    first, named = sweep.runs[0], sweep.runs[3]
    assert first.digest() != named.digest()  # a record made for the default is not reused for a named executor


EXECUTOR_ERRORS = [
    ("budgets: [60%]\nexecutor: gpu\nmodels:\n  - file: model.py\n",
     ["line 2", "unknown executor 'gpu'", "native (torch.utils.checkpoint", "traced (", "[native, traced]"]),
    ("budgets: [60%]\nmodels:\n  - file: model.py\n    executor: [native, eager]\n",
     ["line 4", "unknown executor 'eager'", "accepted: native"]),
    ("budgets: [60%]\nexecutor: [native, native]\nmodels:\n  - file: model.py\n", ["line 2", "listed twice"]),
    ("budgets: [60%]\nexecutor: native\nsolvers: [auto, dp]\nmodels:\n  - file: model.py\n",
     ["line 3", "solver dp makes schedules of the traced graph", "executor native accepts auto, regions",
      "executor: traced or [native, traced]"]),
    ("budgets: [60%]\nmodels:\n  - file: model.py\n    executor: native\n    solvers: [ilp]\n",
     ["line 5", "solver ilp", "executor native accepts auto, regions"]),
    ("budgets: [60%]\nexecutor: traced\nsolvers: [regions]\nmodels:\n  - file: model.py\n",
     ["line 3", "solver regions plans the native executor", "executor: native or [native, traced]"]),
]


@pytest.mark.parametrize("text, phrases", EXECUTOR_ERRORS, ids=[p[1][1] for p in EXECUTOR_ERRORS])
def test_executor_mistakes_name_the_line_and_what_is_accepted(tmp_path, text, phrases):
    assert_sweep_file_refused(tmp_path, text, phrases)


def test_a_traced_only_solver_for_the_native_executor_is_refused_by_the_command(tmp_path):
    write(tmp_path / "model.py", SWEEP_MODEL)
    config = write(tmp_path / "sweep.yaml", "budgets: [60%]\nexecutor: native\nsolvers: [dp]\nmodels:\n  - file: model.py\n")
    out = tmp_path / "out"
    result = run("batch", config, "--out", out)
    assert_clean_error(result, 2, f"{config}, line 3", "solver dp", "executor native accepts auto, regions")
    assert not out.exists()  # refused before anything was written


def test_native_runs_record_their_failures_and_the_sweep_goes_on(tmp_path):
    """A budget below what checkpointing the modules reaches is the native run's 'infeasible' with the
    least budget, a model that does not build its 'error'; the traced run beside them still plans."""
    write(tmp_path / "model.py", SWEEP_MODEL)
    config = write(tmp_path / "sweep.yaml", """
        solvers: [auto]
        models:
          - {name: broken, file: model.py, model_kwargs: {fail: true}, budgets: [100%]}
          - {name: good, file: model.py, model_kwargs: {depth: 3}, budgets: [1kB], executor: [native, traced]}
    """)
    out = tmp_path / "out"
    result = run("batch", config, "--out", out, "-q", "--no-cache")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("3 runs: 0 planned, 1 error, 2 infeasible;"), result.stdout
    assert "Traceback" not in result.stderr
    table = {(r["model"], r["executor"]): r for r in rows(out)}
    assert table["broken", "native"]["status"] == "error"
    assert "RuntimeError: this model does not build" in table["broken", "native"]["error"]
    native = table["good", "native"]
    assert native["status"] == "infeasible" and native["method"] == "regions", native
    assert "below the least that checkpointing the model's modules reaches" in native["error"]
    assert table["good", "traced"]["status"] == "infeasible"
    record = json.load(open(out / "runs" / "good__1kB__auto__native.json"))
    assert record["min_budget_bytes"] > 1000 and record["executor"] == "native"
    assert "good at 1kB with auto: infeasible" in result.stderr  # auto's default executor: no label
    assert "good at 1kB with auto (traced): infeasible" in result.stderr
    assert not (out / "plans").exists() or not os.listdir(out / "plans")  # no plan, no half-written file

