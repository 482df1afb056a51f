"""Hostile input and faults, messages: one line on stderr naming what was wrong and what
is accepted, no traceback. Tracebacks that became one line, unclear messages made clear, the
command's conventions (--version, usage, JSON errors, progress, logging) and the Python API. The
faults that need a patched function (a full disk) run in-process (tests/hostile.py).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import hostile
import pytest
from hostile import (EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, TINY, assert_refused, cli, env, snapshot,
                     write_plan)


# The shared fixtures (tests/hostile.py): pytest finds them by these names.
folder = hostile.folder
plan_data = hostile.plan_data


# -- tracebacks that became one line ---------------------------------------------------------------------------
def test_a_400_digit_budget(folder):
    result = cli("marking.py", "--budget", "1" + "0" * 400, cwd=folder)
    line = assert_refused(result, EXIT_USAGE, "more than 1 EiB", "60%", seconds=20)
    assert len(line) < 1000  # the 400 digits are not echoed whole
    assert not (folder / "imported.mark").exists()


@pytest.mark.parametrize("value", ["bogus", "module:0", "module:x", "3", ""])
def test_a_bad_granularity_is_refused_before_loading_the_model(folder, value):
    result = cli("marking.py", "--budget", "100%", "--granularity", value, cwd=folder)
    assert_refused(result, EXIT_USAGE, "--granularity", "'module:N'", "'op'", seconds=20)
    assert not (folder / "imported.mark").exists()


def test_example_inputs_with_a_key_that_is_not_a_name(folder):
    (folder / "keys.py").write_text(TINY.replace("return (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),)",
                                                 "return {1: torch.randn(8, 16)}"))
    result = cli("keys.py", "--budget", "100%", "--out", "p.json", cwd=folder)
    assert_refused(result, EXIT_USAGE, "example_inputs() in", "the key 1", "argument names")
    assert not (folder / "p.json").exists()


def test_a_full_disk_while_writing_the_plan(folder, monkeypatch, capsys):
    """ENOSPC from the write (simulated: os.fsync of the temporary file fails as a full disk's
    does): one line naming the user's path, the previous plan intact, no temporary file left."""
    import planner.files
    from planner.cli import command

    (folder / "p.json").write_text("the previous plan")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(planner.files.os, "fsync", full)
    before = snapshot(folder)
    started = time.perf_counter()
    code = command.main([str(folder / "model.py"), "--budget", "100%", "--solver", "chen-greedy",
                         "--out", str(folder / "p.json"), "-q"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert err.strip() == f"plan-checkpoints: error: cannot write {folder / 'p.json'}: No space left on device"
    assert snapshot(folder) == before
    assert time.perf_counter() - started < 60


def show(path, folder, capsys, as_user: bool) -> subprocess.CompletedProcess:
    """``plan-checkpoints show PATH`` as a user runs it (a process of its own) if ``as_user``, else
    through the same ``main()`` in this process: the plan-file cases differ only in the field the
    validation meets, so one case of each test pays the command's torch import (2-3 s), the others
    do not. A warning that the command would print as a line of its own fails the case here too."""
    if as_user:
        return cli("show", path, cwd=folder)
    import warnings

    from planner.cli import command

    capsys.readouterr()
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = command.main(["show", path])
    out, err = capsys.readouterr()
    assert not caught, [str(w.message) for w in caught]
    result = subprocess.CompletedProcess(["show", path], code, out, err)
    result.seconds = time.perf_counter() - started
    return result


@pytest.mark.parametrize("field, value, phrase", [
    ("solve_seconds", "fast", "schedule.solve_seconds must be seconds"),
    ("solve_seconds", -1, "schedule.solve_seconds must be seconds"),
    ("gap", "x", "schedule.gap must be a fraction"),
    ("gap", [0.1], "schedule.gap must be a fraction"),
    ("status", "perfect", "schedule.status must be one of"),
    ("method", 7, "schedule.method must be a string"),
])
def test_show_on_a_plan_whose_solver_report_has_the_wrong_type(folder, plan_data, capsys, field, value, phrase):
    data = json.loads(json.dumps(plan_data))
    data["schedule"][field] = value
    path = write_plan(folder / "plan.json", data)
    result = show(path, folder, capsys, as_user=field == "solve_seconds" and value == "fast")
    assert_refused(result, EXIT_USAGE, "plan.json is not a valid plan", phrase, seconds=30)


@pytest.mark.parametrize("text, phrase", [
    ("budgets: [100%]\nmodels:\n  - file: !!python/object/apply:os.system ['touch hacked']\n", "'!!python/object/apply:os.system'"),
    ("budgets: !!python/name:os.system\nmodels:\n  - file: model.py\n", "'!!python/name:os.system'"),
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    model_kwargs: {x: !!python/object/new:os.system [touch hacked]}\n",
     "'!!python/object/new:os.system'"),
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    name: !!binary aGVsbG8=\n", "'!!binary'"),
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    model_kwargs: &a {x: *a}\n", "anchor is used inside itself"),
    ("budgets: [100%]\nmodels:\n  - file: model.py\n    model_kwargs:\n      a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
     + "".join(f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 25)), "expands to more than"),
    ("budgets: " + "[" * 3000 + "]" * 3000 + "\nmodels: []\n", "nested too deeply"),
])
def test_a_sweep_file_builds_no_python_objects(folder, text, phrase):
    (folder / "sweep.yaml").write_text(text)
    before = snapshot(folder)
    result = cli("batch", "sweep.yaml", "--out", "results", cwd=folder, timeout=60)
    assert_refused(result, EXIT_USAGE, "sweep.yaml", phrase, seconds=30)
    assert snapshot(folder) == before  # nothing ran ('touch hacked'), nothing was written


