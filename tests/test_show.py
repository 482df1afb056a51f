"""``plan-checkpoints show plan.json [--out memory.png]``, run as a user runs it."""

import json
import struct

import torch
from torch import nn

import planner
from solvers import simulate

from test_cli import run


def _plan(path, budget="90%"):
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    model = nn.Sequential(*layers)
    made = planner.plan(model, (torch.randn(128, 32),), budget=budget, solver="chen-greedy")
    made.save(path)
    return made


def test_show_describes_the_plan_and_plots_its_memory(tmp_path):
    made = _plan(tmp_path / "plan.json")
    out = tmp_path / "pictures" / "memory.png"
    result = run("show", tmp_path / "plan.json", "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(made.summary())  # the plan in words, as planning printed it
    assert f"Memory plot written to {out}" in result.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 300, (width, height)
    assert len(data) > 15_000  # a curve, lines and labels, not an empty canvas
    assert [p.name for p in out.parent.iterdir()] == ["memory.png"]  # no temporary left


def test_the_plotted_memory_is_the_simulated_schedule(tmp_path):
    from planner.cli.show import memory_profile

    made = _plan(tmp_path / "plan.json", budget="85%")
    loaded = planner.load(tmp_path / "plan.json")
    profile = memory_profile(loaded)
    assert len(profile.memory) == len(loaded.schedule)
    assert profile.peak_bytes == made.predicted_peak_bytes == loaded.fixed_bytes + max(profile.memory)
    assert profile.peak_bytes <= loaded.budget_bytes < loaded.unplanned_peak_bytes
    kind, node = list(loaded.schedule)[profile.loss_step]
    assert (kind, node) == ("compute", loaded.graph.graph["loss_node"])
    assert simulate(loaded.graph, loaded.schedule).peak_bytes == max(profile.memory)


def test_show_refuses_a_file_that_is_not_a_plan(tmp_path, capsys):
    from planner.cli import main

    (tmp_path / "plan.json").write_text(json.dumps({"format": "something else"}))
    assert main(["show", str(tmp_path / "plan.json"), "--out", str(tmp_path / "memory.png")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("plan-checkpoints: error: ") and "is not a plan-checkpoints plan" in error
    assert len(error.strip().splitlines()) == 1
    assert not (tmp_path / "memory.png").exists()
