"""The op-level cost graph of a training step, recorded from eager runs: for models the tracer cannot follow.

``profiler.profile`` traces the step with make_fx; a forward with Python control flow on tensor
values (``if x.sum() > 0``) or data-dependent shapes (an MoE routing each token to its top-k
experts) cannot be traced. Such a model still runs eagerly, and one eager training step shows
everything the native planner's region search (solvers/regions/) reads from a trace, as PyTorch's
SAC estimator measures it (``torch.distributed._tools.sac_estimator``: module hooks, autograd node
hooks and a ``TorchDispatchMode`` under one step):

- **Every aten op**, in the order it ran, seen by a ``TorchDispatchMode``: its name, the storages
  it reads (an edge from the op that made each one), the storages it makes (its ``mem``, bytes; a
  view or an in-place op makes none), whether it draws random numbers, and its time (the least of
  the timed runs, seconds).
- **Which module** issued it: forward ops by module hooks (the innermost module running); backward
  ops by pre-hooks on every autograd node of the step (the module whose forward created the node,
  found by its sequence number, as profiler/capture.py tags the traced graph), with the node's number
  (``autograd_node``: eager autograd holds what a node reads until its last op).
- **How long each storage lives**: every storage the step makes is watched through a weak reference;
  one freed before op ``j`` was held through op ``j - 1``, which the graph says with a liveness edge
  (``hold=True``) from the op that made it. That is eager's own lifetime, whoever held the storage:
  autograd's saved tensors until their backward node, a Python variable, the caller's output; a
  storage alive when the step ends (a gradient, the model's output) is the graph's ``output``.
- **Time**: each op's least over the timed runs, plus its share of what the step spends besides
  the kernels (a step without the recorder, timed, less the ops' sum: Python, dispatcher, autograd).
- **Scratch memory**: what an op's kernels allocate and release inside it (``workspace``), from the
  allocator's events on CPU (``torch.profiler`` with ``profile_memory``, profiler/measure.py's
  labels) or ``max_memory_allocated`` on CUDA.

The loss and its backward (the ops between the model's output and the first backward op of the
model) are one node, ``"loss"``, as in a traced graph; the loss value, held by the caller to the end,
is the graph's ``loss_value_bytes``. ``fixed_bytes`` is what profiler.memory.measure_step counts as
resident (parameters, buffers, inputs), so the graph's store-all peak is the measured step's.

The result is a :class:`profiler.Profile` at ``"op"`` granularity whose ``joint`` is an
:class:`EagerStep` (what plans record about the step: the loss's outputs, the inputs' layout, the
autocast state); it has no trace, so it cannot be regrouped or run by the traced executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .allocations import cpu_memory_profile
from .eager_bound import StepBound, cpu_free_under_a_limit
from .capture import autocast_state
from .costgraph import LOSS, fingerprint
from .inputs import InputLayout, input_layout, normalise_inputs
from .loss import LossInfo, default_loss, run_planning_loss
from .measure import SCRATCH_LABEL, _scratch_from_events
from .storage import storage_bytes
from .memory import resident_bytes
from .state import cuda_devices, get_rng_state, preserved_state, set_rng_state

FORWARD, LOSS_PHASE, BACKWARD = "forward", "loss", "backward"
# Granularity label of an eager graph: single ops, as the region search reads them.
GRANULARITY = "op"
# Timed runs go on (up to MAX_TIMED_RUNS) until one more moves the sum of the ops' least times by at
# most SETTLED: on a loaded machine a stall can hit an op in two runs (a 2 ms step of a small model
# summed 63 ms over two runs, 0.9 ms over more).
SETTLED = 0.01
MAX_TIMED_RUNS = 5


@dataclass(frozen=True)
class EagerStep:
    """What a plan records about the step (planner/planfile.py profile_fields), for an eager profile:
    the loss's figures and differentiated outputs, the inputs' layout, the model output's structure
    and the autocast state. ``reason``: why the step was recorded eagerly (the tracer's error).
    ``grad_params``: (parameter name, "") for each parameter the recorded backward gave a gradient,
    as a traced step lists them (planner/optimizer.py counts an optimizer's state for those)."""

    loss: LossInfo
    layout: InputLayout
    output_spec: pytree.TreeSpec
    autocast: str = ""
    reason: str = ""
    grad_params: tuple[tuple[str, str], ...] = ()


@dataclass
class _Op:
    """One aten op of the recorded step."""

    name: str
    phase: str
    module: str
    autograd_node: int | None
    random: bool
    reads: list[int]  # serial numbers of the storages it read (made in the step), in order, without repeats
    made: list[tuple[int, int]]  # (serial number, bytes) of the storages it made
    seconds: float = 0.0
    scratch: int = 0


@dataclass
class _Recording:
    ops: list[_Op] = field(default_factory=list)
    last_alive: dict[int, int] = field(default_factory=dict)  # storage serial -> last op index it was alive at
    survivors: set[int] = field(default_factory=set)  # storages alive when the step ended
    step_seconds: float = 0.0  # wall time of the recorded step; after record(), of a step without the recorder
    with_gradient: tuple[str, ...] = ()  # the parameters the backward gave a gradient, by name


def _storage_ref(tensor) -> StorageWeakRef | None:
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or tensor.is_sparse:
        return None
    try:
        storage = tensor.untyped_storage()
    except (NotImplementedError, RuntimeError):  # a tensor without storage (a subclass)
        return None
    return StorageWeakRef(storage) if storage.nbytes() else None


class _Tagger:
    """The module and phase each op belongs to: module hooks in the forward; in the backward,
    pre-hooks on the step's autograd nodes (the module owning the node's sequence number)."""

    def __init__(self, model: torch.nn.Module):
        self.names = {module: name for name, module in model.named_modules(remove_duplicate=False)}
        self.stack: list[str] = []
        self.starts: list[int] = []
        self.owner: dict[int, str] = {}  # autograd sequence number -> module
        self.phase = FORWARD
        self.module = ""
        self.autograd_node: int | None = None
        self.forward_end = 0
        self.handles: list = []

    def _pre(self, module, args):
        if module in self.names and self.phase == FORWARD:
            self.stack.append(self.names[module])
            self.starts.append(torch.autograd._get_sequence_nr())
            self.module = self.stack[-1]

    def _post(self, module, args, output):
        if module in self.names and self.phase == FORWARD and self.stack:
            first, last = self.starts.pop(), torch.autograd._get_sequence_nr()
            name = self.stack.pop()
            for seq in range(first, last):
                self.owner.setdefault(seq, name)  # inner modules finish first and claim first
            self.module = self.stack[-1] if self.stack else ""

    def __enter__(self):
        self.handles = [torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
                        torch.nn.modules.module.register_module_forward_hook(self._post)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def forward_done(self) -> None:
        self.phase, self.module = LOSS_PHASE, ""
        self.forward_end = torch.autograd._get_sequence_nr()

    def tag_backward(self, root) -> None:
        """Pre- and post-hooks on every autograd node reachable from ``root``: a node of the model's
        forward (or a gradient's accumulation) switches to the backward phase and its module; the
        loss's own nodes keep the loss phase."""
        seen, pending, number = set(), [root] if root is not None else [], 0
        while pending:
            node = pending.pop()
            if node in seen:
                continue
            seen.add(node)
            number += 1
            accumulate = not hasattr(node, "_sequence_nr") or "AccumulateGrad" in node.name()
            seq = None if accumulate else node._sequence_nr()
            of_model = accumulate or seq < self.forward_end
            module = "" if accumulate else self.owner.get(seq, "")

            def before(grad_outputs, module=module, number=number, of_model=of_model):
                if of_model:
                    self.phase = BACKWARD
                if self.phase == BACKWARD:
                    self.module, self.autograd_node = module, number

            def after(grad_inputs, grad_outputs):
                self.autograd_node = None  # what runs between nodes (adding two gradients) is nobody's

            node.register_prehook(before)
            node.register_hook(after)
            pending.extend(fn for fn, _ in node.next_functions if fn is not None)


class _Recorder(TorchDispatchMode):
    """Records every aten op of the step (see the module docstring); ``measure_scratch`` labels each
    op for the allocator's events (CPU) or reads the CUDA allocator's peak around it."""

    def __init__(self, tagger: _Tagger, fixed: set[int], sync: Callable[[], None], cuda_device: int | None,
                 measure_scratch: bool, bound: StepBound | None = None):
        super().__init__()
        self.tagger, self.fixed, self.sync, self.bound = tagger, fixed, sync, bound
        self.sizes: dict[int, int] = {}  # serial number -> bytes, for the bound
        self.cuda_device, self.measure_scratch = cuda_device, measure_scratch
        self.recording = _Recording()
        self.live: dict[int, tuple[int, StorageWeakRef]] = {}  # address -> (serial number, weak reference)
        self.serials = 0

    def collect_dead(self) -> None:
        """Storages freed since the last op: alive through the previous one."""
        index = len(self.recording.ops) - 1
        expired = torch.UntypedStorage._expired  # StorageWeakRef.expired without its two Python layers
        for address, (serial, _) in list(self.live.items()):
            if expired(address):
                self.recording.last_alive[serial] = index
                del self.live[address]
                if self.bound is not None:
                    self.bound.freed(self.sizes.pop(serial))

    def finish(self) -> None:
        self.collect_dead()
        self.recording.survivors = {serial for serial, _ in self.live.values()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.collect_dead()
        # Storages by serial number, not address: a freed storage's address is soon another's.
        reads = list(dict.fromkeys(
            self.live[ref.cdata][0] for t in pytree.tree_leaves((args, kwargs))
            if (ref := _storage_ref(t)) is not None and ref.cdata in self.live))
        read_addresses = {ref.cdata for t in pytree.tree_leaves((args, kwargs)) if (ref := _storage_ref(t)) is not None}
        index = len(self.recording.ops)
        scratch = 0
        if self.bound is not None:
            self.bound.before(func, args, kwargs)  # profiler/eager_bound.py: refused before it allocates
        if self.measure_scratch and self.cuda_device is not None:
            torch.cuda.synchronize(self.cuda_device)
            before = torch.cuda.memory_allocated(self.cuda_device)
            torch.cuda.reset_peak_memory_stats(self.cuda_device)
        self.sync()
        started = time.perf_counter()
        if self.measure_scratch and self.cuda_device is None:
            with torch.profiler.record_function(f"{SCRATCH_LABEL}{index}"):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        self.sync()
        seconds = time.perf_counter() - started
        if self.measure_scratch and self.cuda_device is not None:
            peak = torch.cuda.max_memory_allocated(self.cuda_device) - before
            end = torch.cuda.memory_allocated(self.cuda_device) - before
            scratch = max(0, peak - max(end, 0))
        made = []
        for t in pytree.tree_leaves(out):
            ref = _storage_ref(t)
            if ref is None or ref.cdata in self.live or ref.cdata in self.fixed or ref.cdata in read_addresses:
                continue  # a view, an in-place result, a parameter: nothing new
            serial = self.serials = self.serials + 1
            self.live[ref.cdata] = (serial, ref)
            made.append((serial, storage_bytes(t)))
        if self.bound is not None:
            self.sizes.update(made)
            self.bound.after(sum(size for _, size in made))
        tagger = self.tagger
        self.recording.ops.append(_Op(
            name=str(func), phase=tagger.phase, module=tagger.module if tagger.phase != LOSS_PHASE else "",
            autograd_node=tagger.autograd_node if tagger.phase == BACKWARD else None,
            random=torch.Tag.nondeterministic_seeded in func.tags, reads=reads, made=made, seconds=seconds,
            scratch=scratch))
        return out


def _record_step(model, args, kwargs, loss_fn, fixed: set[int], devices: list[int],
                 measure_scratch: bool, bound: StepBound | None = None) -> _Recording:
    """One training step under the recorder; the parameters' ``.grad`` are None before it.
    ``bound``: refuse an op that would take the step past it (profiler/eager_bound.py)."""
    for p in model.parameters():
        p.grad = None
    device = devices[0] if devices else None
    sync = (lambda: torch.cuda.synchronize(device)) if device is not None else (lambda: None)
    started = time.perf_counter()
    with _Tagger(model) as tagger:
        recorder = _Recorder(tagger, fixed, sync, device, measure_scratch, bound)
        with recorder:
            output = model(*args, **kwargs)
            tagger.forward_done()
            loss = loss_fn(output)
            tagger.tag_backward(loss.grad_fn)
            loss.backward()
            recorder.finish()  # the caller's output and loss are still held: they survive the step
        recorder.recording.with_gradient = tuple(name for name, p in model.named_parameters() if p.grad is not None)
        del output, loss
    sync()
    recorder.recording.step_seconds = time.perf_counter() - started
    return recorder.recording


def _same_ops(a: _Recording, b: _Recording) -> bool:
    return len(a.ops) == len(b.ops) and all(x.name == y.name for x, y in zip(a.ops, b.ops))


def record(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable, repeats: int = 3,
           bound: StepBound | None = None) -> _Recording:
    """The step recorded ``repeats`` times or more from the same RNG state (at least twice): the first
    run with each op's scratch memory measured, the others timed, until the sum of the ops' least
    times settles (:data:`SETTLED`, at most :data:`MAX_TIMED_RUNS`); each op's time is its least over the
    timed runs (another process's load only adds) plus its share of the overhead of a step run
    without the recorder (the least of as many runs and of the timed recorded steps, which can only
    be slower). Model, buffers, RNG and ``.grad`` left as they were. ``bound``: the first step is
    refused before an op would take it past the bound (the others repeat it)."""
    devices = cuda_devices([*model.parameters(), *pytree.tree_leaves((args, kwargs))])
    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    fixed = {ref.cdata for t in [*model.parameters(), *model.buffers(), *inputs] if (ref := _storage_ref(t))}
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        with preserved_state(model, devices):
            rng = get_rng_state(devices)
            if devices:
                recorded = _record_step(model, args, kwargs, loss_fn, fixed, devices, measure_scratch=True,
                                        bound=bound)
            else:
                with cpu_memory_profile() as memory_profile:
                    recorded = _record_step(model, args, kwargs, loss_fn, fixed, devices, measure_scratch=True,
                                            bound=bound)
                for label, scratch in _scratch_from_events(memory_profile).items():
                    if label.isdigit() and int(label) < len(recorded.ops):
                        recorded.ops[int(label)].scratch = scratch
            timed: list[_Recording] = []
            least = float("inf")
            for attempt in range(MAX_TIMED_RUNS):
                set_rng_state(rng)
                run = _record_step(model, args, kwargs, loss_fn, fixed, devices, measure_scratch=False)
                if _same_ops(recorded, run):
                    timed.append(run)
                total = sum(min(r.ops[i].seconds for r in timed) for i in range(len(recorded.ops))) if timed else least
                if attempt + 2 >= repeats and abs(least - total) <= SETTLED * total:
                    break
                least = total
            # A recorded step's wall time bounds the plain step's from above (the recorder only adds):
            # on a loaded machine a plain step's sample can be far slower than the step.
            plain = [run.step_seconds for run in timed]
            for _ in range(max(repeats - 1, 1)):
                set_rng_state(rng)
                plain.append(_plain_step_seconds(model, args, kwargs, loss_fn, devices))
    finally:
        for p, grad in grads:
            p.grad = grad
    for i, op in enumerate(recorded.ops):
        op.seconds = min([op.seconds if not timed else float("inf"), *(run.ops[i].seconds for run in timed)])
    # What the eager step spends besides the kernels (Python, the dispatcher, autograd), shared out
    # per op: a recomputed module runs its Python again, so the search prices that too (a small
    # model's step was 3-5x the sum of its ops' times).
    besides = max(0.0, min(plain) - sum(op.seconds for op in recorded.ops)) if recorded.ops else 0.0
    for op in recorded.ops:
        op.seconds += besides / len(recorded.ops)
    recorded.step_seconds = min(plain)
    return recorded


def _plain_step_seconds(model, args, kwargs, loss_fn, devices: list[int]) -> float:
    """Wall time of one training step without the recorder (seconds)."""
    for p in model.parameters():
        p.grad = None
    sync = (lambda: torch.cuda.synchronize(devices[0])) if devices else (lambda: None)
    sync()
    started = time.perf_counter()
    output = model(*args, **kwargs)
    loss_fn(output).backward()
    sync()
    return time.perf_counter() - started


def build_graph(recording: _Recording, fixed_bytes: int) -> nx.DiGraph:
    """The cost graph of a recorded step (docs/costgraph.md's attributes): one node per storage an op
    made (an op's first storage is its node, its others ``"<node>/k"`` nodes read from it, cost 0),
    one node for an op that made none, and one ``"loss"`` node for the loss and its backward."""
    ops = recording.ops
    graph = nx.DiGraph(fixed_bytes=int(fixed_bytes), loss_node=LOSS, loss_value_bytes=0, granularity=GRANULARITY)
    owner: dict[int, str] = {}  # storage serial -> its node
    op_node: list[str] = []  # op index -> its node (the loss node for the loss's ops)
    loss_ops = [i for i, op in enumerate(ops) if op.phase == LOSS_PHASE]
    loss_end = loss_ops[-1] if loss_ops else -1
    for i, op in enumerate(ops):
        if op.phase == LOSS_PHASE:
            if LOSS not in graph:
                graph.add_node(LOSS, cost=0.0, mem=0, workspace=0, kind="loss", module="", ops=0, random=False, op="")
            graph.nodes[LOSS]["cost"] += op.seconds
            graph.nodes[LOSS]["ops"] += 1
            for key in op.reads:
                if key in owner and owner[key] != LOSS:
                    graph.add_edge(owner[key], LOSS)
            for key, _ in op.made:
                owner[key] = LOSS
            op_node.append(LOSS)
            continue
        prefix = "fw" if op.phase == FORWARD else "bw"
        node = f"{prefix}:{op.module or '<root>'}#{i}"
        first = op.made[0][1] if op.made else 0
        attributes = dict(cost=op.seconds, mem=int(first), workspace=int(op.scratch), kind=op.phase, module=op.module,
                          ops=1, random=op.random, op=op.name)
        if op.autograd_node is not None:
            attributes["autograd_node"] = op.autograd_node
        graph.add_node(node, **attributes)
        for key in op.reads:
            if key in owner and owner[key] != node:
                graph.add_edge(owner[key], node)
        for k, (key, nbytes) in enumerate(op.made):
            name = node if k == 0 else f"{node}/{k}"
            if k:
                graph.add_node(name, cost=0.0, mem=int(nbytes), workspace=0, kind=op.phase, module=op.module, ops=0,
                               random=False, op="")
                graph.add_edge(node, name)
            owner[key] = name
        op_node.append(node)
    _add_lifetimes(graph, recording, owner, op_node, loss_end)
    graph.graph["fingerprint"] = fingerprint(graph)
    return graph


def _add_lifetimes(graph: nx.DiGraph, recording: _Recording, owner: dict[int, str], op_node: list[str],
                   loss_end: int) -> None:
    """Liveness edges (``hold=True``) from each storage's node to the op it was alive through; the
    storages alive at the step's end make their node an ``output``; the loss node's own figures."""
    position = {v: i for i, v in enumerate(graph.nodes)}
    loss_made: dict[int, int] = {}
    for op in recording.ops:
        if op.phase == LOSS_PHASE:
            loss_made.update(op.made)
    for key, node in owner.items():
        if node == LOSS:
            continue
        if key in recording.survivors:
            graph.nodes[node]["output"] = True
            continue
        last = recording.last_alive.get(key)
        if last is None:
            continue
        holder = op_node[last]
        if position[holder] > position[node] and not graph.has_edge(node, holder):
            graph.add_edge(node, holder, hold=True)
    if LOSS not in graph:
        return
    # The loss's storages: those alive to the end (its value) are held with the parameters; those alive
    # past the loss (the output's gradient) are its mem; the rest its workspace.
    value = sum(b for k, b in loss_made.items() if k in recording.survivors)
    after_loss = {k: b for k, b in loss_made.items() if k not in recording.survivors
                  and recording.last_alive.get(k, -1) > loss_end}
    live = peak = 0
    for i, op in enumerate(recording.ops):
        if op.phase != LOSS_PHASE:
            continue
        made = sum(b for _, b in op.made)
        peak = max(peak, live + made + op.scratch)
        live += made
        live -= sum(b for k, b in loss_made.items() if recording.last_alive.get(k) == i and k not in recording.survivors)
    data = graph.nodes[LOSS]
    data["mem"] = int(sum(after_loss.values()))
    data["workspace"] = int(max(0, peak - data["mem"] - value))
    graph.graph["loss_value_bytes"] = int(value)
    last = max((recording.last_alive[k] for k in after_loss), default=None)
    if last is not None and op_node[last] != LOSS:
        graph.add_edge(LOSS, op_node[last], hold=True)


def eager_profile(model: torch.nn.Module, example_inputs, loss_fn: Callable | None = None, repeats: int = 3,
                  reason: str = "", memory_bound: int | None = None):
    """The :class:`profiler.Profile` (``"op"`` granularity, ``joint`` an :class:`EagerStep`) of
    ``model``'s training step on ``example_inputs``, recorded eagerly (the module docstring):
    ``cost`` in seconds, ``mem`` and ``workspace`` in bytes, ``fixed_bytes`` the parameters', buffers'
    and inputs' storages. ``reason``: why the tracer was not used, kept in the profile.
    ``memory_bound`` (bytes, resident ones included; None: none): the step is recorded first, and
    refused with :class:`profiler.oom.OutOfMemory` before an op would take it past the bound
    (profiler/eager_bound.py); the loss's own run after it holds less than the step."""
    from .api import Profile

    started = time.perf_counter()
    args, kwargs = normalise_inputs(example_inputs)
    loss_fn = loss_fn or default_loss
    devices = cuda_devices([*model.parameters()])
    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    bound = None
    if memory_bound is not None:
        device = "cuda" if devices else "cpu"
        bound = StepBound(memory_bound, resident_bytes(model, inputs), device,
                          "recording the un-checkpointed step eagerly (the tracer cannot follow the model, so it "
                          "cannot be profiled within a bound)", free_now=cpu_free_under_a_limit if not devices
                          else (lambda: None))
    recording = record(model, args, kwargs, loss_fn, repeats, bound)
    with preserved_state(model, devices):
        loss, _ = run_planning_loss(model, args, kwargs, loss_fn)
        with torch.no_grad():
            output = model(*args, **kwargs)
        output_spec = pytree.tree_structure(output)
        del output
    graph = build_graph(recording, resident_bytes(model, inputs))
    device = str(next((p.device for p in model.parameters()), torch.device("cpu")))
    graph.graph.update(device=device, torch_version=torch.__version__, eager=True,
                       step_seconds=recording.step_seconds)
    step = EagerStep(loss, input_layout(args, kwargs), output_spec, autocast_state(), reason,
                     tuple((name, "") for name in recording.with_gradient))
    return Profile(graph, step, None, None, GRANULARITY, device, time.perf_counter() - started)


__all__ = ["EagerStep", "build_graph", "eager_profile", "record"]
