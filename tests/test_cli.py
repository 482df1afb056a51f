"""The command line, run as a user runs it: a subprocess, its exit status, stdout and stderr."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_MODEL = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(64, 64), nn.Tanh(), nn.Dropout(0.1)]
    return nn.Sequential(*layers)

def example_inputs():
    return (torch.randn(256, 64, generator=torch.Generator().manual_seed(0)),)
"""


def command() -> list[str]:
    script = shutil.which("plan-checkpoints")
    return [script] if script else [sys.executable, "-m", "planner.cli"]


def run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([*command(), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def model_file(tmp_path, text=TINY_MODEL, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def assert_clean_error(result, code, *phrases):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stderr.startswith("plan-checkpoints: error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    for phrase in phrases:
        assert phrase in result.stderr


def test_plans_a_model_file_and_writes_the_plan(tmp_path):
    out = tmp_path / "plans" / "plan.json"
    result = run(model_file(tmp_path), "--budget", "90%", "--out", out)
    assert result.returncode == 0, result.stderr
    for phrase in ("Predicted peak", "without checkpointing", "Predicted time", "Kept for backward", "Recomputed"):
        assert phrase in result.stdout
    assert f"Plan written to {out}" in result.stdout
    data = json.loads(out.read_text())
    assert data["format"] == "plan-checkpoints/1" and data["schedule"]["steps"]
    assert data["predicted_peak_bytes"] <= data["budget"]["bytes"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp")]  # nothing half-written


def test_json_summary(tmp_path):
    result = run(model_file(tmp_path), "--budget", "100%", "--solver", "store-all", "--out", tmp_path / "p.json", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["solver"] == "store-all" and summary["predicted_overhead"] == 0.0
    assert summary["predicted_peak_bytes"] == summary["unplanned_peak_bytes"]


def test_a_budget_below_the_minimum_gives_the_minimum(tmp_path):
    out = tmp_path / "plan.json"
    result = run(model_file(tmp_path), "--budget", "100kB", "--solver", "chen-greedy", "--out", out)
    assert_clean_error(result, 3, "below the minimum", "KiB")
    assert not out.exists()


@pytest.mark.parametrize("budget", ["12XB", "twelve", "-5GB", "0", "150%", "1.5", ""])
def test_a_malformed_budget_lists_the_accepted_forms(tmp_path, budget):
    result = run(model_file(tmp_path), "--budget", budget)
    assert_clean_error(result, 2)
    assert "12GB" in result.stderr or "percentage" in result.stderr or "more than 0" in result.stderr


def test_a_model_file_without_build_model_says_so(tmp_path):
    path = model_file(tmp_path, "def example_inputs():\n    return ()\n")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "defines no build_model()")


def test_a_model_file_without_example_inputs_says_so(tmp_path):
    path = model_file(tmp_path, "import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "defines no example_inputs()", "--inputs-fn")


def test_other_function_names(tmp_path):
    text = TINY_MODEL.replace("def build_model", "def make").replace("def example_inputs", "def batch")
    path = model_file(tmp_path, text)
    assert_clean_error(run(path, "--budget", "1GB"), 2, "defines no build_model()")
    result = run(path, "--budget", "100%", "--solver", "store-all", "--model-fn", "make", "--inputs-fn", "batch",
                 "--out", tmp_path / "p.json")
    assert result.returncode == 0, result.stderr


def test_a_model_file_that_raises_is_reported_with_its_line(tmp_path):
    path = model_file(tmp_path, "import torch\n\nraise ValueError('no weights here')\n")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "failed to import", "ValueError: no weights here", "line 3")
    path = model_file(tmp_path, "def build_model():\n    return 1 / 0\n\ndef example_inputs():\n    return ()\n", "m2.py")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "build_model() in", "ZeroDivisionError", "line 2")


def test_missing_file_and_unknown_solver(tmp_path):
    assert_clean_error(run(tmp_path / "nope.py", "--budget", "1GB"), 2, "does not exist")
    assert_clean_error(run(model_file(tmp_path), "--budget", "1GB", "--solver", "magic"), 2, "invalid choice")
    assert_clean_error(run(model_file(tmp_path)), 2, "--budget")
