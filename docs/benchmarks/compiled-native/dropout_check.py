"""Eager and compiled peaks of the eager native search's least regions on a small GPT-2, with and
without dropout (docs/benchmarks.md, "Compile-priced native plans").

    python docs/benchmarks/compiled-native/dropout_check.py
"""

import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]

import planner  # noqa: E402
from models import gpt2, gpt2_inputs, hf_loss  # noqa: E402
from planner.budget import Budget  # noqa: E402
from planner.compiled import _least_plan, measure_compiled  # noqa: E402
from planner.native import plan_native  # noqa: E402
from planner.native_measure import measure_native  # noqa: E402
from solvers import Infeasible  # noqa: E402

MiB = 2**20


def least_regions(model, inputs, profile):
    def eager(target):
        return plan_native(model, inputs, Budget(bytes=max(int(target), 1)), loss_fn=hf_loss, profile=profile,
                           measure=False)

    fixed = eager(10**12).fixed_bytes
    try:
        return eager(1).regions
    except Infeasible as error:
        return _least_plan(eager, error, fixed)[1].regions


for p in (0.1, 0.0):
    model, inputs = gpt2(layers=2, embd=128, dropout=p).train(), gpt2_inputs()
    profile = planner.profile_for(model, inputs, loss_fn=hf_loss)
    for regions in ((), least_regions(model, inputs, profile)):
        eager = measure_native(model, regions, inputs, hf_loss).peak_bytes / MiB
        compiled = measure_compiled(model, regions, inputs, hf_loss, 1).peak_bytes / MiB
        print(f"dropout {p}: regions {regions}: eager {eager:.1f} MiB, compiled {compiled:.1f} MiB", flush=True)
