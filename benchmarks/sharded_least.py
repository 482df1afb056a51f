"""What the FSDP2 planner reaches on a meta-device Llama, against checkpointing every layer
(docs/native.md, "A model that only fits sharded"): for each budget, the plan or the refusal (with
the least it names), beside the exact per-rank peaks (planner/fsdp2_timeline.py) of the
un-checkpointed step and of every decoder layer checkpointed. Nothing is run but the planning.

    python benchmarks/sharded_least.py --layers 4 --width 1024 --vocab 32000 --tokens 256 90%
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from native_sharded import batch, llama  # noqa: E402


def every_layer_peaks(shape: dict, world: int) -> tuple[int, int]:
    """(un-checkpointed, every decoder layer checkpointed): one rank's exact peak (bytes)."""
    from planner.fsdp2_timeline import fsdp2_peak_bytes
    from planner.native import FSDP2
    from planner.native_solve import rng_bytes
    from profiler.meta import meta_profile
    from solvers.regions import evaluate

    model = llama(shape, meta=True)
    graph = meta_profile(model, batch(shape, 0, 0), lambda o: o.loss, granularity="op").regroup("op").graph
    held = int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))
    peaks = []
    for regions in ((), tuple(f"model.layers.{i}" for i in range(shape["layers"]))):
        solved = evaluate(graph, regions)
        peaks.append(fsdp2_peak_bytes(solved.graph, solved.schedule, model, FSDP2(world), held + rng_bytes(regions, [])))
    return peaks[0], peaks[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 4), ("width", 1024), ("vocab", 32000), ("tokens", 256), ("batch", 2), ("world", 4)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("budgets", nargs="+")
    args = parser.parse_args()
    import torch

    import planner
    from planner.native import FSDP2

    torch.set_num_threads(1)
    shape = {k: getattr(args, k) for k in ("layers", "width", "vocab", "tokens", "batch")}
    unplanned, every = every_layer_peaks(shape, args.world)
    print(f"per rank, exact: un-checkpointed {unplanned:,} B; every layer checkpointed {every:,} B "
          f"({every / unplanned:.1%})")
    for budget in args.budgets:
        started = time.perf_counter()
        try:
            plan = planner.plan(llama(shape, meta=True), batch(shape, 0, 0), budget=budget, loss_fn=lambda o: o.loss,
                                distributed=FSDP2(args.world))
            said = (f"plan: budget {plan.budget_bytes:,} B, predicted {plan.predicted_peak_bytes:,} B "
                    f"({plan.predicted_peak_bytes / unplanned:.1%}), {len(plan.regions)} regions")
        except planner.BudgetInfeasible as error:
            least = f"{error.min_budget:,} B ({error.min_budget / unplanned:.1%})" if error.min_budget else "not named"
            said = f"refused; least named {least}"
        print(f"{budget}: {said}; {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