def test_a_second_backward_through_the_planned_module_is_refused_clearly_or_correct():
    import torch
    from torch import nn

    import planner

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)])
    inputs = (torch.randn(8, 16),)
    fast = planner.apply(model, planner.plan(model, inputs, "100%", solver="dp"))  # a traced plan
    loss = fast(*inputs).sum()
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    try:
        loss.backward()
    except RuntimeError as error:  # refused: it must say so in words, not an AttributeError
        assert "backward" in str(error)
    else:  # or run: the gradients accumulate, as eager PyTorch's do
        for grad, param in zip(first, model.parameters()):
            torch.testing.assert_close(param.grad, 2 * grad)


# -- unclear messages made clear --------------------------------------------------------------------------------
@pytest.mark.parametrize("out, phrase", [
    ("afile/plan.json", "afile is not a folder"),
    ("/proc/plan-checkpoints-test/plan.json", "cannot be made"),
    ("/proc/plan.json", "cannot be written"),
    ("sub", "it is a folder; --out must name a file"),
    ("/dev/null", "not a regular file"),
    ("sub/", "must name a file, not a folder"),
])
def test_an_output_path_that_cannot_be_written_is_named_before_any_work(folder, out, phrase):
    (folder / "afile").write_text("x")
    (folder / "sub").mkdir()
    before = snapshot(folder)
    result = cli("marking.py", "--budget", "100%", "--out", out, cwd=folder)
    assert_refused(result, EXIT_USAGE, f"cannot write {out}", phrase, seconds=20)
    assert not (folder / "imported.mark").exists()  # before loading, profiling or solving
    assert snapshot(folder) == before


@pytest.mark.parametrize("value", ["-1", "x", "nan", "inf", "-5%"])
def test_a_bad_max_overhead_says_what_is_accepted(folder, value):
    result = cli("marking.py", "--budget", "100%", "--max-batch", f"--max-overhead={value}", cwd=folder)
    line = assert_refused(result, EXIT_USAGE, "--max-overhead", "is not an overhead", "30%", seconds=20)
    assert "_overhead" not in line
    assert not (folder / "imported.mark").exists()


def test_a_folder_named_like_a_model_file(folder):
    (folder / "x.py").mkdir()
    assert_refused(cli("x.py", "--budget", "1GB", cwd=folder), EXIT_USAGE, "x.py is a folder, not a file",
                   "build_model()", seconds=20)


def test_a_syntax_error_gives_its_location_once(folder):
    (folder / "broken.py").write_text("import torch\n\ndef build_model(:\n    pass\n")
    line = assert_refused(cli("broken.py", "--budget", "1GB", cwd=folder), EXIT_USAGE, "SyntaxError", "line 3")
    assert line.count("line 3") == 1


WRONG_FIELDS = [
    (lambda d: d.update(graph="a string"), "graph must be a JSON object, got a string"),
    (lambda d: d["graph"].update(nodes="abc"), "expected a list, got str"),
    (lambda d: d["graph"].update(edges=[["a"]]), "each of graph.edges must be a pair"),
    (lambda d: d.update(schedule=[1, 2]), "schedule must be a JSON object, got a list"),
    (lambda d: d.update(budget=5), "budget must be a JSON object"),
    (lambda d: d.update(predicted_peak_bytes=10**30), "predicted_peak_bytes must be a whole number from 0 to 2^60"),
    (lambda d: d.update(predicted_peak_bytes=1e30), "predicted_peak_bytes must be a whole number"),
    (lambda d: d.update(unplanned_seconds=1e30), "unplanned_seconds must be seconds"),
    (lambda d: d["graph"]["nodes"][0].update(mem=10**30), "mem must be a whole number from 0 to 2^60"),
    (lambda d: d.pop("fixed_bytes"), "it has no 'fixed_bytes' field"),
]


