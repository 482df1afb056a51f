"""Hostile input and faults, files and processes: nothing destroyed, no hangs, the
documented exit status. Output paths that are inputs, model files that call what they imported or
exit, pipes and devices given as files, Ctrl-C. The command line runs as a subprocess, as a user
runs it (tests/hostile.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import hostile
import pytest
from hostile import (EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_USAGE, ROOT, TINY, assert_refused, cli, env, error_lines,
                     snapshot, write_plan)
from signals import default_sigint


# The shared fixtures (tests/hostile.py): pytest finds them by these names.
folder = hostile.folder
plan_data = hostile.plan_data


# -- destroyed files ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out", ["model.py", "./sub/../model.py", "link.py"])
def test_out_equal_to_the_model_file_is_refused_before_any_work(folder, out):
    (folder / "sub").mkdir()
    os.symlink(folder / "model.py", folder / "link.py")
    before = snapshot(folder)
    result = cli("model.py", "--budget", "100%", "--out", out, cwd=folder)
    assert_refused(result, EXIT_USAGE, f"cannot write {out}", "is the input", "--out must name another file",
                   seconds=20)
    assert "Profiling" not in result.stderr  # refused before loading the model
    assert snapshot(folder) == before


def test_show_out_equal_to_the_plan_is_refused(folder, plan_data):
    path = write_plan(folder / "plan.json", plan_data)
    before = snapshot(folder)
    result = cli("show", path, "--out", path, cwd=folder)
    assert_refused(result, EXIT_USAGE, "is the input", "--out must name another file", seconds=30)
    assert snapshot(folder) == before


SHUTIL_LIKE = """
from shutil import rmtree
import os
remove = os.remove

def build_model():
    import torch
    return torch.nn.Linear(2, 2)

def example_inputs():
    import torch
    return (torch.randn(2, 2),)
