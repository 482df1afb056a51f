"""cpsat (OR-tools) and ilp (HiGHS through highspy) in one process, in either order: OR-tools bundles
its own HiGHS library under the name highspy's uses, and mismatched versions made the second import
fail (pyproject.toml pins the pair). Each order runs in a fresh interpreter."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from graphs import training_graph
from solvers import solve
graph = training_graph(6, unit=True)
for method in {order!r}:
    schedule = solve(graph, 4, method=method, time_limit=30)
    print(method, schedule.info.status, schedule.info.compute_cost)
"""


@pytest.mark.parametrize("order", [("cpsat", "ilp"), ("ilp", "cpsat")])
def test_cpsat_and_ilp_in_one_process(order):
    script = SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), order=order)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(order)
    assert all(line.split()[1] in ("optimal", "optimal-in-order", "feasible") for line in lines)
