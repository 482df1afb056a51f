"""The planned module composes with torch.compile, DistributedDataParallel and FSDP2.

The distributed tests run 2 processes on the gloo backend (tests/ranks.py). Rank 0
plans and saves the plan; every rank loads it and applies it, then wraps the planned module (plan,
apply, then wrap). Gradients are compared with the same wrapper around the unplanned model and with
one process running the unplanned model on the whole batch.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import planner
from models import max_relative_error, mlp, training_step
from ranks import WORLD, run_ranks
from schedules import recompute_everything, with_schedule

BATCH = 16  # the whole batch; each rank takes BATCH // WORLD rows


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _batch() -> torch.Tensor:
    return torch.randn(BATCH, 16, generator=torch.Generator().manual_seed(7))


def _loss(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()  # a mean: averaging the ranks' gradients gives the whole batch's


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Full gradients by parameter name (FSDP2's are sharded DTensors: gathered)."""
    result = {}
    for name, p in module.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        result[name.replace("module.", "", 1) if name.startswith("module.") else name] = grad.detach().clone()
    return result


def _step(module: nn.Module, inputs: torch.Tensor, optimizer=None) -> dict[str, torch.Tensor]:
    module.zero_grad(set_to_none=True)
    _loss(module(inputs)).backward()
    grads = _grads(module)
    if optimizer is not None:
        optimizer.step()
    return grads


def _reference_grads(steps: int) -> list[dict[str, torch.Tensor]]:
    """One process, the unplanned model, the whole batch, SGD between steps."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return [_step(model, _batch(), optimizer) for _ in range(steps)]


def _work(rank: int, folder: str) -> dict:
    import torch.distributed as dist

    local = _batch()[rank * (BATCH // WORLD):(rank + 1) * (BATCH // WORLD)]
    path = os.path.join(folder, "plan.json")
    if rank == 0:  # plan once, for one rank's shapes; every rank loads the same file
        plan = planner.plan(_model(), (local,), budget="100%", solver="store-all", loss_fn=_loss)
        with_schedule(plan, recompute_everything(plan.graph)).save(path)
    dist.barrier()
    plan = planner.load(path)
    return {"recomputed": len(plan.recomputed()), "ddp": _ddp(plan, local), "fsdp": _fsdp(plan, local),
            "fsdp_submodule": _fsdp_submodule_refused(plan, local)}


def _compare(reference: list[dict], unplanned: list[dict], planned: list[dict]) -> dict:
    return {
        "vs_unplanned": max(max_relative_error(a, b) for a, b in zip(unplanned, planned)),
        "vs_single_process": max(max_relative_error(a, b) for a, b in zip(reference, planned)),
    }


def _ddp(plan, local) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    runs = []
    for planned in (False, True):
        model = _model()
        module = DDP(planner.apply(model, plan) if planned else model)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        runs.append([_step(module, local, optimizer) for _ in range(2)])
    return _compare(_reference_grads(2), *runs)


def _fsdp(plan, local) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    runs = []
    for planned in (False, True):
        model = _model()
        module = planner.apply(model, plan) if planned else model
        fully_shard(module, mesh=mesh)  # reshards after forward: parameters are swapped every step
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        runs.append([_step(module, local, optimizer) for _ in range(2)])
    return _compare(_reference_grads(2), *runs)


def _fsdp_submodule_refused(plan, local) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    module = planner.apply(_model(), plan)
    fully_shard(module[0], mesh=mesh)
    fully_shard(module, mesh=mesh)
    try:
        module(local)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "not refused"


@pytest.fixture(scope="module")
def distributed_results(tmp_path_factory):
    return run_ranks(_work, str(tmp_path_factory.mktemp("distributed")))


def test_ddp_with_a_plan_saved_on_rank_0(distributed_results):
    for result in distributed_results:
        assert result["recomputed"] > 0  # the plan recomputes: it is not store-all in disguise
        assert result["ddp"]["vs_unplanned"] == 0.0  # same ops, same all-reduce
        assert result["ddp"]["vs_single_process"] <= 1e-5


def test_fsdp2_fully_shard_on_the_planned_module(distributed_results):
    for result in distributed_results:
        assert result["fsdp"]["vs_unplanned"] <= 1e-6
        assert result["fsdp"]["vs_single_process"] <= 1e-5


def test_fsdp2_on_submodules_is_refused_clearly(distributed_results):
    for result in distributed_results:
        assert result["fsdp_submodule"].startswith("PlanMismatch"), result["fsdp_submodule"]
        assert "fully_shard to the planned module as a whole" in result["fsdp_submodule"]


# -- torch.compile ------------------------------------------------------------------------------------
def _strip_compile_prefix(grads: dict) -> dict:
    return {name.replace("_orig_mod.", ""): g for name, g in grads.items()}


@pytest.fixture(scope="module")
def compile_setup():
    model, inputs = mlp(width=32, depth=3), (torch.randn(8, 32),)
    plan = planner.plan(model, inputs, budget="100%", solver="store-all")
    return model, inputs, with_schedule(plan, recompute_everything(plan.graph))


def test_torch_compile_on_the_planned_module(compile_setup):
    """The planned forward is excluded from dynamo (runtime/module.py): compiling the planned module
    runs the schedule as it is, with the original's gradients, dropout included."""
    model, inputs, plan = compile_setup
    torch._dynamo.reset()
    compiled = torch.compile(planner.apply(model, plan))
    loss0, grads0, rng0 = training_step(model, inputs)
    loss1, grads1, rng1 = training_step(compiled, inputs)
    assert torch.equal(loss0, loss1) and torch.equal(rng0, rng1)
    assert max_relative_error(grads0, _strip_compile_prefix(grads1)) == 0.0


def test_torch_compile_on_a_model_that_contains_the_planned_module(compile_setup):
    """Dynamo breaks the graph around the planned module and compiles what is around it
    (aot_eager: AOTAutograd without inductor's code generation, which takes minutes on 2 cores)."""
    model, inputs, plan = compile_setup

    class Outer(nn.Module):
        def __init__(self, inner: nn.Module, head: nn.Linear):
            super().__init__()
            self.inner, self.head = inner, head

        def forward(self, x):
            return self.head(torch.relu(self.inner(x) * 2))

    torch.manual_seed(0)
    head = nn.Linear(4, 2)
    original, planned = Outer(model, head), Outer(planner.apply(model, plan), head)
    torch._dynamo.reset()
    compiled = torch.compile(planned, backend="aot_eager")
    _, grads0, _ = training_step(original, inputs)
    _, grads1, _ = training_step(compiled, inputs)
    assert max_relative_error(grads0, _strip_compile_prefix(grads1)) <= 1e-6