"""


def test_a_sweep_never_calls_a_function_the_model_file_imported(folder):
    """Both kinds of imported function (``from shutil import rmtree``; ``remove = os.remove``) in one
    sweep: either one called would delete keep.txt."""
    victim = folder / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    (folder / "helpers.py").write_text(textwrap.dedent(SHUTIL_LIKE))
    functions = {"rmtree": "{path: VICTIM}", "remove": "{path: VICTIM/keep.txt}"}
    entries = "".join(f"""
          - name: {function}
            file: helpers.py
            model_fn: {function}
            model_kwargs: {kwargs.replace("VICTIM", str(victim))}""" for function, kwargs in functions.items())
    (folder / "sweep.yaml").write_text(textwrap.dedent(f"""
        budgets: [100%]
        solvers: [chen-greedy]
        models:{entries}
          - file: model.py
        """))
    result = cli("batch", "sweep.yaml", "--out", "results", "-q", cwd=folder)
    assert (victim / "keep.txt").read_text() == "precious"
    assert result.returncode == EXIT_FAILED_RUNS, result.stderr
    assert "Traceback" not in result.stderr
    for function in functions:
        record = json.loads((folder / "results" / "runs" / f"{function}__100pct__chen-greedy.json").read_text())
        assert record["status"] == "error" and "not defined in the file" in record["error"]
        assert f"define {function}() there" in record["error"]
    model_record = json.loads((folder / "results" / "runs" / "model__100pct__chen-greedy.json").read_text())
    assert model_record["status"] != "error"  # the model after them is planned
    assert result.seconds < 90


def test_the_main_command_never_calls_an_imported_function(folder):
    (folder / "helpers.py").write_text(textwrap.dedent(SHUTIL_LIKE))
    result = cli("helpers.py", "--budget", "100%", "--model-fn", "rmtree", "--out", "p.json", cwd=folder)
    assert_refused(result, EXIT_USAGE, "rmtree in", "not defined in the file", "from shutil")
    assert not (folder / "p.json").exists()


def test_the_docs_say_a_sweep_file_is_code():
    with open(os.path.join(ROOT, "docs", "batch.md")) as file:
        text = file.read()
    assert "A sweep file is code" in text


@pytest.mark.parametrize("out", ["sweep.yaml", "model.py"])
def test_a_sweep_out_that_is_an_input_file_is_refused(folder, out):
    (folder / "sweep.yaml").write_text("budgets: [100%]\nmodels:\n  - file: marking.py\n")
    before = snapshot(folder)
    result = cli("batch", "sweep.yaml", "--out", out, cwd=folder)
    assert_refused(result, EXIT_USAGE, f"cannot write {out}", "not a folder", seconds=30)
    assert snapshot(folder) == before


# -- exit statuses -------------------------------------------------------------------------------------------
EXITS = {
    "sys.exit at import": ("import sys\nsys.exit(0)\n" + TINY, "sys.exit(0) while being imported"),
    "os._exit at import": ("import os\nos._exit(0)\n" + TINY, "os._exit(0) while being imported"),
    "sys.exit in build_model": (TINY.replace("torch.manual_seed(0)", "import sys; sys.exit(0)"),
                                "sys.exit(0) in build_model()"),
    "os._exit in build_model": (TINY.replace("torch.manual_seed(0)", "import os; os._exit(0)"),
                                "os._exit(0) in build_model()"),
    "posix._exit in example_inputs": (TINY.replace("return (torch.randn", "import posix; posix._exit(0)\n    return (torch.randn"),
                                      "os._exit(0) in example_inputs()"),
    "sys.exit in forward": (TINY + textwrap.dedent("""
        class Quit(nn.Module):
            def forward(self, x):
                import sys
                sys.exit(0)

        def build_model():
            return nn.Sequential(nn.Linear(16, 16), Quit())
        """), "sys.exit(0) in the model's forward or loss_fn"),
    "os._exit in forward": (TINY + textwrap.dedent("""
        class Quit(nn.Module):
            def forward(self, x):
                import os
                os._exit(0)

        def build_model():
            return nn.Sequential(nn.Linear(16, 16), Quit())
        """), "os._exit(0) in the model's forward or loss_fn"),
    "sys.exit in loss_fn": (TINY + "\ndef loss_fn(output):\n    raise SystemExit(0)\n", "in the model's forward or loss_fn"),
}


@pytest.mark.parametrize("case", sorted(EXITS))
def test_a_model_file_that_exits_is_an_error_not_a_success(folder, case):
    text, phrase = EXITS[case]
    (folder / "quits.py").write_text(text)
    result = cli("quits.py", "--budget", "100%", "--out", "p.json", cwd=folder)
    assert_refused(result, EXIT_USAGE, phrase, "quits.py", "must return or raise")
    assert not (folder / "p.json").exists()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sweep_records_a_model_that_exits_and_plans_the_models_after_it(folder, jobs):
    (folder / "quits.py").write_text(EXITS["os._exit in build_model"][0])
    (folder / "leaves.py").write_text(EXITS["sys.exit in forward"][0])
    (folder / "sweep.yaml").write_text(textwrap.dedent("""
        budgets: [100%]
        solvers: [chen-greedy]
        models:
          - file: quits.py
          - file: leaves.py
          - file: model.py
        """))
    for attempt in range(2):  # and again: the failures are recorded, not retried for ever
        result = cli("batch", "sweep.yaml", "--out", "results", "--jobs", jobs, "-q", cwd=folder)
        assert result.returncode == EXIT_FAILED_RUNS, (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        # the rerun does nothing again: every run, the failed ones too, has its record (--retry-failed redoes them)
        assert result.stdout.startswith("3 runs: 1 planned" + (" (3 from an earlier sweep)" if attempt else "") + ", 2 error;"), result.stdout
        assert "quits at 100% with chen-greedy: error: model file" in result.stderr and "os._exit(0)" in result.stderr
        assert "leaves at 100% with chen-greedy: error:" in result.stderr and "sys.exit(0)" in result.stderr
    assert (folder / "results" / "plans" / "model__100pct__chen-greedy.json").exists()
    assert result.seconds < 90


# -- hangs: files that never end ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command, kind", [
    (["show", "fifo"], "plan"), (["show", "/dev/zero"], "plan"), (["batch", "fifo"], "sweep"),
    (["batch", "/dev/zero"], "sweep"), (["show", "."], "plan"),
])
def test_a_pipe_or_device_instead_of_a_file_is_refused_not_read_for_ever(folder, command, kind):
    os.mkfifo(folder / "fifo")  # no writer: reading it would block for ever
    result = cli(*command, cwd=folder, timeout=60)
    assert_refused(result, EXIT_USAGE, f"cannot read {kind} file", "not a regular file" if command[1] != "." else "a folder",
                   seconds=30)


@pytest.mark.parametrize("text, phrase", [
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    name: " + "a" * 300 + "\n", "at most 100 characters"),
    ("budgets: [100%]\nmodels:\n  - file: x.py\n", "x.py is a folder, not a file"),
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    name: \xff\n", "not UTF-8"),
])
def test_sweep_files_refused_before_any_work(folder, text, phrase):
    (folder / "x.py").mkdir()
    (folder / "sweep.yaml").write_bytes(text.encode("latin-1"))
    before = snapshot(folder)
    result = cli("batch", "sweep.yaml", "--out", "results", cwd=folder)
    assert_refused(result, EXIT_USAGE, "sweep", phrase, seconds=30)
    assert snapshot(folder) == before  # nothing profiled, nothing written (the long name failed after profiling)


def test_stdout_closed_early_is_not_a_traceback(folder, plan_data):
    path = write_plan(folder / "plan.json", plan_data)
    process = subprocess.Popen([sys.executable, "-m", "planner", "show", path, "-q"], cwd=folder, env=env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # like `| head -0`
    _, err = process.communicate(timeout=60)
    assert b"Traceback" not in err and err == b""
    assert process.returncode == 141


# -- signals: Ctrl-C -------------------------------------------------------------------------------------------------
def _interrupt_when(command: list[str], cwd, phrase: str, after: float = 1.0) -> tuple[subprocess.Popen, str, float]:
    process = subprocess.Popen([sys.executable, "-m", "planner", *command], cwd=cwd, env=env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    seen = []
    for line in process.stderr:
        seen.append(line)
        if phrase in line:
            break
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    started = time.perf_counter()
    try:
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
    return process, "".join(seen) + rest, time.perf_counter() - started


SLOW_FORWARD = TINY + """
import time

