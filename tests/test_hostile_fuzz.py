"""Hostile input and faults, fuzzing: random command lines, mutated plan files and sweep
files thrown at the command line in-process, each answered by a documented status and at most one
error line; a profile bounded in time; a plan file whose loss was edited (tests/hostile.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import hostile
import pytest
from hostile import (EXIT_FAILED_RUNS, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, TINY, assert_refused, cli, error_lines,
                     snapshot)


# The shared fixtures (tests/hostile.py): pytest finds them by these names.
plan_data = hostile.plan_data


# -- fuzzing: random command lines and mutated plan files ------------------------------------------------------------
def _main_in_process(argv: list[str]) -> tuple[int, str, str]:
    from planner.cli import command

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = command.main(argv)
        except SystemExit as stop:  # --help and --version (or an abbreviation: --he) end through argparse
            code = stop.code if isinstance(stop.code, int) else 0
            assert code == 0 and ("usage:" in out.getvalue() or out.getvalue().startswith("plan-checkpoints ")), argv
    return code, out.getvalue(), err.getvalue()


TOKENS = ["--budget", "--solver", "--out", "--granularity", "--time-limit", "--max-batch", "--max-overhead", "--json",
          "--device", "--model-fn", "--inputs-fn", "-q", "-v", "-vv", "--help", "--version", "batch", "show",
          "60%", "12GB", "-5GB", "0", "1e400", "1" + "0" * 50, "nan", "-1", "op", "module:0", "dp", "cpsat", "magic",
          "cuda", "", " ", "\x1b[31m", "nowhere.py", "folder.py", "raises.py", "plan.json", "sweep.yaml", "--", "=",
          "--budget=", "--out=raises.py", "--out=plan.json", "%", "ü", "\udcff"]


def test_fuzz_command_lines(tmp_path):
    """Random command lines against files that cost nothing to load (a missing file, a folder, a
    model file that raises at import, a plan file, a sweep file with a bad budget): every one ends
    with a documented status and at most one error line, no traceback, and no input changed."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    (tmp_path / "folder.py").mkdir()
    (tmp_path / "raises.py").write_text("raise RuntimeError('no model here')\n")
    (tmp_path / "plan.json").write_text('{"format": "plan-checkpoints/1"}')
    (tmp_path / "sweep.yaml").write_text("budgets: [12XB]\nmodels:\n  - file: raises.py\n")
    before = snapshot(tmp_path)
    cwd = os.getcwd()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=8)), max_size=7))
    def one(argv):
        code, _, err = _main_in_process(argv)
        assert code in (EXIT_OK, EXIT_FAILED_RUNS, EXIT_USAGE), (argv, code, err)
        assert "Traceback" not in err, (argv, err)
        errors = [line for line in err.splitlines() if line.startswith("plan-checkpoints: error:")]
        assert len(errors) == (code != EXIT_OK), (argv, err)
        assert snapshot(tmp_path) == before, argv

    os.chdir(tmp_path)
    try:
        one()
    finally:
        os.chdir(cwd)


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON value."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:4]):
            yield from _paths(item, (*prefix, index))


JUNK = [None, True, -1, 0, 2**70, 1e30, -0.5, float("nan"), "", "a string", "\x1b[2J", [], [1, "x"], {}, {"a": 1}]


