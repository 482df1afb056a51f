"""Native plans under DistributedDataParallel and per-block FSDP2, on 2 gloo ranks.

Rank 0 plans one rank's step (its share of the batch) and saves the plan; every rank loads it and
applies it to its own model, then wraps it. Gradients and parameters after several SGD steps, dropout
on, must equal the same wrapper around the unplanned model; each rank's measured peak must be within
the budget.
"""

from __future__ import annotations

import json
import os
import socket
import traceback

import pytest
import torch
from torch import nn

import planner
from models import ResidualBlock
from profiler.allocations import allocated_while

WORLD = 2
LOCAL_BATCH = 128
STEPS = 3


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[ResidualBlock(32, 128) for _ in range(6)], nn.Linear(32, 4))


def _local_batch(rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(LOCAL_BATCH, 32, generator=generator)


def _loss(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def _local_bytes(module: nn.Module) -> int:
    """Bytes of this rank's parameters and buffers (a DTensor's local shard)."""
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _train(module: nn.Module, rank: int) -> list[dict]:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    history = []
    for step in range(STEPS):
        torch.manual_seed(1000 * step + rank)  # each rank draws its own dropout masks, the same in both runs
        optimizer.zero_grad(set_to_none=True)
        _loss(module(_local_batch(rank, step))).backward()
        grads = {}
        for name, p in module.named_parameters():
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads[name] = grad.detach().clone()
        history.append(grads)
        optimizer.step()
    return history


def _max_difference(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        worst = max(worst, *((x[k] - y[k]).abs().max().item() for k in x))
    return worst


def _peak(module: nn.Module, rank: int, build=None) -> int:
    """Resident bytes (local parameters, buffers, the batch), plus what wrapping and a warm-up step
    leave allocated (DDP's buckets, rebuilt after the first step; the warm-up's gradients, which the
    measured step frees first), plus the most the measured step allocates on top: the step's peak,
    not the wrapping's transients (DDP broadcasts a flat copy of the parameters when it wraps)."""
    batch = _local_batch(rank, 0)
    holder = {}

    def step():
        wrapped = holder["wrapped"]
        wrapped.zero_grad(set_to_none=True)
        _loss(wrapped(batch)).backward()

    def wrap_and_warm():
        holder["wrapped"] = build(module) if build else module
        step()

    _, held = allocated_while(wrap_and_warm)
    step_peak, _ = allocated_while(step)
    return _local_bytes(module) + batch.numel() * batch.element_size() + held + step_peak


def _ddp(rank: int, plan) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    runs = [_train(DDP(_model()), rank), _train(DDP(planner.apply(_model(), plan)), rank)]
    # The buckets are allocated when DDP wraps the model: measure the wrapping with the step.
    peak = _peak(planner.apply(_model(), plan), rank, build=DDP)
    return {"difference": _max_difference(*runs), "peak": peak}


def _fsdp_per_block(rank: int, plan) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))

    def sharded(model: nn.Sequential) -> nn.Module:
        for block in model:  # the way FSDP2 saves memory: each block its own unit, then the root
            if isinstance(block, ResidualBlock):
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    runs = [_train(sharded(_model()), rank), _train(sharded(planner.apply(_model(), plan)), rank)]
    module = sharded(planner.apply(_model(), plan))
    _train(module, rank)  # warm: FSDP2's lazy initialisation is not the step
    return {"difference": _max_difference(*runs), "peak": _peak(module, rank)}


def _worker(rank: int, folder: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results: dict = {}
    try:
        paths = {name: os.path.join(folder, f"{name}.json") for name in ("ddp", "plain")}
        if rank == 0:
            example = (_local_batch(0, 0),)
            planner.plan(_model(), example, budget="60%", loss_fn=_loss, distributed="ddp").save(paths["ddp"])
            planner.plan(_model(), example, budget="60%", loss_fn=_loss).save(paths["plain"])
        dist.barrier()
        ddp_plan, plain_plan = planner.load(paths["ddp"]), planner.load(paths["plain"])
        results["plans"] = {name: {"regions": list(p.regions), "budget": p.budget_bytes,
                                   "predicted": p.predicted_peak_bytes, "unplanned": p.unplanned_peak_bytes}
                            for name, p in (("ddp", ddp_plan), ("plain", plain_plan))}
        results["ddp"] = _ddp(rank, ddp_plan)
        results["fsdp"] = _fsdp_per_block(rank, plain_plan)
    except Exception:
        results["error"] = traceback.format_exc()
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as file:
        json.dump(results, file)
    dist.barrier()  # tear down together (a rank destroying its group early aborted its peer once)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        pytest.skip("torch was built without torch.distributed")
    folder = str(tmp_path_factory.mktemp("native-distributed"))
    mp.spawn(_worker, args=(folder, _free_port()), nprocs=WORLD, join=True)
    found = []
    for rank in range(WORLD):
        with open(os.path.join(folder, f"rank{rank}.json")) as file:
            found.append(json.load(file))
    for rank, result in enumerate(found):
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
    return found


def test_ddp_counts_its_buckets_and_trains_as_the_unplanned_model(results):
    for result in results:
        plans = result["plans"]
        assert plans["ddp"]["regions"], "the plan should checkpoint something"
        # The buckets are one copy of the trainable parameters, in the base of "60%" too.
        assert plans["ddp"]["unplanned"] > plans["plain"]["unplanned"]
        assert result["ddp"]["difference"] == 0.0
        assert result["ddp"]["peak"] <= plans["ddp"]["budget"], result["ddp"]
        assert abs(result["ddp"]["peak"] - plans["ddp"]["predicted"]) <= 0.03 * plans["ddp"]["predicted"], result


def test_fsdp2_per_block_with_a_native_plan(results):
    for result in results:
        plans = result["plans"]
        assert plans["plain"]["regions"]
        assert result["fsdp"]["difference"] <= 1e-6  # sharded reductions may round differently
        # Planned unsharded: sharding only lowers the resident parameters, and the plan is within it.
        assert result["fsdp"]["peak"] <= plans["plain"]["budget"], result["fsdp"]
