"""A model that only fits sharded (issue 27, item 5): planned on the meta device, in a process whose
address space is capped below the model's unsharded step, for per-block FSDP2 on 4 ranks; then 4
gloo ranks (not capped: gloo's threads reserve address space no allocator sees) build the model for
real, apply the plan, shard each decoder layer and the root, and train.

Checked: the plan is made under the cap, and the unsharded step fails there; each rank's measured
peak (allocator events, tests/ranks.py) is within the per-rank budget, below the same ranks' peak
unplanned, and within 3% of the plan's prediction; the gradients over two SGD steps, dropout on,
equal an unplanned FSDP2 run's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import planner
from capped import run_capped
from ranks import rank_peak, run_ranks

WORLD = 4
BATCH, TOKENS, VOCAB = 2, 256, 512  # one rank's batch
STEPS = 2
# The planning process's address space above its own baseline: under the unsharded step's
# ~65 MB (it fails there, checked below) and above the per-rank budget (half of that).
CAP_BYTES = 48 * 2**20
BUDGET = "50%"  # of the predicted un-checkpointed per-rank peak


def llama_config():
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=8, vocab_size=VOCAB,
                                      attention_dropout=0.1, max_position_embeddings=TOKENS, use_cache=False)
    config._attn_implementation = "eager"  # its attention dropout runs as an op the trace sees
    return config


def real_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(llama_config())


def meta_model() -> torch.nn.Module:
    import transformers

    with torch.device("meta"):
        return transformers.LlamaForCausalLM(llama_config())


def batch(rank: int, step: int) -> dict:
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(100 * step + rank))
    return {"input_ids": ids, "labels": ids.clone()}


def loss(output) -> torch.Tensor:
    return output.loss


PLANNING = """
from planner.native import FSDP2
from test_sharded_native import CAP_BYTES, BUDGET, WORLD, batch, loss, meta_model

model = meta_model()  # no memory: shapes only
example = batch(0, 0)
start = mapped_bytes()
cap(CAP_BYTES)
made = planner.plan(model, example, budget=BUDGET, loss_fn=loss, distributed=FSDP2(WORLD))
made.save({path!r})
result(predicted=made.predicted_peak_bytes, budget=made.budget_bytes, unplanned=made.unplanned_peak_bytes,
       regions=list(made.regions), summary=made.summary(), grown=mapped_bytes() - start)
"""

# The unsharded step under the same cap, in a fresh process (a process that planned first can
# serve it from address space its allocator reserved while planning, which no cap then sees).
UNSHARDED = """
from test_sharded_native import CAP_BYTES, batch, real_model

example = batch(0, 0)
cap(CAP_BYTES)
try:
    real_model()(**example).loss.backward()
    result(unsharded_step="ran")
except (RuntimeError, MemoryError) as error:
    result(unsharded_step=f"{type(error).__name__}: {str(error).splitlines()[0]}")
"""


def _shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _train(model: torch.nn.Module, rank: int) -> list[dict]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(STEPS):
        torch.manual_seed(1000 * step + rank)  # each rank its own dropout masks, the same in both runs
        optimizer.zero_grad(set_to_none=True)
        model(**batch(rank, step)).loss.backward()
        history.append({name: p.grad.to_local().detach().clone() for name, p in model.named_parameters()})
        optimizer.step()
    return history


def _rank_work(rank: int, folder: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    plan = planner.load(os.path.join(folder, "plan.json"))
    mesh = init_device_mesh("cpu", (WORLD,))

    def build(planned: bool = True) -> torch.nn.Module:
        model = real_model()
        if planned:
            planner.apply(model, plan)
        return _shard(model, mesh)

    runs = [_train(build(False), rank), _train(build(True), rank)]
    difference = max((a[k] - b[k]).abs().max().item() for a, b in zip(*runs, strict=True) for k in a)
    first = batch(rank, 0)
    held = sum(t.numel() * t.element_size() for t in first.values())

    def step(module):
        output = module(**first)  # held through the backward, as the plan's step holds it
        loss(output).backward()

    return {"difference": difference, "peak": held + rank_peak(build, step, repeats=3),
            # One window: an upper bound (gloo's unrecorded frees only add), enough to compare against.
            "unplanned": held + rank_peak(lambda: build(False), step, repeats=1)}


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sharded"))
    path = os.path.join(folder, "plan.json")
    figures, done = run_capped(PLANNING.format(path=path))
    assert figures is not None, done.stderr[-3000:]
    # One malloc arena: a second one, reserved by the warm-up before the cap (which one does depends on
    # what the warm-up ran: the exact search's HiGHS thread, or not where the chain's program plans),
    # would serve the step from address space mapped before it: measured, the step then "ran" under
    # 36 MiB; with one arena it fails under 48 MiB and runs under 64 (its ~62 MB).
    unsharded, done = run_capped(UNSHARDED, malloc_arenas=1)
    assert unsharded is not None, done.stderr[-3000:]
    figures.update(unsharded)
    ranks = run_ranks(_rank_work, folder, world=WORLD)
    print(json.dumps({"planning": {k: v for k, v in figures.items() if k != "summary"}, "ranks": ranks}))  # -s shows it
    return figures, ranks, path


def test_planned_under_a_cap_the_unsharded_step_does_not_fit(sharded_run):
    figures, _, path = sharded_run
    assert figures["unsharded_step"] != "ran", figures
    assert "allocate" in figures["unsharded_step"] or "memory" in figures["unsharded_step"].lower(), figures
    assert figures["regions"], "the plan should checkpoint something"
    assert "fsdp2, 4 ranks, units model.layers.0" in figures["summary"], figures["summary"]
    with open(path) as file:
        saved = json.load(file)
    assert saved["measured_peak_bytes"] is None and saved["unplanned_peak_predicted"] is True


def test_ranks_train_within_the_budget_as_the_unplanned_model(sharded_run):
    figures, ranks, _ = sharded_run
    for rank, measured in enumerate(ranks):
        assert measured["difference"] <= 1e-6, (rank, measured)
        assert measured["peak"] <= figures["budget"], (rank, measured, figures["budget"])
        assert measured["peak"] < measured["unplanned"], (rank, measured)
        assert abs(measured["peak"] - figures["predicted"]) <= 0.03 * figures["predicted"], (rank, measured, figures)


# -- without ranks ---------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    """One torch thread while the test times ops: two, on two loaded cores, wait on each other in
    every op (a 64 x 64 matmul took 30-50 ms instead of 10 us)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # the ranks' test covers it: its prediction is within 3% only on the same graph