def test_fuzz_plan_files(tmp_path, plan_data):
    """A saved plan with one value replaced, or one key removed, anywhere: ``show`` either shows it
    (exit 0, printable text) or refuses it in one line (exit 2), and never writes anything."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    paths = [path for path, _ in _paths(plan_data) if path]
    path = tmp_path / "plan.json"

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(paths), st.one_of(st.sampled_from(JUNK), st.integers(), st.floats(), st.text(max_size=5)),
           st.booleans())
    def one(where, junk, remove):
        data = json.loads(json.dumps(plan_data))
        parent = data
        for key in where[:-1]:
            parent = parent[key]
        if remove and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = junk
        path.write_text(json.dumps(data))
        code, out, err = _main_in_process(["show", str(path), "-q"])
        assert "Traceback" not in err, (where, junk, err)
        if code == EXIT_OK:
            assert "\x1b" not in out
        else:
            assert code == EXIT_USAGE and error_lines(err)[0].startswith("plan-checkpoints: error: "), (where, junk, err)
            assert len(error_lines(err)) == 1, err
        assert sorted(os.listdir(tmp_path)) == ["plan.json"]

    one()


SWEEP = {"budgets": ["100%", "60%"], "solvers": ["dp", "chen-greedy"], "time_limit": 5, "granularity": "module",
         "device": "cpu",
         "models": [{"file": "model.py", "name": "m", "model_fn": "build_model", "inputs_fn": "example_inputs",
                     "loss_fn": "loss_fn", "model_kwargs": {"a": 1}, "inputs_kwargs": {}, "loss_kwargs": {},
                     "budgets": ["50%"], "solvers": "dp", "time_limit": 3, "granularity": "op"}]}
SWEEP_JUNK = [None, True, -1, 0, 2**70, 1e30, float("nan"), float("inf"), "", "x", "../../nowhere.py", "/dev/zero",
              ".", [], {}, [1, "x"], {"a": 1}, {1: 2}, {"": 1}, "module:0", "12XB", "cuda:99", "a" * 300,
              ["60%", "60%"], 3.5, "0%", "1e400"]


def test_fuzz_sweep_files(tmp_path):
    """A sweep file with values replaced or keys removed anywhere: it loads, or it is refused with a
    ConfigError naming the file; never another exception (checked without running the sweep)."""
    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from planner.sweep.config import ConfigError, load_sweep

    (tmp_path / "model.py").write_text(TINY)
    paths = [path for path, _ in _paths(SWEEP) if path]
    config = tmp_path / "sweep.yaml"

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(paths), st.sampled_from(SWEEP_JUNK), st.booleans()), min_size=1, max_size=3))
    def one(changes):
        data = json.loads(json.dumps(SWEEP))
        for where, junk, remove in changes:
            parent = data
            try:
                for key in where[:-1]:
                    parent = parent[key]
                if remove and isinstance(parent, dict):
                    parent.pop(where[-1], None)
                else:
                    parent[where[-1]] = junk
            except (KeyError, IndexError, TypeError):  # an earlier change removed the way there
                pass
        config.write_text(yaml.safe_dump(data))
        try:
            load_sweep(str(config))
        except ConfigError as error:
            assert str(error).startswith(str(config)) or "sweep file" in str(error), error
            assert "\n" not in str(error)

    one()


SLOW = """
import time
import torch
from torch import nn

class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        time.sleep(2.0)  # a model whose step takes long: its first eager run alone outlasts the limit
        return self.linear(x)

def build_model():
    return Slow()

def example_inputs():
    return (torch.randn(4, 8),)
"""


def test_profiling_can_be_bounded(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    before = snapshot(tmp_path)
    result = cli("slow.py", "--budget", "100%", "--profile-time-limit", "1", "--out", "p.json", cwd=tmp_path)
    assert_refused(result, EXIT_TIMEOUT, "profiling took longer than --profile-time-limit 1 s", seconds=60)
    assert snapshot(tmp_path) == before


def test_an_edited_loss_in_a_plan_file_is_named_not_taken_for_control_flow(tmp_path):
    """Editing a traced plan's tangent_outputs used to end in 'data-dependent control flow'."""
    import torch
    from torch import nn

    import planner
    from profiler.capture import LossMismatch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    inputs = (torch.randn(4, 8),)
    planner.plan(model, inputs, "100%", solver="dp").save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    for outputs, error, phrase in [([0, 1], planner.PlanFileError, "do not match its 1 tangent_specs"),
                                   ([1], LossMismatch, "differentiates model output #1, but this model returns 1")]:
        (tmp_path / "edited.json").write_text(json.dumps({**data, "tangent_outputs": outputs}))
        with pytest.raises(error, match=phrase):
            planner.apply(model, planner.load(tmp_path / "edited.json"))(*inputs).sum().backward()
