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


def run_here(capsys, *args) -> tuple[int, str, str]:
    """The same command in this process: for paths whose subprocess behaviour another test covers."""
    from planner.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def model_file(tmp_path, text=TINY_MODEL, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_lines(stderr: str) -> list[str]:
    """stderr without the progress lines (a line per phase when not on a terminal)."""
    from planner.cli.progress import is_progress_line

    return [line for line in stderr.strip().splitlines() if not is_progress_line(line)]


def assert_clean_error(result, code, *phrases):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("plan-checkpoints: error: "), result.stderr
    for phrase in phrases:
        assert phrase in lines[0]


def test_plans_a_model_file_and_writes_the_plan(tmp_path):
    out = tmp_path / "plans" / "plan.json"
    result = run(model_file(tmp_path), "--budget", "90%", "--out", out, "--time-limit", "5")
    assert result.returncode == 0, result.stderr
    for phrase in ("Predicted peak", "without checkpointing", "Predicted time", "Solver:"):
        assert phrase in result.stdout
    assert f"Plan written to {out}" in result.stdout
    data = json.loads(out.read_text())
    assert data["format"].startswith("plan-checkpoints/") and data["schedule"]["steps"]
    assert data["predicted_peak_bytes"] <= data["budget"]["bytes"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp")]  # nothing half-written


def test_json_summary(tmp_path, capsys):
    code, out, err = run_here(capsys, model_file(tmp_path), "--budget", "100%", "--solver", "store-all",
                              "--out", tmp_path / "p.json", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["solver"] == "store-all" and summary["predicted_overhead"] == 0.0
    assert summary["predicted_peak_bytes"] == summary["unplanned_peak_bytes"]


def test_a_budget_below_the_minimum_gives_the_minimum(tmp_path):
    out = tmp_path / "plan.json"
    result = run(model_file(tmp_path), "--budget", "100kB", "--solver", "chen-greedy", "--out", out)
    assert_clean_error(result, 3, "below the minimum", "KiB")
    assert not out.exists()


@pytest.mark.parametrize("budget", ["12XB", "-5GB"])
def test_a_malformed_budget_lists_the_accepted_forms(tmp_path, budget):
    # tests/test_errors.py checks every rejected form in-process; here, as a user sees it
    result = run(model_file(tmp_path), "--budget", budget)
    assert_clean_error(result, 2, "12GB", "60%")


def test_a_model_file_without_build_model_says_so(tmp_path):
    path = model_file(tmp_path, "def example_inputs():\n    return ()\n")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "defines no build_model()")


def test_a_model_file_that_raises_is_reported_with_its_line(tmp_path):
    path = model_file(tmp_path, "import torch\n\nraise ValueError('no weights here')\n")
    assert_clean_error(run(path, "--budget", "1GB"), 2, "failed to import", "ValueError: no weights here", "line 3")


def _clean_here(code, out, err, expected_code, *phrases):
    assert code == expected_code, (out, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("plan-checkpoints: error: "), err
    for phrase in phrases:
        assert phrase in err


def test_model_file_mistakes_in_process(tmp_path, capsys):
    path = model_file(tmp_path, "import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n", "m1.py")
    _clean_here(*run_here(capsys, path, "--budget", "1GB"), 2, "defines no example_inputs()", "--inputs-fn")
    path = model_file(tmp_path, "def build_model():\n    return 1 / 0\n\ndef example_inputs():\n    return ()\n", "m2.py")
    _clean_here(*run_here(capsys, path, "--budget", "1GB"), 2, "build_model() in", "ZeroDivisionError", "line 2")
    _clean_here(*run_here(capsys, tmp_path / "nope.py", "--budget", "1GB"), 2, "does not exist")
    _clean_here(*run_here(capsys, path, "--budget", "1GB", "--solver", "magic"), 2, "invalid choice")
    _clean_here(*run_here(capsys, path), 2, "--budget")


def test_other_function_names(tmp_path, capsys):
    text = TINY_MODEL.replace("def build_model", "def make").replace("def example_inputs", "def batch")
    path = model_file(tmp_path, text)
    _clean_here(*run_here(capsys, path, "--budget", "1GB"), 2, "defines no build_model()")
    code, out, err = run_here(capsys, path, "--budget", "100%", "--solver", "store-all", "--model-fn", "make",
                              "--inputs-fn", "batch", "--out", tmp_path / "p.json")
    assert code == 0, err
    assert (tmp_path / "p.json").exists()


def test_help_and_bad_arguments_answer_without_importing_torch():
    """--help, a bad budget and a bad option answer at once: nothing of torch is imported for them."""
    for args, code in ((["--help"], 0), (["m.py", "--budget", "12XB"], 2), (["m.py", "--budget", "1GB", "--solver", "x"], 2)):
        script = (
            "import sys; from planner.cli import main\n"
            "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n    code = stop.code or 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n"
        )
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == code, (args, result.stderr)
        assert "Traceback" not in result.stderr
        if args == ["--help"]:
            assert "--budget" in result.stdout and "60%" in result.stdout


def test_public_names_stay_functions_and_classes_whatever_was_imported_first():
    """``planner.plan`` once resolved to a submodule of the same name when that submodule had been
    imported before the first ``planner.plan(...)`` call; every export must survive any import order."""
    script = (
        "import importlib, pkgutil, types, planner\n"
        "for info in pkgutil.iter_modules(planner.__path__):\n"
        "    importlib.import_module('planner.' + info.name)\n"
        "bad = [n for n in planner.__all__ if isinstance(getattr(planner, n), types.ModuleType)]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
