"""``plan-checkpoints batch``, run as a user runs it: the example configs end to end, a sweep killed
with SIGKILL and resumed, failing runs recorded while the others go on, and sweep files with
mistakes refused with the file, the line and what is accepted."""

import csv
import glob
import json
import os
import signal
import struct
import subprocess
import textwrap
import time

import pytest
import yaml

from test_cli import ROOT, assert_clean_error, command, run

import planner

OK = {"optimal", "optimal-in-order", "feasible", "heuristic"}

# A small MLP whose build can be slowed down (to kill a sweep at a known point) or made to fail. The
# delay applies only where SWEEP_SLOW_BUILD is set: in the sweep that is killed, not in the ones that run
# to the end (the same config, so the same runs and cache, without sleeping through the delay).
SWEEP_MODEL = """
import os
import time

import torch
from torch import nn

def build_model(width=32, depth=8, delay=0.0, fail=False):
    if fail:
        raise RuntimeError("this model does not build")
    if os.environ.get("SWEEP_SLOW_BUILD"):
        time.sleep(delay)
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def example_inputs(batch=256, width=32):
    return (torch.randn(batch, width, generator=torch.Generator().manual_seed(0)),)
"""


def write(path, text):
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def rows(folder):
    with open(os.path.join(folder, "results.csv")) as file:
        return list(csv.DictReader(file))


def assert_png(path, min_width=400, min_height=250):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= min_width and height >= min_height, (width, height)
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes: an empty plot?"


def temporaries(folder):
    return [p for p in glob.glob(os.path.join(folder, "**", ".tmp-*"), recursive=True)]


def expected_runs(config_path):
    """models x budgets x solvers of a config, counted from the YAML itself."""
    config = yaml.safe_load(open(config_path))
    total = 0
    for model in config["models"]:
        total += len(model.get("budgets", config.get("budgets", []))) * len(model.get("solvers", config.get("solvers", ["auto"])))
    return config, total


# -- the example configs ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, jobs", [("mlp-sweep", 2), ("gpt2-tiny", 1)])
def test_example_configs_run_end_to_end(tmp_path, name, jobs):
    config_path = os.path.join(ROOT, "configs", f"{name}.yaml")
    config, total = expected_runs(config_path)
    out = tmp_path / "out"
    result = run("batch", config_path, "--out", out, "--jobs", jobs, *(["-q"] if jobs == 1 else []))
    assert result.returncode == 0, (result.stdout, result.stderr)
    if jobs == 1:
        assert result.stderr == ""  # -q: nothing on stderr when every run plans
    else:  # off a terminal, a plain line per step: each model profiled, each run done
        assert f"[{total}/{total} done]" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout.startswith(f"{total} runs: {total} planned;"), result.stdout
    table = rows(out)
    assert len(table) == total
    for row in table:
        assert row["status"] in OK, row
        assert int(row["predicted_peak_bytes"]) <= int(row["budget_bytes"]) <= int(row["unplanned_peak_bytes"])
        plan = planner.load(out / "plans" / f"{row['model']}__{row['budget'].replace('%', 'pct')}__{row['solver']}.json")
        assert plan.predicted_peak_bytes == int(row["predicted_peak_bytes"])
        assert plan.method == row["method"]
    for row in table:
        if row["budget"] == "100%":  # nothing to recompute when everything fits
            assert float(row["predicted_overhead"]) == 0.0 and row["predicted_peak_bytes"] == row["unplanned_peak_bytes"]
        else:
            assert int(row["predicted_peak_bytes"]) < int(row["unplanned_peak_bytes"])
    markdown = (out / "results.md").read_text().splitlines()
    assert markdown[0] == ("| model | budget | solver | executor | predicted peak | measured peak | predicted overhead | "
                           "solve time | status | proven gap | error |")
    assert len(markdown) == total + 2
    for model in config["models"]:
        assert_png(out / "plots" / f"{model['name']}.png")
    assert not temporaries(out)


# -- kill and resume --------------------------------------------------------------------------------
def _without(table, *columns):
    return [{k: v for k, v in row.items() if k not in columns} for row in table]


