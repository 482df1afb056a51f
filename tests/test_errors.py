"""Every user-facing error path: one clear error, never a traceback, never a partial output file.

The command line runs in-process here (``planner.cli.main``: the same code a user's command runs,
without a fresh interpreter per case); tests/test_cli.py runs it as a subprocess, for the cases it
covers (malformed budgets, a budget below the minimum, model files that fail to import or whose
build_model() raises, missing functions, unknown solvers). A clean error is: an exit status, exactly
one line on stderr starting ``plan-checkpoints: error:``, and no plan file written.
"""

from __future__ import annotations

import builtins
import json
import marshal
import pickle
import textwrap

import pytest
import torch
from torch import nn

import planner
import profiler
import runtime
from planner import cli
from planner.budget import ACCEPTED_FORMS
from models import mlp, training_step

# -- budgets --------------------------------------------------------------------------------------------
ACCEPTED = [
    ("12GB", 12 * 10**9), ("12GiB", 12 * 2**30), ("500MB", 500 * 10**6), ("500MiB", 500 * 2**20),
    ("1.5GiB", 3 * 2**29), ("64kB", 64_000), ("64KiB", 65_536), (" 2 TiB ", 2 * 2**40), ("1TB", 10**12),
    ("1024", 1024), ("7b", 7), (1024, 1024), (4096.0, 4096),
]
REJECTED = [
    "", " ", "abc", "twelve", "-5GB", "-1", "0", "0GB", "0.0001B", "0%", "-10%", "150%", "100.01%", "12XB", "12 G B",
    "1.5", "1e9", "nan", "inf", "12GB12", "%", "GB", "12GB%", "0x10", None, True, False, -3, 0, 0.5, -1.0,
    float("nan"), float("inf"), [1], b"12GB", {"bytes": 1},
]


@pytest.mark.parametrize("text, expected", ACCEPTED)
def test_accepted_byte_budgets(text, expected):
    budget = planner.parse_budget(text)
    assert budget.bytes == expected and budget.percent is None


@pytest.mark.parametrize("text, expected", [("60%", 60.0), ("100%", 100.0), ("0.5%", 0.5), (" 75 % ", 75.0)])
def test_accepted_percentages(text, expected):
    budget = planner.parse_budget(text)
    assert budget.percent == expected and budget.bytes is None
    assert budget.resolve(1000) == int(1000 * expected / 100)


@pytest.mark.parametrize("value", REJECTED, ids=repr)
def test_rejected_budgets_say_what_is_accepted(value):
    with pytest.raises(planner.BudgetError) as raised:
        planner.parse_budget(value)
    message = str(raised.value)
    assert "\n" not in message
    assert ACCEPTED_FORMS in message or "percentage must be more than 0% and at most 100%" in message or (
        "must be more than 0 bytes" in message
    )


def test_a_bad_budget_is_refused_before_any_work():
    class Exploding(nn.Module):
        def forward(self, x):
            raise AssertionError("profiled although the budget is malformed")

    with pytest.raises(planner.BudgetError):
        planner.plan(Exploding(), (torch.randn(2),), budget="12 parsecs")
    with pytest.raises(planner.BudgetError):
        planner.checkpoint(Exploding(), (torch.randn(2),), budget="250%")


# -- infeasible budgets and time limits --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tanh_mlp():
    """Activations dominate its step, so checkpointing lowers the peak below store-all's."""
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    model, inputs = nn.Sequential(*layers), (torch.randn(256, 32, generator=torch.Generator().manual_seed(0)),)
    prof = profiler.profile(model, inputs)
    return model, inputs, prof


