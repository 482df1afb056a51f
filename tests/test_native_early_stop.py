"""Where the native executor's recomputation stops and what it holds there
(solvers/regions/early_stop.py, profiler/lifetimes.py, solvers/in_place.py).

PyTorch's non-reentrant checkpoint stops replaying a region when the op that saved its last tensor
packs it again; the replay then holds what the region's program holds (Python variables until the
forward returns), and an in-place op (dropout's ``div_``) allocates nothing. nanoGPT's last
attention, checkpointed alone, peaks inside that replay: predicted 981,516 B under its measured
peak at nanoGPT's size (docs/native.md), 196,108 B at the size below, before the fix."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

import profiler
from planner.native_measure import measure_native
from planner.native_solve import fixed_bytes, rng_bytes, rng_state_bytes
from solvers.in_place import count_in_place_once
from solvers.regions import evaluate, region_costs
from solvers.regions.early_stop import program_holds, stopping_op

LAYERS = 2


@pytest.fixture(scope="module")
def small_nanogpt():
    """tests/nanogpt.py's GPT (SDPA with dropout, a residual dropout ending the attention), 2 layers
    of width 128 over 4 x 64 tokens, and its op graph."""
    from nanogpt import GPT, GPTConfig, nanogpt_loss

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=LAYERS, n_head=4, n_embd=128, dropout=0.1)).train()
    ids = torch.randint(0, 65, (4, 65), generator=torch.Generator().manual_seed(1))
    inputs = (ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
    graph = profiler.profile(model, inputs, loss_fn=nanogpt_loss, fuse_loss=False).regroup("op").graph
    return model, inputs, nanogpt_loss, graph


@pytest.mark.parametrize("block", [LAYERS - 1, 0])
def test_nanogpts_attention_alone_is_predicted_to_the_generator_state(small_nanogpt, block):
    """The last block's attention (its replay at the backward's start, where the step peaks) and an
    earlier one: never under the measured peak, over by at most the generator state counted for the
    whole step (planner/native_solve.py, rng_bytes). Before the fix the last one was 196,108 B under."""
    model, inputs, loss_fn, graph = small_nanogpt
    region = f"transformer.h.{block}.attn"
    predicted = fixed_bytes(graph) + evaluate(graph, (region,)).outcome.peak_bytes + rng_bytes((region,), [])
    measured = measure_native(model, (region,), inputs, loss_fn).peak_bytes
    assert 0 <= predicted - measured <= rng_state_bytes([]), (region, predicted, measured)


def test_the_trace_records_what_the_attention_holds_and_which_op_saves(small_nanogpt):
    """q, k and v are views of the fused projection's output that the attention's forward holds to
    its end: that output is released after the output dropout's multiply, not after its last
    reader. The multiply saves the dropout's noise: its backward op belongs to the node it created.
    The noise is scaled in place (``div_``)."""
    *_, graph = small_nanogpt
    attn = f"transformer.h.{LAYERS - 1}.attn"
    nodes = graph.nodes
    qkv, multiply = nodes[f"fw:{attn}.c_attn#0"], nodes[f"fw:{attn}.resid_dropout#3"]
    assert qkv["released_after"] >= multiply["forward_op"]
    assert nodes[f"bw:{attn}.resid_dropout#0"]["autograd_seq"] == multiply["autograd_seq"]
    noise = nodes[f"fw:{attn}.resid_dropout#2"]
    assert "released_after" not in noise  # saved: it outlives the forward
    assert noise["in_place_of"] == nodes[f"fw:{attn}.resid_dropout#1"]["forward_op"]


def _op(graph, name, mem, kind="forward", ordinal=None, seq=None, released=None, module="r", **extra):
    graph.add_node(name, mem=mem, workspace=0, cost=1.0, kind=kind, module=module, **extra)
    for key, value in (("forward_op", ordinal), ("autograd_seq", seq), ("released_after", released)):
        if value is not None:
            graph.nodes[name][key] = value


def _saving_late(b_released: int = 5) -> nx.DiGraph:
    """Region r: a; b, which nothing reads but the program holds until it is released (after op
    ``b_released``; a Python variable holds it to the region's end, op 4); c; then d = a * c, which
    saves a. The backward op g belongs to d's autograd node (seq 2) and reads a."""
    graph = nx.DiGraph()
    _op(graph, "x", 10, ordinal=0, released=1, module="outside")
    _op(graph, "a", 100, ordinal=1, seq=1)
    _op(graph, "b", 1000, ordinal=2, released=b_released)
    _op(graph, "c", 10_000, ordinal=3, released=4)
    _op(graph, "d", 1, ordinal=4, seq=2, released=5)
    _op(graph, "y", 1, ordinal=5, released=6, module="outside")
    _op(graph, "g", 5, "backward", seq=2, autograd_node=1, output=True)
    graph.add_edges_from([("x", "a"), ("a", "b"), ("a", "c"), ("a", "d"), ("c", "d"), ("d", "y"), ("y", "g"),
                          ("a", "g")])
    return graph


def test_the_replay_runs_to_the_op_that_saves_not_to_the_value_it_saves():
    """d saves a (an input: packed before d runs), so PyTorch replays a, b and c and stops at d,
    whose output is not made: the rule of earlier versions replayed a alone (the last value a
    backward op reads)."""
    graph = _saving_late()
    assert stopping_op(graph, ("a", "b", "c", "d"), ("g",)) == 3
    assert region_costs(graph, "r").recomputed == ("a", "b", "c")
    untagged = graph.copy()
    for v in untagged:
        untagged.nodes[v].pop("forward_op", None)
    assert region_costs(untagged, "r").recomputed == ("a",)


def test_the_replay_holds_what_the_program_holds_where_it_stops():
    """At the stop (c's replay the last op run) the program still holds b: x (the input the
    checkpoint holds), y (g reads it), a, b and c are alive. Released at once, b is freed as it is
    made, and the peak is 1,000 B lower."""
    held = _saving_late(b_released=5)
    assert program_holds(held, ("a", "b", "c")) == [("a", "c"), ("b", "c")]  # a outlives the forward: saved
    assert evaluate(held, ("r",)).outcome.peak_bytes == 10 + 1 + 100 + 1000 + 10_000
    dropped = _saving_late(b_released=2)
    assert program_holds(dropped, ("a", "b", "c")) == [("a", "c")]
    assert evaluate(dropped, ("r",)).outcome.peak_bytes == 10 + 1 + 100 + 10_000


def _in_place_chain(read_after: bool) -> nx.DiGraph:
    """e = empty_like (64 B), n = e.bernoulli_(), m = n.div_(): one buffer in eager; ``later`` reads
    m, and n too when ``read_after``."""
    graph = nx.DiGraph()
    _op(graph, "e", 64, ordinal=0)
    _op(graph, "n", 64, ordinal=1, in_place_of=0)
    _op(graph, "m", 64, ordinal=2, in_place_of=1)
    _op(graph, "later", 1, ordinal=3, output=True)
    graph.add_edges_from([("e", "n"), ("n", "m"), ("m", "later")] + ([("n", "later")] if read_after else []))
    return graph


def test_an_in_place_op_allocates_nothing():
    """Each overwritten version's bytes move into its op's workspace: the chain peaks at one buffer
    (and ``later``'s byte), where counted per op it was two. A version read after the op that
    overwrote it (n, below) stays: two buffers after all."""
    graph = _in_place_chain(read_after=False)
    counted = count_in_place_once(graph)
    assert [(counted.nodes[v]["mem"], counted.nodes[v]["workspace"]) for v in "enm"] == [(0, 64), (0, 64), (64, 0)]
    assert graph.nodes["e"]["mem"] == 64  # the caller's graph is not changed
    assert evaluate(graph, ()).outcome.peak_bytes == 64 + 1  # evaluate counts them so
    untagged = graph.copy()
    for v in "nm":
        del untagged.nodes[v]["in_place_of"]
    assert evaluate(untagged, ()).outcome.peak_bytes == 64 + 64
    kept = count_in_place_once(_in_place_chain(read_after=True))
    assert [kept.nodes[v]["mem"] for v in "enm"] == [0, 64, 64]