class Slow(nn.Module):
    def forward(self, x):
        time.sleep(0.5)
        return x * 2

def build_model():
    return nn.Sequential(nn.Linear(16, 16), Slow(), nn.Linear(16, 4))
"""
# cpsat below what it can prove in its time limit: it searches the whole limit (it hung the command line).
# 65%: above the least any schedule needs (59%: below it every solver refuses at once, planner/least.py),
# below the least dp reaches (75%).
WIDE = TINY.replace("nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))",
                    "nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())])").replace(
                    "torch.randn(8, 16,", "torch.randn(256, 64,")


@pytest.mark.parametrize("phase", ["profiling", "cpsat"])
def test_ctrl_c_exits_130_and_writes_nothing(folder, phase):
    if phase == "profiling":
        (folder / "slow.py").write_text(SLOW_FORWARD)
        command, phrase = ["slow.py", "--budget", "100%", "--out", "p.json"], "Profiling"
    else:
        (folder / "slow.py").write_text(WIDE)
        command, phrase = ["slow.py", "--budget", "65%", "--solver", "cpsat", "--time-limit", "60", "--out", "p.json"], "Solving"
    before = snapshot(folder)
    process, stderr, seconds = _interrupt_when(command, folder, phrase)
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert error_lines(stderr) == ["plan-checkpoints: error: interrupted (Ctrl-C); nothing was written"]
    assert snapshot(folder) == before  # no plan, no temporary file
    assert seconds < 15  # the solve stops when asked, not at its time limit


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_in_a_sweep_keeps_the_cut_short_run_undone(folder, jobs):
    (folder / "slow.py").write_text(WIDE)
    (folder / "sweep.yaml").write_text("budgets: [100%, 65%]\nsolvers: [cpsat]\ntime_limit: 60\nmodels:\n  - file: slow.py\n")
    process, stderr, seconds = _interrupt_when(["batch", "sweep.yaml", "--out", "results", "--jobs", str(jobs)], folder,
                                               "[1/2 done]")
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and seconds < 15  # the workers' solves stop too (they ignore SIGINT)
    expected = ("plan-checkpoints: error: interrupted (Ctrl-C); finished runs are recorded, the runs in progress are "
                "not: run the same command again to finish the sweep")
    assert error_lines(stderr) == [expected], stderr
    runs = sorted(os.listdir(folder / "results" / "runs"))
    assert runs == ["slow__100pct__cpsat.json"]  # the finished run is kept, the interrupted one is not
    assert not [name for name in os.listdir(folder / "results" / "plans") if name.startswith(".tmp-")]