def test_a_killed_sweep_resumes_without_redoing_finished_runs(tmp_path):
    write(tmp_path / "model.py", SWEEP_MODEL)
    # In the killed sweep the second model takes 3 s to build: once the first model's first run is
    # recorded, the sweep is killed while the second model is still being built, with some runs done
    # and some not. The reference and resumed sweeps build it at once.
    config = write(tmp_path / "sweep.yaml", """
        budgets: [100%, 85%, 75%]
        solvers: [chen-sqrtn, chen-greedy]
        models:
          - {name: fast, file: model.py}
          - {name: slow, file: model.py, model_kwargs: {delay: 3.0}, inputs_kwargs: {batch: 384}}
    """)
    cache = tmp_path / "cache"  # shared: both sweeps plan from the same measured times
    reference = run("batch", config, "--out", tmp_path / "reference", "--cache-dir", cache)
    assert reference.returncode == 0, reference.stderr

    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), SWEEP_SLOW_BUILD="1")
    process = subprocess.Popen([*command(), "batch", str(config), "--out", str(killed), "--cache-dir", str(cache)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not glob.glob(str(killed / "runs" / "*.json")):
            assert process.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "no run finished within 300 s"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    done = {p: open(p, "rb").read() for p in glob.glob(str(killed / "runs" / "*.json"))}
    assert 1 <= len(done) < 12, f"{len(done)} runs were done when the sweep was killed"
    for data in done.values():
        json.loads(data)  # every record there is whole
    for path in glob.glob(str(killed / "plans" / "*.json")):
        planner.load(path)  # and every plan

    resumed = run("batch", config, "--out", killed, "--cache-dir", cache)
    assert resumed.returncode == 0, resumed.stderr
    assert f"12 runs: 12 planned ({len(done)} from an earlier sweep)" in resumed.stdout
    for path, data in done.items():
        assert open(path, "rb").read() == data, f"{os.path.basename(path)} was done again"
    assert len(glob.glob(str(killed / "runs" / "*.json"))) == 12
    assert not temporaries(killed)

    # The same results as the uninterrupted sweep, but for how long each solve took.
    assert _without(rows(killed), "solve_seconds") == _without(rows(tmp_path / "reference"), "solve_seconds")
    # The resumed runs planned from the cached profile: the reference sweep timed the models, no other.
    records = [json.load(open(p)) for p in glob.glob(str(killed / "runs" / "*.json"))]
    assert all(r["profile"]["cached"] for r in records)
    assert not any(json.load(open(p))["profile"]["cached"] for p in glob.glob(str(tmp_path / "reference" / "runs" / "*.json")))


# -- failing runs -----------------------------------------------------------------------------------
def test_failing_runs_are_recorded_and_the_others_go_on(tmp_path):
    write(tmp_path / "model.py", SWEEP_MODEL)
    config = write(tmp_path / "sweep.yaml", """
        solvers: [chen-greedy]
        models:
          - name: broken
            file: model.py
            model_kwargs: {fail: true}
            budgets: [100%]
          - name: good
            file: model.py
            budgets: [100%, 1kB]
    """)
    out = tmp_path / "out"
    result = run("batch", config, "--out", out, "-q")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("3 runs: 1 planned, 1 error, 1 infeasible;"), result.stdout
    assert "Traceback" not in result.stderr
    failed = result.stderr.strip().splitlines()
    assert len(failed) == 2 and all(line.startswith("plan-checkpoints: ") for line in failed)
    table = {(r["model"], r["budget"]): r for r in rows(out)}
    assert table["broken", "100%"]["status"] == "error"
    assert "build_model()" in table["broken", "100%"]["error"]
    assert "RuntimeError: this model does not build (model.py, line 9)" in table["broken", "100%"]["error"]
    assert table["good", "1kB"]["status"] == "infeasible"
    assert "below the minimum" in table["good", "1kB"]["error"]
    assert table["good", "100%"]["status"] == "optimal" and table["good", "100%"]["error"] == ""
    assert sorted(os.listdir(out / "plans")) == ["good__100pct__chen-greedy.json"]
    assert os.listdir(out / "plots") == ["good.png"]



# -- sweep files with mistakes ----------------------------------------------------------------------
# Through the command line for the three kinds of mistake (YAML, keys, budgets); the other checks of
# the file are read in this process, which is quicker than starting the command each time.
CLI_CONFIG_ERRORS = [
    pytest.param("""
        models:
          - file: model.py
            budgets: [60%, 50%
        solvers: [dp]
        """, ["line 4", "not valid YAML"], id="malformed-yaml"),
    pytest.param("""
        budgets: [60%]
        solver: [dp]
        models:
          - file: model.py
        """, ["line 2", "unknown key 'solver' in the sweep", "solvers:", "time_limit:"], id="unknown-top-key"),
    pytest.param("""
        budgets:
          - 60%
          - 12XB
        models:
          - file: model.py
        """, ["line 3", "unknown unit 'XB'", "12GiB"], id="bad-budget"),
]


@pytest.mark.parametrize("text, phrases", CLI_CONFIG_ERRORS)
def test_sweep_file_mistakes_are_one_line_errors_with_the_line(tmp_path, text, phrases):
    write(tmp_path / "model.py", SWEEP_MODEL)
    config = write(tmp_path / "sweep.yaml", text)
    out = tmp_path / "out"
    result = run("batch", config, "--out", out)
    assert_clean_error(result, 2, f"{config}, line", *phrases)
    assert not out.exists()  # refused before anything was written


CONFIG_ERRORS = [
    ("budgets: [60%]\nmodels:\n  - file: model.py\n    model_kwarg: {width: 8}\n",
     ["line 4", "unknown key 'model_kwarg' in models[0]", "model_kwargs:", "inputs_kwargs:"]),
    ("budgets: [60%]\nsolvers: [dp, magic]\nmodels:\n  - file: model.py\n",
     ["line 2", "unknown solver 'magic'", "chen-greedy"]),
    ("budgets: [60%]\nexecutor: traced\nsolvers: [regions]\nmodels:\n  - file: model.py\n",
     ["line 3", "solver regions plans the native executor", "executor: native or [native, traced]"]),
    ("budgets: [60%]\nmodels:\n  - file: model.py\n  - file: nowhere.py\n", ["line 4", "nowhere.py does not exist"]),
    ("models:\n  - file: model.py\n    budgets: [60%, -5GB]\n", ["line 3", "'-5GB' is not valid", "60%"]),
    ("budgets: [60%, 60%]\nmodels:\n  - file: model.py\n", ["line 1", "listed twice"]),
    ("models:\n  - file: model.py\n", ["line 2", "no budgets"]),
    ("budgets: [60%]\nmodels:\n  - file: model.py\n  - file: model.py\n", ["line 4", "two models are named 'model'"]),
    ("budgets: [60%]\ntime_limit: -3\nmodels:\n  - file: model.py\n", ["line 2", "positive number of seconds"]),
    ("budgets: [60%]\nmodels:\n  - file: model.py\n    inputs_kwargs: [1, 2]\n", ["line 4", "mapping of keyword"]),
    ("budgets: [60%]\nmodels: {file: model.py}\n", ["line 2", "models must be a list"]),
    ("", ["the file is empty"]),
]


@pytest.mark.parametrize("text, phrases", CONFIG_ERRORS, ids=[p[1][1] if len(p[1]) > 1 else p[1][0] for p in CONFIG_ERRORS])
def test_sweep_file_checks_name_the_line_and_what_is_accepted(tmp_path, text, phrases):
    assert_sweep_file_refused(tmp_path, text, phrases)


def assert_sweep_file_refused(tmp_path, text: str, phrases) -> None:
    """The sweep file ``text`` (beside a model file) is refused by one line naming the file and
    every one of ``phrases``."""
    from planner.sweep.config import ConfigError, load_sweep

    write(tmp_path / "model.py", SWEEP_MODEL)
    (tmp_path / "sweep.yaml").write_text(text)
    with pytest.raises(ConfigError) as error:
        load_sweep(str(tmp_path / "sweep.yaml"))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'sweep.yaml'}") and "\n" not in message
    for phrase in phrases:
        assert phrase in message, message


def test_a_sweep_file_lists_models_x_budgets_x_solvers_with_their_settings(tmp_path):
    from planner.sweep.config import load_sweep

    write(tmp_path / "model.py", SWEEP_MODEL)
    write(tmp_path / "sweep.yaml", """
        budgets: [60%, 12GB]
        solvers: [chen-greedy, dp]
        time_limit: 5
        models:
          - {file: model.py, model_kwargs: {width: 16}}
          - {name: other, file: model.py, budgets: 1GiB, solvers: [revolve], granularity: op, time_limit: 2}
    """)
    sweep = load_sweep(str(tmp_path / "sweep.yaml"))
    assert [run.id for run in sweep.runs] == [
        "model__60pct__chen-greedy", "model__60pct__dp", "model__12GB__chen-greedy", "model__12GB__dp",
        "other__1GiB__revolve",
    ]
    first, last = sweep.runs[0], sweep.runs[-1]
    assert first.model.model_kwargs == {"width": 16} and first.model.time_limit == 5.0
    assert last.model.granularity == "op" and last.model.time_limit == 2.0 and last.budget.bytes == 2**30
    assert first.digest() != sweep.runs[1].digest()  # a record is only reused for the same settings


RESIDUAL_MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def build_model(depth=8):
    torch.manual_seed(0)
    return nn.Sequential(*[Block(32, 128) for _ in range(depth)])


def example_inputs(batch=256):
    return (torch.randn(batch, 32, generator=torch.Generator().manual_seed(0)),)
"""


def test_a_sweep_searches_finer_groupings_as_plan_does(tmp_path):
    """With the profiler's granularity a sweep's run plans like planner.plan: the chain methods also
    try every finer grouping (planner/granularity.py); with a fixed granularity neither searches."""
    from planner.sweep.config import ModelSpec, Run
    from planner.sweep.tasks import profile_model, solve_run

    path = write(tmp_path / "model.py", RESIDUAL_MODEL)
    budget = planner.parse_budget("75%")

    fixed = ModelSpec("residual", str(path), granularity="module:1")
    profiled = profile_model(fixed, None, None)
    assert profiled.finer == ()
    outcome = solve_run(Run("a", fixed, budget, "chen-greedy", None), profiled)
    assert outcome.status == "heuristic", outcome.error
    assert outcome.plan["granularity"] == "module:1"

    searched = ModelSpec("residual", str(path), granularity="module")
    profiled = profile_model(searched, None, None)
    labels = [label for label, _ in profiled.finer]
    assert labels and "op" == labels[-1] and profiled.granularity not in labels
    outcome = solve_run(Run("b", searched, budget, "chen-greedy", None), profiled)
    assert outcome.status == "heuristic", outcome.error
    assert outcome.plan["granularity"] in [profiled.granularity, *labels]
    given_only = planner.plan_from_profile(profiled.as_profile(), budget, solver="chen-greedy", finer=False)
    assert outcome.predicted_seconds <= given_only.predicted_seconds