@pytest.mark.parametrize("solver", ["chen-sqrtn", "chen-greedy", "revolve", "dp", "cpsat"])
def test_an_infeasible_budget_gives_the_true_minimum(tanh_mlp, solver):
    model, inputs, prof = tanh_mlp
    options = dict(solver=solver, profile=prof, time_limit=20)
    with pytest.raises(planner.BudgetInfeasible) as raised:
        planner.plan(model, inputs, budget=1, **options)
    minimum = raised.value.min_budget
    assert minimum > prof.graph.graph["fixed_bytes"]
    assert planner.format_bytes(minimum) in str(raised.value) and f"{minimum} bytes" in str(raised.value)
    plan = planner.plan(model, inputs, budget=minimum, **options)  # the minimum the message gives is met
    assert plan.predicted_peak_bytes <= minimum
    if solver == "cpsat":
        # Below the bytes held besides the activations every solver refuses at once (planner/least.py):
        # the figure is the least dp reaches, which cpsat, searching every order, may beat.
        assert "the least budget dp reaches" in str(raised.value)
        return
    with pytest.raises(planner.BudgetInfeasible):
        planner.plan(model, inputs, budget=minimum - 1, **options)


def test_budgets_below_the_resident_bytes_or_by_percentage(tanh_mlp):
    model, inputs, prof = tanh_mlp
    fixed = prof.graph.graph["fixed_bytes"]
    with pytest.raises(planner.BudgetInfeasible, match="below the minimum") as raised:
        planner.plan(model, inputs, budget=fixed // 2, solver="chen-greedy", profile=prof)
    assert raised.value.min_budget > fixed
    with pytest.raises(planner.BudgetInfeasible, match=r"budget 1% \("):
        planner.plan(model, inputs, budget="1%", solver="dp", profile=prof)


@pytest.mark.parametrize("time_limit", [0.05, 0.5])
def test_a_solver_time_limit_gives_the_best_schedule_and_its_gap_or_a_clear_failure(tanh_mlp, time_limit):
    model, inputs, prof = tanh_mlp
    store_all = planner.plan(model, inputs, budget="100%", solver="store-all", profile=prof)
    with pytest.raises(planner.BudgetInfeasible) as raised:
        planner.plan(model, inputs, budget=1, solver="dp", profile=prof)
    budget = (raised.value.min_budget + store_all.unplanned_peak_bytes) // 2
    # ilp: it starts from the dp schedule, so a short limit leaves it a schedule to return. (cpsat may
    # raise Infeasible when its limit passes before it finds one.)
    try:
        plan = planner.plan(model, inputs, budget=budget, solver="ilp", profile=prof, time_limit=time_limit)
    except TimeoutError as error:  # allowed: nothing found in time, and it says so
        assert "time limit" in str(error)
        return
    assert plan.predicted_peak_bytes <= budget
    info = plan.schedule.info
    assert info.status in ("optimal", "optimal-in-order", "feasible")
    if info.status == "feasible":  # the best found; the gap when a bound was proven in time
        assert "time limit" in info.message and "feasible" in plan.summary()
        assert info.gap is None or (0 <= info.gap <= 1 and "proven gap" in plan.summary())
    with pytest.raises(ValueError, match="time_limit"):
        planner.plan(model, inputs, budget=budget, solver="ilp", profile=prof, time_limit=-1)


# -- the command line, in-process ------------------------------------------------------------------------
GOOD_MODEL = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

def example_inputs():
    return (torch.randn(32, 16),)
"""


def run_cli(capsys, tmp_path, text: str, *options: str):
    """Run the command in-process on a model file holding ``text``; (status, stdout, stderr, out path)."""
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(text))
    out = tmp_path / "out" / "plan.json"
    status = cli.main([str(path), "--out", str(out), *options])
    captured = capsys.readouterr()
    return status, captured.out, captured.err, out


def assert_clean_error(status, err, out, expected_status, *phrases):
    assert status == expected_status, err
    from planner.cli.progress import is_progress_line

    lines = [line for line in err.strip().splitlines() if not is_progress_line(line)]  # a line per phase
    assert len(lines) == 1 and lines[0].startswith("plan-checkpoints: error: "), err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in err
    assert not out.exists() and not (out.parent.exists() and list(out.parent.iterdir()))  # nothing written


MODEL_FILE_MISTAKES = {
    "syntax error": ("def build_model(:\n    pass\n", ["failed to import", "SyntaxError", "line 1"]),
    "example_inputs raises": (GOOD_MODEL.replace("return (torch.randn(32, 16),)", "raise KeyError('batch')"),
                              ["example_inputs() in", "KeyError"]),
    "build_model returns no module": (GOOD_MODEL.replace("return nn.Sequential(", "return 3 or nn.Sequential("),
                                      ["returned int, not an nn.Module"]),
    "example_inputs returns a number": (GOOD_MODEL.replace("return (torch.randn(32, 16),)", "return 5"),
                                        ["returned int", "tuple of positional arguments"]),
    "loss_fn is not a function": (GOOD_MODEL + "\nloss_fn = 3\n", ["loss_fn in", "is not a function"]),
    "loss_fn raises": (GOOD_MODEL + "\ndef loss_fn(output):\n    return output.missing\n",
                       ["the loss function raised", "AttributeError"]),
    "loss_fn returns a vector": (GOOD_MODEL + "\ndef loss_fn(output):\n    return output.sum(0)\n",
                                 ["loss_fn must return a scalar"]),
    "inputs do not fit the model": (GOOD_MODEL.replace("torch.randn(32, 16)", "torch.randn(32, 15)"),
                                    ["the model raised on the example inputs", "RuntimeError"]),
    "nothing to differentiate": (GOOD_MODEL.replace("return (torch.randn(32, 16),)",
                                                    "return (torch.randn(32, 16),)\n\ndef loss_fn(output):\n"
                                                    "    return output.detach().sum()\n"),
                                 ["does not depend on any output"]),
}


@pytest.mark.parametrize("case", sorted(MODEL_FILE_MISTAKES))
def test_model_file_mistakes_are_one_line(capsys, tmp_path, case):
    text, phrases = MODEL_FILE_MISTAKES[case]
    status, _, err, out = run_cli(capsys, tmp_path, text, "--budget", "100%")
    assert_clean_error(status, err, out, 2, *phrases)


def test_a_model_file_that_is_a_folder_or_not_python(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert cli.main([str(tmp_path), "--budget", "1GB", "--out", str(out)]) == 2
    data = tmp_path / "model.txt"
    data.write_text("build_model = None\n")
    assert cli.main([str(data), "--budget", "1GB", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("plan-checkpoints: error: ") == 2 and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_bad_time_limits(capsys, tmp_path, value):
    status, _, err, out = run_cli(capsys, tmp_path, GOOD_MODEL, "--budget", "100%", f"--time-limit={value}")
    assert_clean_error(status, err, out, 2, "time-limit")


def test_a_solver_that_finds_nothing_in_its_time_limit(capsys, tmp_path, monkeypatch):
    def times_out(graph, budget, method="auto", time_limit=None, **options):
        raise TimeoutError(f"ilp: no schedule within {budget} bytes found in the time limit ({time_limit} s)")

    monkeypatch.setattr(planner.granularity, "solve", times_out)
    status, _, err, out = run_cli(capsys, tmp_path, GOOD_MODEL, "--budget", "100%", "--solver", "ilp",
                                  "--time-limit", "0.01")
    assert_clean_error(status, err, out, 4, "in the time limit", "--time-limit")


def test_a_solver_that_refuses_the_problem(capsys, tmp_path, monkeypatch):
    """ilp refuses graphs too large for its model with a ValueError that says what to use instead."""

    def too_large(graph, budget, method="auto", time_limit=None, **options):
        raise ValueError("ilp: the graph has 900 nodes (limit: max_nodes=400). Use the cpsat, dp or chen-greedy methods")

    monkeypatch.setattr(planner.granularity, "solve", too_large)
    status, _, err, out = run_cli(capsys, tmp_path, GOOD_MODEL, "--budget", "100%", "--solver", "ilp")
    assert_clean_error(status, err, out, 2, "solver 'ilp'", "900 nodes", "chen-greedy")


def test_an_infeasible_budget_writes_nothing(capsys, tmp_path):
    status, _, err, out = run_cli(capsys, tmp_path, GOOD_MODEL, "--budget", "1kB", "--solver", "dp")
    assert_clean_error(status, err, out, 3, "below the minimum")


# -- inputs that do not match; a plan applied to the wrong model --------------------------------------------
@pytest.fixture(scope="module")
def small():
    model, inputs = mlp(width=32, depth=2), (torch.randn(8, 32),)
    return model, inputs, planner.plan(model, inputs, budget="100%", solver="store-all")


def test_example_inputs_that_do_not_fit_the_model(small):
    model, _, _ = small
    with pytest.raises(profiler.ModelCallError, match="the model raised on the example inputs: RuntimeError"):
        planner.plan(model, (torch.randn(8, 31),), budget="100%")
    with pytest.raises(TypeError, match="example_inputs must be"):
        planner.plan(model, 42, budget="100%")


def test_calls_that_do_not_match_the_plan(small):
    model, inputs, plan = small
    planned = planner.apply(model, plan)
    with pytest.raises(runtime.InputMismatch, match=r"float64\[8, 32\].*float32\[8, 32\]"):
        planned(inputs[0].double())
    with pytest.raises(runtime.InputMismatch, match="structure"):
        planned(x=inputs[0])
    with torch.no_grad():  # inference runs the original forward: any shape
        assert planned(torch.randn(3, 32)).shape == (3, 4)


def test_a_plan_applied_to_the_wrong_model(small, tmp_path):
    model, inputs, plan = small
    wider = mlp(width=32, depth=2)
    wider[0], wider[3] = nn.Linear(32, 48), nn.Linear(48, 32)  # same inputs and outputs, other shapes
    with pytest.raises(runtime.PlanMismatch, match=r"'0.weight' is float32\[48, 32\] here but float32\[32, 32\]"):
        training_step(planner.apply(wider, plan), inputs)
    without_bias = mlp(width=32, depth=2)
    without_bias[0] = nn.Linear(32, 32, bias=False)
    with pytest.raises(runtime.PlanMismatch, match="'0.bias', which this model does not"):
        training_step(planner.apply(without_bias, plan), inputs)
    with pytest.raises(runtime.PlanMismatch, match="which the plan's model did not"):
        training_step(planner.apply(mlp(width=32, depth=3), plan), inputs)
    plan.save(tmp_path / "plan.json")
    loaded = planner.load(tmp_path / "plan.json")
    with pytest.raises(runtime.InputMismatch, match=r"the inputs are float32\[4, 32\] on cpu; the plan was made for"):
        training_step(planner.apply(model, loaded), (torch.randn(4, 32),))
    with pytest.raises(runtime.PlanMismatch, match="different model or different input shapes"):
        training_step(planner.apply(mlp(width=32, depth=3), loaded), inputs)
    with pytest.raises(TypeError, match="nn.Module"):
        planner.apply("model.pt", plan)
    with pytest.raises(TypeError, match="planner.Plan"):
        planner.apply(model, str(tmp_path / "plan.json"))


def test_a_frozen_parameter_unfrozen_after_planning_is_refused():
    model, inputs = mlp(width=16, depth=2), (torch.randn(4, 16),)
    model[0].weight.requires_grad_(False)
    planned = planner.checkpoint(model, inputs, budget="100%", solver="store-all")
    training_step(planned, inputs)
    model[0].weight.requires_grad_(True)
    with pytest.raises(runtime.PlanMismatch, match="'0.weight' was frozen"):
        training_step(planned, inputs)


# -- corrupted plan files --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_text(small, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    small[2].save(path)
    return path.read_text()


def _corrupt(text: str, change) -> str:
    data = json.loads(text)
    change(data)
    return json.dumps(data)


def _first_compute(data) -> list:
    return next(s for s in data["schedule"]["steps"] if s[0] == "compute")


CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "binary": lambda text: "\x00\x81\xff junk",
    "a list": lambda text: "[1, 2, 3]",
    "deeply nested": lambda text: "[" * 100_000 + "]" * 100_000,
    "another format": lambda text: _corrupt(text, lambda d: d.update(format="plan-checkpoints/99")),
    "no schedule": lambda text: _corrupt(text, lambda d: d.pop("schedule")),
    "bytes as text": lambda text: _corrupt(text, lambda d: d.update(fixed_bytes="lots")),
    "infinite bytes": lambda text: text.replace('"fixed_bytes": ', '"fixed_bytes": 1e999, "was": '),
    "steps not a list": lambda text: _corrupt(text, lambda d: d["schedule"].update(steps={"compute": "x"})),
    "a step of three": lambda text: _corrupt(text, lambda d: d["schedule"]["steps"].append(["compute", "a", "b"])),
    "unknown step kind": lambda text: _corrupt(text, lambda d: _first_compute(d).__setitem__(0, "recompute")),
    "unknown node": lambda text: _corrupt(text, lambda d: _first_compute(d).__setitem__(1, "fw:nowhere#0")),
    "node never computed": lambda text: _corrupt(text, lambda d: d["schedule"]["steps"].remove(_first_compute(d))),
    "compute before its input": lambda text: _corrupt(
        text, lambda d: d["schedule"]["steps"].insert(0, d["schedule"]["steps"].pop(
            next(i for i, s in enumerate(d["schedule"]["steps"]) if s[0] == "compute" and s[1] == "loss")))),
    "negative memory": lambda text: _corrupt(text, lambda d: d["graph"]["nodes"][0].update(mem=-5)),
    "edited memory": lambda text: _corrupt(text, lambda d: d["graph"]["nodes"][0].update(mem=d["graph"]["nodes"][0]["mem"] + 1)),
    "edge to nowhere": lambda text: _corrupt(text, lambda d: d["graph"]["edges"].append(["loss", "ghost"])),
    "unknown dtype": lambda text: _corrupt(text, lambda d: d["tangent_specs"][0].update(dtype="load")),
    "tangent index as text": lambda text: _corrupt(text, lambda d: d.update(tangent_outputs="0")),
    "autocast as a number": lambda text: _corrupt(text, lambda d: d.update(autocast=1)),
    "no structural workspace": lambda text: _corrupt(text, lambda d: next(
        n for n in d["graph"]["nodes"] if "structural_workspace" in n).update(structural_workspace=None)),
    "loss value as text": lambda text: _corrupt(text, lambda d: d["graph"]["attributes"].update(loss_value_bytes="8")),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_plan_files_are_refused_with_the_reason(plan_text, tmp_path, case):
    path = tmp_path / "plan.json"
    path.write_text(CORRUPTIONS[case](plan_text))
    with pytest.raises(planner.PlanFileError) as raised:
        planner.load(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_missing_plan_file_and_a_folder(tmp_path):
    with pytest.raises(planner.PlanFileError, match="cannot read plan file"):
        planner.load(tmp_path / "nope.json")
    with pytest.raises(planner.PlanFileError, match="cannot read plan file"):
        planner.load(tmp_path)


# -- plans are JSON: loading one runs no code ---------------------------------------------------------------
def test_loading_a_plan_never_evaluates_or_unpickles(plan_text, tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("load() tried to run code from the plan file")

    for owner, name in [(builtins, "eval"), (builtins, "exec"), (builtins, "compile"), (pickle, "loads"),
                        (pickle, "load"), (pickle, "Unpickler"), (marshal, "loads"), (torch, "load")]:
        monkeypatch.setattr(owner, name, forbidden)
    path = tmp_path / "plan.json"
    path.write_text(plan_text)
    assert planner.load(path).schedule


class _Payload:
    def __init__(self, sentinel: str):
        self.sentinel = sentinel

    def __reduce__(self):
        return (open, (self.sentinel, "w"))


def test_a_plan_file_cannot_make_load_run_anything(plan_text, tmp_path):
    sentinel = tmp_path / "ran"
    code = f"__import__('os').system('touch {sentinel}')"
    path = tmp_path / "plan.json"
    path.write_bytes(pickle.dumps(_Payload(str(sentinel))))  # a pickle that would create the sentinel
    with pytest.raises(planner.PlanFileError):
        planner.load(path)
    data = json.loads(plan_text)

    def poison(value):
        if isinstance(value, str):
            return code
        if isinstance(value, dict):
            return {k: poison(v) for k, v in value.items()}
        if isinstance(value, list):
            return [poison(v) for v in value]
        return value

    for key in data:  # every string of one top-level field at a time becomes code
        path.write_text(json.dumps({**data, key: poison(data[key])}))
        try:
            planner.load(path)
        except planner.PlanFileError:
            pass
    path.write_text(json.dumps({**data, "format": {"__reduce__": code}, "__class__": code}))
    with pytest.raises(planner.PlanFileError):
        planner.load(path)
    assert not sentinel.exists()