@pytest.mark.parametrize("change, phrase", WRONG_FIELDS)
def test_a_plan_file_with_a_wrong_field_says_which(folder, plan_data, capsys, change, phrase):
    data = json.loads(json.dumps(plan_data))
    change(data)
    path = write_plan(folder / "plan.json", data)
    result = show(path, folder, capsys, as_user=phrase == WRONG_FIELDS[0][1])
    assert_refused(result, EXIT_USAGE, "plan.json is not a valid plan", phrase, seconds=30)


def test_show_strips_terminal_escapes_from_a_plans_text(folder, plan_data):
    data = json.loads(json.dumps(plan_data))
    data["model"] = "Evil\x1b[2J\x1b]0;owned\x07\x1b[31mRed\u202eesrever\x00"
    path = write_plan(folder / "plan.json", data)
    result = cli("show", path, "-q", cwd=folder)
    assert result.returncode == EXIT_OK, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\u202e" not in result.stdout
    assert "\x00" not in result.stdout
    assert "EvilRed?esrever?" in result.stdout


def test_a_plan_made_with_another_torch_is_warned_about(folder, plan_data):
    data = json.loads(json.dumps(plan_data))
    data["torch_version"] = "1.0.0"
    path = write_plan(folder / "plan.json", data)
    result = cli("show", path, cwd=folder)
    assert result.returncode == EXIT_OK and "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("plan-checkpoints: warning: ")]
    assert len(warnings) == 1 and "made with torch 1.0.0" in warnings[0] and "plan again" in warnings[0]


def test_a_plan_made_with_another_torch_warns_in_the_api(tmp_path, plan_data):
    import planner
    from planner.planfile import PlanWarning

    data = json.loads(json.dumps(plan_data))
    data["torch_version"] = "0.4.1"
    path = write_plan(tmp_path / "plan.json", data)
    with pytest.warns(PlanWarning, match="made with torch 0.4.1"):
        planner.load(path)
    write_plan(tmp_path / "same.json", plan_data)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        planner.load(tmp_path / "same.json")  # the same torch: no warning


def test_a_solver_out_of_time_names_the_users_budget(folder, monkeypatch, capsys):
    import planner.granularity
    from planner.cli import command

    def out_of_time(graph, budget, method="auto", time_limit=None, **options):
        raise TimeoutError(f"ilp: no schedule within {budget} bytes found in the time limit ({time_limit} s)")

    monkeypatch.setattr(planner.granularity, "solve", out_of_time)
    # 6150 B: above the least any plan needs (6056 B, refused at once below it), below store-all's.
    code = command.main([str(folder / "model.py"), "--budget", "6150B", "--solver", "ilp", "--time-limit", "0.5",
                         "--out", str(folder / "p.json"), "-q"])
    err = capsys.readouterr().err
    assert code == EXIT_TIMEOUT
    assert err.startswith("plan-checkpoints: error: solver ilp found no schedule within budget 6150B in --time-limit 0.5 s")
    assert len(err.strip().splitlines()) == 1 and not (folder / "p.json").exists()


def test_a_sweep_run_out_of_time_names_the_users_budget(folder, monkeypatch):
    import planner.granularity
    from planner.budget import parse_budget
    from planner.sweep.config import ModelSpec, Run
    from planner.sweep.tasks import profile_model, solve_run

    def out_of_time(graph, budget, method="auto", time_limit=None, **options):
        raise TimeoutError(f"ilp: no schedule within {budget} bytes found in the time limit ({time_limit} s)")

    spec = ModelSpec(name="model", file=str(folder / "model.py"), time_limit=0.5)
    profiled = profile_model(spec, None, None)
    monkeypatch.setattr(planner.granularity, "solve", out_of_time)
    outcome = solve_run(Run("model__6150B__ilp", spec, parse_budget("6150B"), "ilp", None), profiled)
    assert outcome.status == "error" and outcome.plan is None
    assert outcome.error.startswith("no schedule within budget 6150B found in 0.5 s (ilp: no schedule within ")


# -- conventions -------------------------------------------------------------------------------------------------
def test_version_and_python_dash_m(folder):
    for module in (False, True):
        result = cli("--version", cwd=folder, module=module)
        assert result.returncode == 0 and result.stdout.startswith("plan-checkpoints "), result.stderr
        assert result.seconds < 20


def test_the_usage_line_names_every_command(folder):
    result = cli("--help", cwd=folder, module=True)
    assert result.returncode == 0
    usage = result.stdout.split("\n\n")[0]
    for command in ("plan-checkpoints MODEL.py --budget", "plan-checkpoints batch CONFIG.yaml", "plan-checkpoints show plan.json"):
        assert command in usage


