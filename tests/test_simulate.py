"""simulate() follows the rules of docs/schedule.md exactly, and the schedule format round-trips through JSON."""

import json

import networkx as nx
import pytest

from graphs import chain, random_dag, training_graph
from solvers import Schedule, schedule_from_computes, simulate, solve
from solvers.errors import InvalidGraph
from solvers.graph import validate


def diamond():
    g = nx.DiGraph()
    for node, (cost, mem) in {"a": (1.0, 4), "b": (2.0, 3), "c": (3.0, 2), "d": (4.0, 1)}.items():
        g.add_node(node, cost=cost, mem=mem)
    g.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    g.nodes["d"]["output"] = True
    return g


def test_memory_during_a_compute_counts_everything_held_plus_the_new_result():
    g = diamond()
    steps = [("compute", "a"), ("compute", "b"), ("compute", "c"), ("free", "a"), ("compute", "d"),
             ("free", "b"), ("free", "c")]
    result = simulate(g, steps)
    assert result.valid, result.error
    assert result.peak_bytes == 4 + 3 + 2  # while c runs: a, b held
    assert result.compute_cost == 10.0
    assert result.overhead == 0.0


def test_recomputation_pays_cost_again_and_overhead_counts_it():
    g = diamond()
    steps = [("compute", "a"), ("compute", "b"), ("free", "a"), ("compute", "a"), ("compute", "c"),
             ("free", "a"), ("compute", "d")]
    result = simulate(g, steps)
    assert result.valid, result.error
    assert result.compute_cost == 11.0
    assert result.overhead == pytest.approx(11.0 / 10.0 - 1)
    assert result.peak_bytes == 3 + 4 + 2  # c runs with b and the recomputed a held


@pytest.mark.parametrize(
    "steps, error",
    [
        ([("compute", "b")], "needs 'a'"),
        ([("compute", "a"), ("compute", "a")], "already held"),
        ([("free", "a")], "not held"),
        ([("compute", "a"), ("compute", "b"), ("compute", "c"), ("compute", "d"), ("free", "d")], "output node 'd'"),
        ([("compute", "a"), ("compute", "b")], "never computed"),
        ([("compute", "zz")], "not a node"),
        ([("run", "a")], "unknown step kind"),
    ],
)
def test_invalid_schedules_say_why(steps, error):
    result = simulate(diamond(), steps)
    assert not result.valid
    assert error in result.error


def test_pinned_nodes_cannot_be_freed_and_workspace_counts_while_computing():
    g = diamond()
    g.nodes["b"]["pinned"] = True
    g.nodes["c"]["workspace"] = 10
    ok = [("compute", "a"), ("compute", "b"), ("compute", "c"), ("compute", "d")]
    result = simulate(g, ok)
    assert result.valid and result.peak_bytes == 4 + 3 + 2 + 10
    assert not simulate(g, ok[:2] + [("free", "b")] + ok[2:]).valid


def test_schedule_json_round_trip_maps_names_back_to_node_ids():
    g = random_dag(10, seed=3)
    schedule = solve(g, 10**9, "store-all")
    text = schedule.to_json()
    data = json.loads(text)
    assert data["steps"][0][0] == "compute" and isinstance(data["steps"][0][1], str)
    again = Schedule.from_json(text, g)
    assert again.steps == schedule.steps
    assert again.info.method == "store-all"
    assert simulate(g, again).peak_bytes == schedule.info.predicted_peak_bytes


def test_schedule_rejects_malformed_steps():
    with pytest.raises(ValueError):
        Schedule([("compute",)])
    with pytest.raises(ValueError):
        Schedule.from_dict({"steps": [["compute", 3]]})
    with pytest.raises(ValueError):
        Schedule.from_dict({"nosteps": []})


def _memory_at_computes(g, steps):
    result = simulate(g, steps, record_memory=True)
    assert result.valid, result.error
    return [m for (kind, _), m in zip(steps, result.memory) if kind == "compute"]


@pytest.mark.parametrize("seed", range(20))
def test_liveness_holds_no_more_than_any_other_placement_of_frees(seed):
    """For a fixed order of computations, no valid schedule holds less at any compute step than
    schedule_from_computes: compare with random valid placements of the frees."""
    import random

    rng = random.Random(seed)
    g = random_dag(8, seed=seed)
    order = list(nx.topological_sort(g))
    again = order[seed % 4]
    computes = order + [again] + [v for v in order if again in g.predecessors(v)]
    ours = schedule_from_computes(g, computes)
    best = _memory_at_computes(g, ours)
    free_positions = [i for i, (kind, _) in enumerate(ours) if kind == "free"]
    for _ in range(50):
        steps = list(ours)
        # Delay some frees by a random number of steps, keeping the schedule valid.
        for i in sorted(rng.sample(free_positions, k=min(3, len(free_positions))), reverse=True):
            step = steps.pop(i)
            j = min(len(steps), i + rng.randint(1, 4))
            candidate = steps[:j] + [step] + steps[j:]
            if simulate(g, candidate).valid:
                steps = candidate
            else:
                steps.insert(i, step)
        other = _memory_at_computes(g, steps)
        assert all(o >= b for o, b in zip(other, best))
    # And ours is strictly leaner than never freeing until the end.
    hoard = [s for s in ours if s[0] == "compute"]
    if len(set(computes)) == len(computes):
        assert sum(_memory_at_computes(g, hoard)) >= sum(best)


def test_validate_rejects_bad_graphs_with_a_reason():
    g = nx.DiGraph()
    g.add_node("a", cost=1.0, mem=1)
    g.add_node("b", cost=1.0, mem=1)
    g.add_edge("a", "b")
    g.add_edge("b", "a")
    with pytest.raises(InvalidGraph, match="acyclic"):
        validate(g)
    h = nx.DiGraph()
    h.add_node("a", cost=-1.0, mem=1)
    with pytest.raises(InvalidGraph, match="cost"):
        validate(h)
    h = nx.DiGraph()
    h.add_node("a", cost=1.0, mem=1.5)
    with pytest.raises(InvalidGraph, match="whole number"):
        validate(h)
    h = nx.DiGraph()
    h.add_node("a", cost=1.0)
    with pytest.raises(InvalidGraph, match="mem"):
        validate(h)
    with pytest.raises(InvalidGraph, match="DiGraph"):
        validate(nx.Graph())


def test_store_all_is_the_unplanned_step():
    g = training_graph(6, seed=2)
    schedule = solve(g, 10**9, "store-all")
    result = simulate(g, schedule)
    assert result.compute_cost == pytest.approx(sum(d["cost"] for _, d in g.nodes(data=True)))
    assert schedule.info.status == "optimal"
    from solvers import Infeasible

    with pytest.raises(Infeasible) as raised:
        solve(g, result.peak_bytes - 1, "store-all")
    assert raised.value.min_budget == result.peak_bytes


def test_solve_rejects_bad_arguments():
    g = chain(4)
    with pytest.raises(ValueError, match="unknown method"):
        solve(g, 100, "magic")
    with pytest.raises(ValueError, match="budget"):
        solve(g, -1, "store-all")
    with pytest.raises(ValueError, match="budget"):
        solve(g, "12GB", "store-all")
    with pytest.raises(ValueError, match="time_limit"):
        solve(g, 100, "store-all", time_limit=0)
