"""Measure what each op of the joint graph costs on the model's device.

The graph is run a few times as a whole, op by op, with real tensors (a real training step each time,
so caches are as warm as in training), and each op's time is the least over the runs: another
process's load only ever adds to an op's time, so the least is the sample it disturbed least (with
medians, two profiles of a 6-layer GPT-2 on a loaded 2-core machine chose different regions at 2 of
3 budgets; with the least, the same at all 3). On a GPU
every op is bracketed by CUDA events; on CPU by the wall clock. The RNG is reset before each run, so
every run draws the same numbers, and restored afterwards. Buffer mutations (``copy_`` into a
buffer) are not executed: measuring must not change the model.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .allocations import cpu_allocations, cpu_memory_profile, replay
from .state import cuda_devices, get_rng_state, set_rng_state

# Memory the CUDA caching allocator hands out comes in blocks of this many bytes.
CUDA_BLOCK_BYTES = 512


@dataclass(frozen=True)
class OpTimes:
    seconds: dict[str, float]  # fx node name -> least seconds of one execution over the runs
    runs: int
    step_seconds: float  # median wall time of a whole run of the graph
    # fx node name -> bytes the op's kernels allocate beyond its outputs while it runs (measured in
    # the warm-up run; ops without any are left out). CPU dropout's float noise tensor is one.
    scratch_bytes: dict[str, int] = field(default_factory=dict)


def _is_buffer_mutation(node: fx.Node) -> bool:
    return node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder"


def _last_uses(graph: fx.Graph) -> dict[str, list[str]]:
    """For each node, the values whose last reader it is (freed right after it runs)."""
    last: dict[str, str] = {}
    for node in graph.nodes:
        for arg in node.all_input_nodes:
            last[arg.name] = node.name
    freed: dict[str, list[str]] = {}
    for value, reader in last.items():
        freed.setdefault(reader, []).append(value)
    return freed


# Names the record_function around each op of the warm-up run, to find its allocations.
SCRATCH_LABEL = "plan-checkpoints-op:"


def _scratch_from_events(profile) -> dict[str, int]:
    """Per ``record_function`` label, the peak of the CPU allocations inside it above what is still
    allocated when it ends (bytes): what its kernels used and released."""
    from torch._C._profiler import _EventType

    scratch: dict[str, int] = {}
    pending = list(profile.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        if event.typed[0] == _EventType.TorchOp and event.name.startswith(SCRATCH_LABEL):
            peak, end = replay(cpu_allocations(event.children))
            if peak > end:
                scratch[event.name[len(SCRATCH_LABEL):]] = peak - max(end, 0)
        else:
            pending.extend(event.children)
    return scratch


def time_ops(graph_module: fx.GraphModule, inputs: list, repeats: int = 5) -> OpTimes:
    """Run the graph ``repeats`` times on ``inputs`` (placeholders in order) and time every op.

    The warm-up run also measures each op's scratch memory (:attr:`OpTimes.scratch_bytes`): on CPU
    from the allocator's events (``torch.profiler`` with ``profile_memory``), on CUDA from
    ``max_memory_allocated`` around the op."""
    graph = graph_module.graph
    devices = cuda_devices(inputs)
    use_events = bool(devices)
    frees = _last_uses(graph)
    samples: dict[str, list[float]] = {}
    scratch: dict[str, int] = {}
    step_times = []
    saved_rng = get_rng_state(devices)
    try:
        for run in range(repeats + 1):  # the first run warms up (lazy initialisation, allocator)
            warm_up = run == 0
            # The memory profiler is entered and left by a context manager: an op that raises must
            # not leave torch.profiler enabled (the process then crashed at exit, rc 139, even when
            # the caller caught the error).
            recording = cpu_memory_profile() if warm_up and not use_events else contextlib.nullcontext()
            with recording as memory_profile:
                step_times.append(_run_graph(graph_module, inputs, frees, warm_up, use_events, saved_rng,
                                             samples, scratch))
            if memory_profile is not None:
                scratch.update(_scratch_from_events(memory_profile))
    finally:
        set_rng_state(saved_rng)
    # The warm-up run is not timed (its ops ran under the memory profiler or with allocator stats).
    seconds = {name: min(times) for name, times in samples.items()}
    return OpTimes(seconds, repeats, statistics.median(step_times[1:] if len(step_times) > 1 else step_times),
                   scratch)


def constant_value(graph_module: fx.GraphModule, target: str):
    """The tensor a ``get_attr`` node names (a lifted constant such as ``_tensor_constant0``:
    ``ids[:, 0] = start_id`` in Hugging Face's T5 and BART), by its dotted attribute path."""
    value = graph_module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _run_graph(graph_module: fx.GraphModule, inputs: list, frees: dict[str, list[str]], warm_up: bool,
               use_events: bool, saved_rng, samples: dict[str, list[float]], scratch: dict[str, int]) -> float:
    """One run of the whole graph, op by op, from ``saved_rng``; each op's time (seconds) appended to
    ``samples`` (not in the warm-up run, whose ops run labelled for the memory profiler, or with
    the CUDA allocator's statistics into ``scratch``). Returns the run's wall time in seconds."""
    set_rng_state(saved_rng)
    env: dict[str, object] = {}
    events = []
    placeholders = iter(inputs)
    if use_events:
        torch.cuda.synchronize()
    run_start = time.perf_counter()
    with torch.no_grad():
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = next(placeholders)
            elif node.op == "get_attr":
                env[node.name] = constant_value(graph_module, node.target)
            elif node.op == "call_function" and not _is_buffer_mutation(node):
                args = fx.node.map_arg(node.args, lambda n: env[n.name])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n.name])
                if warm_up and use_events:
                    env[node.name] = _cuda_with_scratch(node, args, kwargs, scratch)
                elif warm_up:
                    with torch.profiler.record_function(SCRATCH_LABEL + node.name):
                        env[node.name] = node.target(*args, **kwargs)
                elif use_events:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    env[node.name] = node.target(*args, **kwargs)
                    end.record()
                    events.append((node.name, start, end))
                else:
                    start_time = time.perf_counter()
                    env[node.name] = node.target(*args, **kwargs)
                    samples.setdefault(node.name, []).append(time.perf_counter() - start_time)
            for value in frees.get(node.name, ()):
                env.pop(value, None)
    if use_events:
        torch.cuda.synchronize()
        for name, start, end in events:
            samples.setdefault(name, []).append(start.elapsed_time(end) / 1000.0)
    elapsed = time.perf_counter() - run_start
    env.clear()  # release the run's tensors before the next one
    return elapsed


def _cuda_with_scratch(node: fx.Node, args, kwargs, scratch: dict[str, int]):
    """Run one op on CUDA and record the bytes it allocated above what it still holds after."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = node.target(*args, **kwargs)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    if extra > 0:
        scratch[node.name] = int(extra)
    return result


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes the allocator hands out for a tensor's storage on its device."""
    nbytes = tensor.untyped_storage().nbytes()
    if tensor.device.type == "cuda":
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes
