"""solvers/native: the exact native method against brute force, on small real models and hand-made graphs.

Brute force: every set of disjoint regions of a menu (modules, runs of a Sequential's children, each
plain or under a save policy), its peak and step from solvers/regions/region_model.py's RegionModel (equal to
the simulator: tests/test_regions.py); the cheapest within each budget. The exact method must find
that step, say ``optimal``, and its plan must fit by the simulator.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from solvers import Infeasible, simulate, solve
from solvers.native import build_menu, build_rows, solve_regions_exact
from solvers.native.method import RegionSchedule
from solvers.regions import SAVE_POLICIES, RegionModel, evaluate, plan_regions, region_costs
from test_regions import block_chain, dropout_blocks


def disjoint_plans(menu) -> list[tuple[int, ...]]:
    """Every set of pairwise disjoint choices of ``menu`` (choice indices, ascending)."""
    plans: list[tuple[int, ...]] = []

    def extend(plan: tuple[int, ...], start: int) -> None:
        plans.append(plan)
        for c in range(start, len(menu.choices)):
            if all(not menu.overlapping(c, d) for d in plan):
                extend(plan + (c,), c + 1)

    extend((), 0)
    return plans


def brute_force(graph, menu) -> list[tuple[int, float, tuple[str, ...]]]:
    """(peak bytes, step seconds, regions) of every plan of ``menu``."""
    model = RegionModel(graph)
    table = []
    for plan in disjoint_plans(menu):
        regions = tuple(menu.choices[c] for c in plan)
        peak, cost = model.peak_and_cost(regions)
        table.append((peak, cost, regions))
    return table


def budgets_between(table, count: int = 12) -> list[int]:
    """``count`` budgets from the least plan's peak to the un-checkpointed step's, each exactly some
    plan's peak (where a plan just fits: the hardest budgets), and one byte below the least (infeasible)."""
    peaks = sorted({peak for peak, _, _ in table})
    picks = [peaks[round(i * (len(peaks) - 1) / (count - 1))] for i in range(count)]
    return sorted(set(picks)) + [peaks[0] - 1]


CHAIN = "chain dynamic program"  # in the message of a plan the chain's dynamic program found


def check_against_brute_force(graph, candidates, sequentials, policies, count: int = 12,
                              chained: bool | None = None) -> tuple[int, int]:
    """The exact method's step equals brute force's at every budget of :func:`budgets_between`;
    returns how many budgets it solved, and at how many of them the heuristic search's plan is slower.
    ``chained``: every plan found by the chain's dynamic program (True) or by the MILP (False)."""
    menu = build_menu(graph, candidates, sequentials, policies)
    table = brute_force(graph, menu)
    solved = beaten = 0
    for budget in budgets_between(table, count):
        best = min((cost for peak, cost, _ in table if peak <= budget), default=None)
        if best is None:
            with pytest.raises(Infeasible) as refused:
                solve_regions_exact(graph, budget, candidates, sequentials, time_limit=60, policies=policies)
            # The contract: min_budget is over the budget, and the method meets it.
            least = refused.value.min_budget
            assert least is not None and least > budget
            if chained:  # the chain's program knows the least peak exactly
                assert least == min(peak for peak, _, _ in table), (least, budget)
            at_least = solve_regions_exact(graph, least, candidates, sequentials, time_limit=60, policies=policies)
            assert at_least.outcome.peak_bytes <= least
            continue
        plan = solve_regions_exact(graph, budget, candidates, sequentials, time_limit=60, policies=policies)
        outcome = simulate(plan.graph, plan.schedule)
        assert outcome.valid and outcome.peak_bytes <= budget, (budget, plan.regions)
        assert plan.schedule.info.status == "optimal", plan.schedule.info
        assert outcome.compute_cost == pytest.approx(best, rel=1e-9, abs=1e-12), (budget, plan.regions)
        if chained is not None and "fits as it is" not in plan.schedule.info.message:
            assert (CHAIN in plan.schedule.info.message) == chained, plan.schedule.info.message
        solved += 1
        heuristic = plan_regions(graph, budget, candidates, sequentials, policies=policies)
        beaten += heuristic.outcome.compute_cost > best * (1 + 1e-9)
    return solved, beaten


# -- small real models, profiled once per module ---------------------------------------------------------------

def op_graph(model, inputs, loss_fn):
    """(op graph, module candidates, Sequential containers) as planner/native_solve.py gives them to the search."""
    import profiler
    from planner.native_solve import called_in_forward, sequential_containers
    from solvers.regions import candidate_regions

    profile = profiler.profile(model, inputs, loss_fn=loss_fn, granularity="op", fuse_loss=False)
    graph = profile.regroup("op").graph
    return graph, [c for c in candidate_regions(graph) if called_in_forward(model, c)], sequential_containers(model)


