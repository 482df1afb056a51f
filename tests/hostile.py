"""Helpers of the hostile-input tests (tests/test_hostile_*.py): the tiny model files, the
command run as a user runs it, and what every refusal owes the user (:func:`assert_refused`).

The models are tiny (two Linear layers) so that a case that profiles costs a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from planner.cli.progress import is_progress_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_OK, EXIT_FAILED_RUNS, EXIT_USAGE, EXIT_INFEASIBLE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

TINY = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

def example_inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),)
"""
# A model file that leaves a mark when it is imported: a case whose argument must be refused before
# any work asserts that the mark is absent.
MARKING = TINY + """
import os
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported.mark"), "w").close()
"""


def env() -> dict:
    """The environment of a command under test: this checkout importable, one thread per process."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def cli(*args, cwd, timeout: float = 120, module: bool = False) -> subprocess.CompletedProcess:
    """The command as a user runs it; ``result.seconds`` is how long it took."""
    command = [sys.executable, "-m", "planner" if module else "planner.cli", *map(str, args)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env(), timeout=timeout, check=False)
    result.seconds = time.perf_counter() - started
    return result


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.strip().splitlines() if not is_progress_line(line)]


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` with its content: what a case must leave as it found it."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as file:
                files[os.path.relpath(path, folder)] = file.read()
    return files


def assert_refused(result, code: int, *phrases: str, seconds: float = 60.0) -> str:
    """The documented status, one error line with ``phrases``, no traceback, in bounded time."""
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("plan-checkpoints: error: "), result.stderr
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    assert ".tmp-" not in lines[0]  # the user's path, never the hidden temporary file
    assert result.seconds < seconds, f"took {result.seconds:.1f} s"
    return lines[0]


def make_folder(tmp_path):
    """``tmp_path`` holding model.py (:data:`TINY`) and marking.py (:data:`MARKING`): a case's folder."""
    (tmp_path / "model.py").write_text(textwrap.dedent(TINY))
    (tmp_path / "marking.py").write_text(textwrap.dedent(MARKING))
    return tmp_path


_PLAN_JSON: list[str] = []  # made once per test session (tmp_path_factory is the session's)


def _plan_json(tmp_path_factory) -> str:
    if _PLAN_JSON:
        return _PLAN_JSON[0]
    import planner
    from planner.cli.modelfile import load_model_file

    folder = tmp_path_factory.mktemp("plan")
    (folder / "model.py").write_text(TINY)
    loaded = load_model_file(str(folder / "model.py"))
    plan = planner.plan(loaded.model, loaded.example_inputs, "100%", solver="chen-greedy")
    path = folder / "plan.json"
    plan.save(path)
    _PLAN_JSON.append(path.read_text())
    return _PLAN_JSON[0]


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory) -> dict:
    """A real plan (chen-greedy on the tiny model), as the JSON a user's plan file holds: made once
    per test session (it is the input of the plan-file cases, not a result under test), a fresh
    dict for each test module. A fixture: test files import it."""
    return json.loads(_plan_json(tmp_path_factory))


@pytest.fixture
def folder(tmp_path):
    """A scratch folder with the tiny model file (:func:`make_folder`). A fixture: test files import it."""
    return make_folder(tmp_path)


def write_plan(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)