def test_json_errors_are_json(folder):
    result = cli("marking.py", "--budget", "12XB", "--json", cwd=folder)
    assert_refused(result, EXIT_USAGE, "unknown unit", seconds=20)
    error = json.loads(result.stdout)
    assert error["exit_status"] == EXIT_USAGE and "unknown unit 'XB'" in error["error"]


def test_progress_off_a_terminal_is_a_line_per_phase_and_quiet_is_quiet(folder):
    result = cli("model.py", "--budget", "100%", "--solver", "chen-greedy", "--out", "p.json", cwd=folder)
    assert result.returncode == 0, result.stderr
    phases = result.stderr.strip().splitlines()
    assert phases == ["plan-checkpoints: Loading model.py", "plan-checkpoints: Profiling Sequential",
                      "plan-checkpoints: Solving with chen-greedy"], result.stderr
    quiet = cli("model.py", "--budget", "100%", "--solver", "chen-greedy", "--out", "q.json", "-q", cwd=folder)
    assert quiet.returncode == 0 and quiet.stderr == ""
    both = cli("model.py", "--budget", "100%", "-q", "-v", cwd=folder)
    assert_refused(both, EXIT_USAGE, "not allowed with argument", seconds=20)


def test_verbose_logs_the_tools_loggers(capsys):
    import logging

    from planner.cli.verbosity import setup_logging

    setup_logging(1)
    try:
        logging.getLogger("solvers.ilp").info("a line from ilp")
        logging.getLogger("solvers.ilp").debug("a detail")
        err = capsys.readouterr().err
        assert "plan-checkpoints: solvers.ilp: a line from ilp" in err and "a detail" not in err
    finally:
        for name in ("planner", "solvers", "profiler", "runtime"):
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.setLevel(logging.NOTSET)


def test_a_missing_model_file_is_reported_before_importing_torch(folder):
    script = (
        "import sys; from planner.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n"
    )
    for args in (["nowhere.py", "--budget", "1GB"], ["marking.py", "--budget", "1GB", "--out", "afile/p.json"]):
        (folder / "afile").write_text("")
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=folder,
                                env=env(), timeout=60, check=False)
        result.seconds = time.perf_counter() - started
        assert_refused(result, EXIT_USAGE, seconds=15)


# -- the Python API ---------------------------------------------------------------------------------------------------
def test_api_budgets_and_inputs():
    import torch
    from torch import nn

    import planner

    for value in ("1" + "0" * 400, 10**400, 2**61, "2EiB", "1" * 2000):
        with pytest.raises(planner.BudgetError, match="a budget is|1 EiB"):
            planner.parse_budget(value)
    model = nn.Linear(4, 4)
    with pytest.raises((TypeError, ValueError), match="keyword-argument names"):
        planner.plan(model, {1: torch.randn(2, 4)}, "100%")


def test_api_load_of_a_path_that_is_not_a_file(tmp_path):
    import planner

    for path in ("a\0b.json", tmp_path, "/dev/zero", tmp_path / "missing.json"):
        with pytest.raises(planner.PlanFileError, match="cannot read plan file"):
            planner.load(path)


CHDIR = """
import os
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "elsewhere"))
print("the model file prints this")
""" + TINY


def test_a_model_file_that_changes_folder_or_prints_does_not_move_the_plan_or_break_json(folder):
    (folder / "elsewhere").mkdir()
    (folder / "chdir.py").write_text(CHDIR)
    result = cli("chdir.py", "--budget", "100%", "--solver", "chen-greedy", "--out", "p.json", "--json", "-q", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plan"] == "p.json"  # stdout is the JSON alone
    assert "the model file prints this" in result.stderr
    assert (folder / "p.json").exists() and not (folder / "elsewhere" / "p.json").exists()
    (folder / "sweep.yaml").write_text("budgets: [100%]\nsolvers: [chen-greedy]\nmodels:\n  - file: chdir.py\n")
    result = cli("batch", "sweep.yaml", "--out", "results", "-q", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert (folder / "results" / "plans" / "chdir__100pct__chen-greedy.json").exists()
    assert os.listdir(folder / "elsewhere") == []


def test_api_save_to_a_path_that_cannot_be_written(tmp_path, plan_data):
    import planner
    from planner.files import WriteError

    path = write_plan(tmp_path / "plan.json", plan_data)
    plan = planner.load(path)
    (tmp_path / "afile").write_text("")
    for target in (tmp_path, tmp_path / "afile" / "p.json"):
        with pytest.raises(WriteError, match=f"cannot write {target}"):
            plan.save(target)
    assert sorted(os.listdir(tmp_path)) == ["afile", "plan.json"]
