"""What a planned training step holds besides the results its schedule keeps (bytes).

The cost graph's ``fixed_bytes`` (parameters, buffers, inputs) and the runtime's saved generator
states: runtime/rng.py records the RNG state before each random node's first run and holds it all
step so that every recomputation draws what the first run drew. On CPU a state is the Mersenne
Twister's 5056 bytes; it was the whole of the gap between predicted and measured peaks in the
benchmarks (GPT-2: 19 dropout nodes, 96,064 bytes; residual MLP: 24, 121,344 bytes).
"""

from __future__ import annotations

from profiler.state import rng_state_bytes


def cuda_device_indices(device: str) -> list[int]:
    """``"cuda:1"`` -> [1], ``"cuda"`` -> [0], anything else -> []."""
    if not device.startswith("cuda"):
        return []
    _, _, index = device.partition(":")
    return [int(index) if index.isdigit() else 0]


def saved_rng_bytes(graph) -> int:
    """One generator state per random node of ``graph`` (its grouping decides how many nodes), and
    one more: while a random node is recomputed, runtime/rng.py's ``RngReplay.run`` holds the
    generator's current state to put it back after the replay (a masked TransformerEncoder's plan
    measured 4,672 bytes over its budget before it was counted). Counted throughout, though it is
    held only during a replay: at most one state's bytes over."""
    random_nodes = sum(1 for _, data in graph.nodes(data=True) if data.get("random"))
    if random_nodes == 0:
        return 0
    return (random_nodes + 1) * rng_state_bytes(cuda_device_indices(str(graph.graph.get("device", "cpu"))))


def held_besides_schedule(graph) -> int:
    """Bytes a planned step holds throughout, besides the schedule's results: ``fixed_bytes``,
    :func:`saved_rng_bytes` and the caller's loss value with its backward's seed
    (``loss_value_bytes``: from the loss on, counted throughout; 8 bytes was the whole of a
    measured peak's excess over its plan's prediction)."""
    return int(graph.graph["fixed_bytes"]) + saved_rng_bytes(graph) + int(graph.graph.get("loss_value_bytes", 0))