def test_meta_profile_is_the_materialised_models(one_thread):
    """The meta model's profile has the materialised model's graph, sizes and un-checkpointed peak,
    and its op timing held one op at a time, the layers' identical ops timed once."""
    import profiler
    from profiler.meta import meta_profile
    from solvers.regions import evaluate

    small = {"input_ids": batch(0, 0)["input_ids"][:, :32], "labels": batch(0, 0)["labels"][:, :32]}
    meta = meta_profile(meta_model(), small, loss)
    real = profiler.profile(real_model(), small, loss_fn=loss, granularity="op", fuse_loss=False, repeats=1)
    assert meta.fingerprint == real.fingerprint
    assert meta.graph.graph["fixed_bytes"] == real.graph.graph["fixed_bytes"]
    peaks = [evaluate(p.regroup("op").graph, ()).outcome.peak_bytes for p in (meta, real)]
    assert peaks[0] == peaks[1], peaks
    assert 0 < meta.times.held_peak_bytes < peaks[0] / 4, (meta.times.held_peak_bytes, peaks)
    # The same projection in every layer: one signature, one time.
    q_proj = {data["module"]: data["cost"] for _, data in meta.graph.nodes(data=True)
              if data.get("kind") == "forward" and data.get("module", "").endswith("self_attn.q_proj")}
    assert len(q_proj) == 4 and len(set(q_proj.values())) == 1, q_proj


def test_meta_model_is_refused_without_fsdp2():
    for distributed in (None, "ddp"):
        with pytest.raises(planner.SolverError, match=r"meta device.*FSDP2\(world_size=N\)"):
            planner.plan(meta_model(), batch(0, 0), budget="50%", loss_fn=loss, distributed=distributed)
    with pytest.raises(ValueError, match="init_process_group"):  # "fsdp2" without a process group: its size
        planner.plan(meta_model(), batch(0, 0), budget="50%", loss_fn=loss, distributed="fsdp2")


def test_sharded_groups_by_hand():
    """Two units of Linear(4, 5) and a root Linear(5, 3), 2 ranks: 5 rows pad to 6 (3 a rank), 3 to 4."""
    from planner.fsdp2_timeline import ROOT, ShardedGroup, sharded_groups
    from planner.native import FSDP2

    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(4, 5), torch.nn.Linear(5, 3))
    model[2].bias.requires_grad_(False)
    groups = sharded_groups(model, FSDP2(world_size=2, units=("0", "1")))
    unit = ShardedGroup(gathered=(6 * 4 + 6) * 4, shard=(3 * 4 + 3) * 4, whole=(5 * 4 + 5) * 4, grads=(5 * 4 + 5) * 4)
    assert groups["0"] == groups["1"] == unit
    assert groups[ROOT] == ShardedGroup(gathered=(4 * 5 + 4) * 4, shard=(2 * 5 + 2) * 4, whole=(3 * 5 + 3) * 4,
                                        grads=3 * 5 * 4)
