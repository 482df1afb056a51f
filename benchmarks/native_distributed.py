"""Per-rank peaks of native plans under FSDP2 on 2 gloo ranks (docs/native.md, "Several processes").

Predicted: for the test model's rows, the unsharded step with the regions checkpointed, measured
in one process, plus ``planner.native.fsdp2_bytes`` (the bound the search counts); for the GPT-2,
the plan's prediction (exact). Exact: the region schedule's simulation with FSDP2's buffers placed
op by op (planner/fsdp2_timeline.py, what ``plan(..., distributed="fsdp2")`` predicts by), for the
test model's rows. Measured: each rank's peak over a
training step, as tests/ranks.py measures it (``rank_peak``). Cases:

- the model of tests/test_distributed_native.py (six residual blocks and a root Linear, 128 rows of
  width 32 per rank), per-block ``fully_shard`` with regions set by hand, and ``fully_shard`` on the
  whole model (``FSDP2(units=())``);
- a 4-layer GPT-2 (width 128, vocabulary 1000, 8 sequences of 64 tokens per rank) planned at 60%
  with ``distributed="fsdp2"`` (its units found by ``repeated_blocks``), sharded per
  ``transformer.h`` block, its gradients compared with the unplanned sharded model's over two SGD
  steps.

    python benchmarks/native_distributed.py
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from ranks import rank_peak, run_ranks  # noqa: E402

WORLD = 2
HAND_SET = [("per block", ("0", "1", "2", "3", "4", "5")), ("per block", ("[0:2]", "[2:4]", "4")),
            ("per block", ("[0:3]", "[3:6]")), ("whole model", ()), ("whole model", ("0", "1", "2", "3"))]


def _unsharded_peaks(rank: int) -> list[int]:
    """The test model's unsharded step with each HAND_SET's regions, measured in one process. Before
    any FSDP2 step: the profiler's table of blocks keeps stale sizes from frees gloo's thread made
    unrecorded, which a later measurement in the same process can record as frees (tests/ranks.py)."""
    import test_distributed_native as case

    from planner.native_measure import measure_native

    batch = case._local_batch(rank, 0)
    return [measure_native(case._model(), regions, (batch,), case._loss).peak_bytes for _, regions in HAND_SET]


def _exact_peaks(rank: int) -> list[int]:
    """The test model's per-rank peak for each HAND_SET row by planner/fsdp2_timeline.py, from its
    profile (before any FSDP2 step, as _unsharded_peaks says)."""
    import test_distributed_native as case

    from planner.fsdp2_timeline import fsdp2_peak_bytes
    from planner.native import FSDP2, native_profile
    from profiler.state import rng_state_bytes
    from solvers.regions import evaluate

    graph = native_profile(case._model(), (case._local_batch(rank, 0),), case._loss).regroup("op").graph
    held = int(graph.graph["fixed_bytes"]) + int(graph.graph.get("loss_value_bytes", 0))
    peaks = []
    for sharding, regions in HAND_SET:
        spec = FSDP2(WORLD) if sharding == "per block" else FSDP2(WORLD, units=())
        solved = evaluate(graph, regions)
        states = (len(regions) + 1) * rng_state_bytes() if regions else 0
        peaks.append(fsdp2_peak_bytes(solved.graph, solved.schedule, case._model(), spec, held + states))
    return peaks


def _test_model_rows(rank: int, unsharded_peaks: list[int], exact_peaks: list[int]) -> list[dict]:
    import test_distributed_native as case
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from planner.native import FSDP2, fsdp2_bytes
    from runtime.native import apply_native

    mesh = init_device_mesh("cpu", (WORLD,))
    batch = case._local_batch(rank, 0)
    rows = []
    for (sharding, regions), unsharded, exact in zip(HAND_SET, unsharded_peaks, exact_peaks, strict=True):
        spec = FSDP2(WORLD) if sharding == "per block" else FSDP2(WORLD, units=())

        def build(regions=regions, sharding=sharding):
            model = apply_native(case._model(), regions)
            if sharding == "per block":
                for block in model[:-1]:
                    fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model

        measured = batch.numel() * batch.element_size() + rank_peak(
            build, lambda module: case._loss(module(batch)).backward())
        rows.append({"case": f"test model, {sharding}, regions {', '.join(regions) or 'none'}",
                     "predicted": unsharded + fsdp2_bytes(case._model(), spec, regions), "exact": exact,
                     "measured": measured})
    return rows


def _plan_gpt2(rank: int, folder: str) -> None:
    """Rank 0 plans the GPT-2 case (before any FSDP2 step, as _unsharded_peaks says)."""
    import torch.distributed as dist
    from models import gpt2

    import planner

    if rank == 0:
        planner.plan(gpt2(), _gpt2_batch(0), budget="60%", loss_fn=lambda out: out.loss,
                     distributed="fsdp2").save(os.path.join(folder, "gpt2.json"))
    dist.barrier()


def _gpt2_batch(rank: int) -> dict:
    import torch

    ids = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(rank))
    return {"input_ids": ids, "labels": ids}


def _gpt2_row(rank: int, folder: str) -> dict:
    import torch
    from models import gpt2
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import planner

    mesh = init_device_mesh("cpu", (WORLD,))
    batch = _gpt2_batch(rank)
    ids = batch["input_ids"]
    plan = planner.load(os.path.join(folder, "gpt2.json"))

    def build(planned: bool = True):
        model = gpt2()
        if planned:
            planner.apply(model, plan)
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    histories = []
    for planned in (False, True):
        model = build(planned)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        history = []
        for step in range(2):
            torch.manual_seed(10 * step + rank)  # the same dropout masks in both runs
            optimizer.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            history.append({n: p.grad.to_local().clone() for n, p in model.named_parameters()})
            optimizer.step()
        histories.append(history)
    difference = max((a[k] - b[k]).abs().max().item() for a, b in zip(*histories, strict=True) for k in a)
    def step(module) -> None:
        output = module(**batch)  # held through the backward (its logits), as the plan's step holds it
        output.loss.backward()

    measured = ids.numel() * ids.element_size() + rank_peak(build, step)
    return {"case": f"GPT-2 4x128, per block, '60%' ({', '.join(plan.regions)})", "budget": plan.budget_bytes,
            "predicted": plan.predicted_peak_bytes, "measured": measured, "difference": difference}


def _work(rank: int, folder: str) -> dict:
    unsharded, exact = _unsharded_peaks(rank), _exact_peaks(rank)
    _plan_gpt2(rank, folder)
    return {"rows": [*_test_model_rows(rank, unsharded, exact), _gpt2_row(rank, folder)]}


def main() -> None:
    ranks = run_ranks(_work, tempfile.mkdtemp(), world=WORLD)
    print("| case | predicted per rank (B) | exact per rank (B) | measured, rank 0 / rank 1 (B) | budget (B) "
          "| max grad difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for index, row in enumerate(ranks[0]["rows"]):
        measured = " / ".join(f"{r['rows'][index]['measured']:,}" for r in ranks)
        budget = f"{row['budget']:,}" if "budget" in row else ""
        difference = " / ".join(str(r["rows"][index]["difference"]) for r in ranks) if "difference" in row else ""
        exact = f"{row['exact']:,}" if "exact" in row else ""
        print(f"| {row['case']} | {row['predicted']:,} | {exact} | {measured} | {budget} | {difference} |")


if __name__ == "__main__":
    main()
