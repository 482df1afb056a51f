"""benchmarks/compare.py's native rows (issue 28, "compare.py rerun at every baseline's peak"), on a
small residual MLP with the benchmark's own baselines (checkpoint_sequential, SAC): each native plan
is searched under the run's ``--time-limit`` and measures within the baseline's peak it was planned
at. In a subprocess: compare.py puts benchmarks/ on the path, whose models.py is not tests/models.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import compare
import models
import planner

asked = []
plan = planner.plan
def recording_plan(*args, **kwargs):
    if kwargs.get("executor") != "traced":  # the traced store-all plan that prices no checkpointing
        asked.append(kwargs.get("time_limit"))
    return plan(*args, **kwargs)
compare.planner.plan = recording_plan

small = models.BENCHMARKS["residual-mlp"]
compare.BENCHMARKS["small-mlp"] = models.Benchmark(
    "small-mlp", lambda: models.residual_mlp(width=32, hidden=128, depth=9),
    lambda: models.mlp_batch(batch=256, width=32), small.loss_fn, dict(small.baselines))
result = compare.run_model("small-mlp", rounds=1, fractions=[], solvers=[], time_limit=7.5, with_compile=False,
                           with_compiled_plans=False, with_traced=False, with_compiled_native=False,
                           cpu_time=True)
print(json.dumps({"asked": asked, "rows": result["rows"]}))
"""


def test_native_rows_are_searched_under_the_runs_time_limit_and_measure_within_each_peak():
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {row["method"]: row for row in found["rows"]}
    native = {method: row for method, row in rows.items() if method.startswith("native@")}
    assert set(native) == {"native@100%", "native@checkpoint-sequential", "native@sac"}, sorted(rows)
    assert found["asked"] == [7.5] * len(native)  # planner.plan's own 30 s before: --time-limit ignored
    for method, row in native.items():
        assert row["status"] in ("optimal", "feasible"), row
        baseline = method.split("@", 1)[1]
        if baseline != "100%":
            assert row["note"].split(" ")[0] != "0", row  # below the eager step: something checkpointed
            assert row["measured_peak"] <= rows[baseline]["measured_peak"], (method, row["measured_peak"],
                                                                            rows[baseline]["measured_peak"])
        assert len(row["times"]) == 1