@pytest.fixture(scope="module")
def gpt2_op_graph():
    import models

    return op_graph(models.gpt2(layers=3), models.gpt2_inputs(batch=2, tokens=64), models.hf_loss)


@pytest.fixture(scope="module")
def residual_mlp_op_graph():
    import torch

    import models

    return op_graph(models.residual_mlp(depth=6), torch.randn(64, 32, generator=torch.Generator().manual_seed(1)),
                    lambda output: output.pow(2).mean())


@pytest.fixture(scope="module")
def unet_op_graph():
    import torch

    from benchmarks.models import UNet

    torch.manual_seed(0)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return op_graph(UNet(channels=(4, 8, 16)), (images,), lambda output: output.float().pow(2).mean())


# -- the rows: exact at every plan ----------------------------------------------------------------------------

def random_plans(menu, count: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        order = list(range(len(menu.choices)))
        rng.shuffle(order)
        plan: list[int] = []
        for c in order[: rng.randint(1, len(order))]:
            if all(not menu.overlapping(c, d) for d in plan):
                plan.append(c)
        yield sorted(plan)


# What torch.utils.checkpoint itself costs, as planner/checkpoint_clock.py annotates a graph with it
# (solvers/regions/costs.py checkpoint_overhead): a choice's cost then holds it, per region and per op.
CLOCK_RATES = {"region_seconds": 0.25, "recomputed_op_seconds": 0.125,
               "policy_region_seconds": {policy: 0.5 for policy in SAVE_POLICIES},
               "policy_op_seconds": {policy: 0.0625 for policy in SAVE_POLICIES}}


def with_clock(graph):
    graph = graph.copy()
    graph.graph["checkpoint_costs"] = CLOCK_RATES
    return graph


@pytest.mark.parametrize("graph", [block_chain(blocks=5, ops=4, seed=3), dropout_blocks(),
                                   with_clock(dropout_blocks())], ids=["chain", "dropout", "dropout-clock"])
def test_the_rows_are_the_simulated_peak_and_step_of_every_plan(graph):
    menu = build_menu(graph, policies=tuple(SAVE_POLICIES))
    rows = build_rows(graph, menu)
    model = RegionModel(graph)
    for plan in random_plans(menu, 150):
        regions = [menu.choices[c] for c in plan]
        peak, cost = model.peak_and_cost(regions)
        assert rows.memory(set(plan)).max() == peak, regions
        assert rows.cost_of(set(plan)) == pytest.approx(cost, rel=1e-12), regions
        # A choice's cost is region_costs' seconds (what a change of the cost model must keep additive).
        assert sum(rows.cost[c] for c in plan) == pytest.approx(sum(region_costs(graph, r).seconds for r in regions))


def test_the_rows_of_a_real_model_are_exact(gpt2_op_graph):
    graph, candidates, _ = gpt2_op_graph
    menu = build_menu(graph, candidates, {}, tuple(SAVE_POLICIES))
    rows = build_rows(graph, menu)
    model = RegionModel(graph)
    shared = 0
    for plan in random_plans(menu, 80, seed=1):
        regions = [menu.choices[c] for c in plan]
        peak, cost = model.peak_and_cost(regions)
        assert rows.memory(set(plan)).max() == peak, regions
        assert rows.cost_of(set(plan)) == pytest.approx(cost, rel=1e-12)
    shared = len(rows.shared)
    assert shared > 0  # block outputs read again by the next block's recomputation: the z rows are exercised


def row_value(rows, plan, constant, per_choice, terms, on_owner: float = 0.0) -> float:
    """A memory row's left side at the plan ``plan`` (its shared results' ``z`` at their least values)."""
    x = np.zeros(len(rows.menu.choices))
    x[list(plan)] = 1
    total = constant + float(per_choice @ x) + on_owner
    for index, j, amount in terms:
        total += amount * (rows.shared[index].breaks[j] <= rows.shared[index].alive_until(set(plan)))
    return total


def test_each_row_is_the_memory_at_its_event(gpt2_op_graph):
    """The rows the MILP gets (a trace op's; a twin's, written on its trigger's row plus what the
    twin adds, with its choice taken) equal the memory at their event, plan by plan."""
    graph, candidates, _ = gpt2_op_graph
    model = RegionModel(graph)
    menu = build_menu(graph, candidates, {}, tuple(SAVE_POLICIES), model)
    rows = build_rows(graph, menu, model)
    twins = 0
    for plan in random_plans(menu, 30, seed=2):
        memory = rows.memory(set(plan))
        for event in np.flatnonzero(rows.owner < 0)[::7]:
            assert row_value(rows, plan, *rows.row(int(event))) == memory[event]
        for d in plan:
            for event in np.flatnonzero(rows.owner == d)[::3]:
                written = rows.twin_row(int(event))
                if written is not None:
                    assert row_value(rows, plan, *written) == memory[event], (menu.choices[d], event)
                    twins += 1
    assert twins > 100


# -- against brute force ----------------------------------------------------------------------------------------

@pytest.fixture
def milp_only(monkeypatch):
    """The exact method with the chain's dynamic program off: the MILP searches every menu."""
    from solvers.native import method
    from solvers.native.chain import NoChain

    monkeypatch.setattr(method, "chain_structure", lambda rows, model: NoChain("off in this test"))


def test_equals_brute_force_on_hand_made_blocks():
    graph = dropout_blocks(blocks=4)
    blocks = [f"layers.{b}" for b in range(4)]
    solved, beaten = check_against_brute_force(graph, blocks, {}, tuple(SAVE_POLICIES), chained=True)
    assert solved >= 10 and beaten >= 1, (solved, beaten)


def test_the_milp_equals_brute_force_on_hand_made_blocks(milp_only):
    graph = dropout_blocks(blocks=4)
    blocks = [f"layers.{b}" for b in range(4)]
    solved, _ = check_against_brute_force(graph, blocks, {}, tuple(SAVE_POLICIES), chained=False)
    assert solved >= 10, solved


def test_a_chain_plan_the_rows_refuse_is_said_aloud_and_the_milp_plans(monkeypatch):
    """solvers/native/method.py: where the chain's dynamic program returns a plan over the budget by
    the rows (a bug, made here by a program that checkpoints nothing), a RuntimeWarning says so and
    the MILP's optimum is the plan."""
    from solvers.native import method

    graph = dropout_blocks(blocks=4)
    blocks = [f"layers.{b}" for b in range(4)]
    menu = build_menu(graph, blocks, {}, tuple(SAVE_POLICIES))
    table = brute_force(graph, menu)
    budget = budgets_between(table)[2]
    best = min(cost for peak, cost, _ in table if peak <= budget)
    monkeypatch.setattr(method, "solve_chain", lambda structure, budget_bytes: (set(), 0.0))
    with pytest.warns(RuntimeWarning, match="chain dynamic program's plan .* the MILP searches instead"):
        plan = solve_regions_exact(graph, budget, blocks, {}, time_limit=60, policies=tuple(SAVE_POLICIES))
    assert CHAIN not in plan.schedule.info.message and plan.schedule.info.status == "optimal"
    assert plan.outcome.compute_cost == pytest.approx(best, rel=1e-9)


def test_equals_brute_force_with_the_checkpoints_own_costs():
    """Priced with what each checkpoint and each op under a policy costs (the clock), the best plan
    can differ from the plain one: the exact method still equals brute force."""
    graph = with_clock(dropout_blocks(blocks=4))
    blocks = [f"layers.{b}" for b in range(4)]
    solved, _ = check_against_brute_force(graph, blocks, {}, tuple(SAVE_POLICIES), chained=True)
    assert solved >= 10, solved


GPT2_CANDIDATES = [f"transformer.h.{i}{part}" for i in range(3) for part in ("", ".attn", ".mlp")]


def test_equals_brute_force_on_gpt2(gpt2_op_graph):
    """A 3-layer GPT-2 from transformers (dropout on): each block whole, or its attention and MLP,
    plain or under two policies; 12 budgets from its least peak to no checkpointing. Its rows verify
    as a chain: every plan is the dynamic program's."""
    graph, _, _ = gpt2_op_graph
    solved, beaten = check_against_brute_force(graph, GPT2_CANDIDATES, {}, ("projections+draws",), chained=True)
    assert solved >= 10 and beaten >= 1, (solved, beaten)


def test_the_milp_equals_brute_force_on_gpt2(gpt2_op_graph, milp_only):
    graph, _, _ = gpt2_op_graph
    solved, _ = check_against_brute_force(graph, GPT2_CANDIDATES, {}, ("projections+draws",), chained=False)
    assert solved >= 10, solved


def test_equals_brute_force_on_the_residual_mlp(residual_mlp_op_graph):
    """tests/models.py's residual MLP (a Sequential of 6 blocks and a head): runs of its children as
    segments and the blocks, plain or under one policy. Overlapping runs are no tree of regions: the
    chain's check fails and the MILP finds every plan."""
    graph, candidates, sequentials = residual_mlp_op_graph
    blocks = [c for c in candidates if c.isdigit()]
    solved, beaten = check_against_brute_force(graph, blocks, sequentials, ("matmuls",), chained=False)
    assert solved >= 10 and beaten >= 1, (solved, beaten)


def test_equals_brute_force_on_the_residual_mlp_blocks(residual_mlp_op_graph):
    """The same blocks without the runs: a chain, the dynamic program's plans."""
    graph, candidates, _ = residual_mlp_op_graph
    blocks = [c for c in candidates if c.isdigit()]
    solved, _ = check_against_brute_force(graph, blocks, {}, ("matmuls",), chained=True)
    assert solved >= 10, solved


def test_equals_brute_force_on_the_unet(unet_op_graph):
    """A small U-Net of the benchmark's shape (benchmarks/models.py): its blocks, plain or under one
    policy. A skip connection's tensor is held by blocks far apart (not additive over the chain's
    components): the chain's check fails and the MILP finds every plan."""
    graph, candidates, sequentials = unet_op_graph
    top = [c for c in candidates if c.count(".") == 1]
    solved, beaten = check_against_brute_force(graph, top, {}, ("matmuls",), chained=False)
    assert solved >= 10 and beaten >= 1, (solved, beaten)


# -- the method in solvers.solve ------------------------------------------------------------------------------

def test_regions_is_a_method_of_solve_checked_on_its_own_graph(gpt2_op_graph):
    graph, _, _ = gpt2_op_graph
    empty = evaluate(graph, ())
    budget = int(0.6 * empty.outcome.peak_bytes)
    schedule = solve(graph, budget, method="regions", time_limit=60)
    assert isinstance(schedule, RegionSchedule) and schedule.regions
    assert schedule.info.method == "regions" and schedule.info.status == "optimal"
    assert schedule.info.predicted_peak_bytes <= budget
    outcome = simulate(schedule.executed_graph, schedule)
    assert outcome.valid and outcome.peak_bytes == schedule.info.predicted_peak_bytes
    assert np.isclose(outcome.compute_cost, schedule.info.compute_cost)


def test_at_the_time_limit_the_heuristic_plan_comes_with_its_gap(gpt2_op_graph, monkeypatch, milp_only):
    """A MILP that ends without proving anything: the heuristic's plan, ``feasible``, with the gap to
    the bound the MILP reached (0: none reached, the bound is the un-checkpointed step)."""
    from solvers.native import milp

    graph, candidates, _ = gpt2_op_graph
    budget = int(0.6 * evaluate(graph, ()).outcome.peak_bytes)
    monkeypatch.setattr(milp.RegionMilp, "solve", lambda self, seconds: milp.Outcome(None, proven=False))
    plan = solve_regions_exact(graph, budget, candidates, {}, time_limit=2)  # runs to its limit: nothing is ever proven
    info = plan.schedule.info
    assert info.status == "feasible" and info.gap is not None and info.gap > 0
    assert plan.outcome.peak_bytes <= budget


# -- through the planner ----------------------------------------------------------------------------------------

@pytest.mark.slow  # the brute-force tests cover the method, tests/test_end_to_end.py the native plans' training
def test_the_planner_plans_natively_with_the_exact_method_and_trains_as_eager():
    """``planner.plan`` (solver "auto", the native executor): the exact method's plan, ``optimal`` in
    its summary, measured within its budget; applied, three optimizer steps with dropout on give the
    eager model's losses and parameters."""
    import copy

    import torch

    import models
    import planner

    model = models.gpt2(layers=3)
    eager = copy.deepcopy(model)
    inputs = models.gpt2_inputs(batch=2, tokens=64)
    plan = planner.plan(model, inputs, "80%", loss_fn=models.hf_loss, time_limit=60)
    assert plan.executor == "native" and plan.regions
    assert plan.status == "optimal" and "optimal" in plan.summary().split("Solver:")[1].splitlines()[0]
    assert plan.measured_peak_bytes <= plan.budget_bytes
    planned = planner.apply(model, plan)
    for trained in (planned, eager):
        trained.train()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (planned, eager)]
    for step in range(3):
        losses = []
        for trained, optimizer in zip((planned, eager), optimizers):
            optimizer.zero_grad()
            loss, _, _ = models.training_step(trained, inputs, models.hf_loss, seed=100 + step)
            optimizer.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6), (step, losses)
    for (name, a), (_, b) in zip(planned.named_parameters(), eager.named_parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_a_step_that_fits_as_it_is_is_the_optimal_native_plan():
    """At "100%" the planner measures the eager step within the budget and plans no region: no
    native plan is faster (each region only adds its recomputation), so its status is ``optimal``,
    as the exact method says of a step predicted to fit (benchmarks/compare.py's native@100% rows
    read ``heuristic`` before: the planner's own shortcut took the status of an unsolved plan)."""
    import torch

    import models
    import planner

    model = models.residual_mlp(width=16, hidden=32, depth=3)
    inputs = (torch.randn(8, 16),)
    plan = planner.plan(model, inputs, "100%", loss_fn=lambda out: out.square().mean())
    assert plan.executor == "native" and not plan.regions
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.status == "optimal", plan.schedule.info
    solver_line = plan.summary().split("Solver:")[1].splitlines()[0]
    assert "optimal" in solver_line and solver_line.count("nothing to checkpoint") == 1, solver_line
    peak_line = plan.summary().split("Predicted peak:")[1].splitlines()[0]
    saving = 1 - plan.predicted_peak_bytes / plan.unplanned_peak_bytes
    assert ("less" in peak_line) == (saving > 0), peak_line  # never "(-0.4% less)"


def test_equals_brute_force_where_a_subtree_is_one_unit(gpt2_op_graph):
    """The first block's attention with its three children: their shared results are not additive
    over the children (the attention's output projection is read again by the dropout's and its own
    recomputation), so the attention becomes one unit of 29 plans, enumerated; the dynamic program
    over the chain still equals brute force (979 plans), at 20 budgets."""
    from solvers.native.chain import ChainStructure, chain_structure

    graph, _, _ = gpt2_op_graph
    attention = "transformer.h.0.attn"
    candidates = ["transformer.h.0", attention, *(f"{attention}.{c}" for c in ("c_attn", "c_proj", "resid_dropout")),
                  "transformer.h.0.mlp", "transformer.h.1", "transformer.h.1.attn", "transformer.h.1.mlp"]
    policies = ("projections+draws",)
    model = RegionModel(graph)
    rows = build_rows(graph, build_menu(graph, candidates, {}, policies, model), model)
    structure = chain_structure(rows, model)
    assert isinstance(structure, ChainStructure), structure
    sizes = {rows.menu.bases[q.options[-1][0]]: len(q.options) for q in structure.components if not q.wide}
    assert sizes[attention] == 29, sizes
    solved, beaten = check_against_brute_force(graph, candidates, {}, policies, count=20, chained=True)
    assert solved >= 15, solved


def test_a_shared_result_not_additive_over_the_units_is_found(gpt2_op_graph):
    """The check the dynamic program's exactness rests on, alone: with every leaf its own unit, the
    attention's output projection's result is held while either its dropout's or its own
    recomputation reads it (a maximum, not a sum over the two units): the first attempt names them."""
    from solvers.native import chain

    graph, _, _ = gpt2_op_graph
    attention = "transformer.h.0.attn"
    candidates = [attention, f"{attention}.c_proj", f"{attention}.resid_dropout"]
    model = RegionModel(graph)
    rows = build_rows(graph, build_menu(graph, candidates, {}, ("projections+draws",), model), model)
    tree = chain.build_tree(rows.menu)
    facts = chain._Facts.of(rows, model, tree)
    components = chain._layout(tree, set())
    owner_of = {c: i for i, q in enumerate(components) for option in q.options for c in option}
    with pytest.raises(chain._Failed, match="not additive") as failed:
        chain._Additivity(facts, owner_of, components, lambda nodes: True).check()
    named = {tree.bases[n] for group in failed.value.groups for n in group}
    assert named == {f"{attention}.c_proj", f"{attention}.resid_dropout"}, named
    assert isinstance(chain.chain_structure(rows, model), chain.ChainStructure)  # the attention made one unit


@pytest.fixture(scope="module")
def llama_op_graph():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attention_dropout=0.1, use_cache=False, pad_token_id=0, bos_token_id=0,
                                      eos_token_id=0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    import models

    return op_graph(model, {"input_ids": ids, "labels": ids}, models.hf_loss)


def test_equals_brute_force_on_llama(llama_op_graph):
    """A 2-layer Llama from transformers: the rotary tables, made once and read by every layer's
    attention (and its recomputation), are held to the first layer's backward whatever the layers
    take: additive over the layers, a chain; the whole model, its
    layers, their attention and MLP, plain or under one policy, equal to brute force."""
    graph, _, _ = llama_op_graph
    candidates = ["model", *(f"model.layers.{i}{part}" for i in range(2) for part in ("", ".self_attn", ".mlp"))]
    solved, _ = check_against_brute_force(graph, candidates, {}, ("matmuls",), count=16, chained=True)
    assert solved >= 12, solved
