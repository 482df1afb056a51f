"""When the tracer cannot follow a model: checkpoint whole blocks with torch.utils.checkpoint.

``planner.plan`` profiles a model by tracing its training step (profiler/capture.py). A forward with
Python control flow on tensor values (``if x.mean() > 0``) cannot be traced. Rather than give up,
the planner then falls back to what a user would do by hand, and says so:

1. **Find the chain.** Run the forward once eagerly and find the largest ``nn.ModuleList`` or
   ``nn.Sequential`` whose children are each called once, in order: the model's repeated blocks.
2. **Measure each block** during that run: the bytes autograd saves inside it
   (``torch.autograd.graph.saved_tensors_hooks``; parameters and the block's own inputs excluded:
   those stay resident anyway) and its forward time (what recomputing it costs).
3. **Choose blocks** greedily, the most bytes saved per second of recomputation first, and take
   the shortest prefix of that order whose *measured* step (profiler.measure_step, on the example
   inputs) fits the budget, found by bisection from an estimate.
4. **Wrap** those blocks in ``torch.utils.checkpoint(use_reentrant=False, preserve_rng_state=True)``
   (runtime/chain.py).

The plan's peak and time are measured on the example inputs, not predicted from a cost graph; its
summary, its JSON (``"figures": "measured"``) and a :class:`FallbackWarning` say so. Its ``graph`` and
``schedule`` describe the blocks (one forward and one backward node per block; a checkpointed
block's forward node is freed after the forward and computed again before its backward) so that
tools reading any plan keep working; they are a description, not what the figures come from.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import networkx as nx
import torch
import torch.utils._pytree as pytree

import runtime
from profiler.capture import CaptureError, autocast_state, default_loss
from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.inputs import input_layout, normalise_inputs
from profiler.memory import StepMeasurement, measure_step
from profiler.state import cuda_devices, preserved_state
from solvers import Infeasible, Schedule, simulate
from solvers.schedule import COMPUTE, FREE

from .budget import Budget, format_bytes
from .planfile import FORMAT as PLAN_FORMAT
from .planfile import Plan, PlanFileError, _seconds, _text, _whole

CHAIN_FORMAT = "plan-checkpoints/module-chain/1"
METHOD = "module-chain"


class FallbackWarning(UserWarning):
    """The model could not be traced: its plan checkpoints whole blocks with torch.utils.checkpoint."""


class NoChainFound(CaptureError):
    """The model could not be traced and has no chain of blocks to checkpoint instead."""


@dataclass(frozen=True)
class BlockCost:
    """One block of the chain, measured in an eager forward."""

    path: str
    saved_bytes: int  # bytes autograd saves inside the block, its inputs and the parameters excluded
    seconds: float  # forward time: what recomputing it costs


@dataclass(frozen=True)
class ModuleChain:
    """What a module-chain plan checkpoints, and why it exists."""

    container: str  # path of the nn.ModuleList / nn.Sequential ("" for the model itself)
    blocks: tuple[BlockCost, ...]
    checkpointed: tuple[str, ...]  # block paths, in the chain's order
    reason: str  # why the tracer could not be used

    @property
    def block_paths(self) -> list[str]:
        return [b.path for b in self.blocks]

    def to_dict(self) -> dict:
        return {
            "container": self.container,
            "blocks": [{"path": b.path, "saved_bytes": b.saved_bytes, "seconds": b.seconds} for b in self.blocks],
            "checkpointed": list(self.checkpointed),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModuleChain:
        blocks = tuple(
            BlockCost(_text(b["path"]), _whole(b["saved_bytes"]), _seconds(b["seconds"])) for b in data["blocks"]
        )
        checkpointed = tuple(_text(p) for p in data["checkpointed"])
        unknown = [p for p in checkpointed if p not in {b.path for b in blocks}]
        if unknown:
            raise ValueError(f"checkpointed block {unknown[0]!r} is not one of the chain's blocks")
        return cls(_text(data["container"]), blocks, checkpointed, _text(data.get("reason", "")))


@dataclass
class ModuleChainPlan(Plan):
    """A plan that checkpoints whole blocks (see the module docstring). ``predicted_peak_bytes`` and
    ``predicted_seconds`` are measured on the example inputs, as are the ``unplanned_*`` figures."""

    chain: ModuleChain | None = None

    @property
    def fallback(self) -> str:
        """Why this plan is not a traced schedule, and what it does instead."""
        chain = self.chain
        where = f"'{chain.container}'" if chain.container else "the model itself"
        return (
            f"could not trace the training step ({chain.reason}); fell back to checkpointing whole blocks of "
            f"{where} with torch.utils.checkpoint: {len(chain.checkpointed)} of {len(chain.blocks)} blocks. "
            "Peak and time are measured on the example inputs, not predicted from a cost graph"
        )

    def summary(self) -> str:
        chain = self.chain
        saved = self.unplanned_peak_bytes - self.predicted_peak_bytes
        shown = ", ".join(chain.checkpointed[:6])
        if len(chain.checkpointed) > 6:
            shown += f" and {len(chain.checkpointed) - 6} more"
        lines = [
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            f"FALLBACK:          {self.fallback}",
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}) for the whole step; "
            f"parameters, buffers and inputs take {format_bytes(self.fixed_bytes)}",
            f"Measured peak:     {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)} ({format_bytes(saved)} less)",
            f"Measured time:     {self.predicted_seconds * 1000:.1f} ms per step, {self.predicted_overhead:+.1%} over "
            f"{self.unplanned_seconds * 1000:.1f} ms without checkpointing (medians of 3 steps)",
            f"Checkpointed:      {shown or 'nothing (the step fits without checkpointing)'}",
        ]
        if self.autocast:
            lines.append(f"Autocast:          measured under torch.autocast ({self.autocast})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = super().to_dict()
        data["format"] = CHAIN_FORMAT
        data["figures"] = "measured"
        data["chain"] = self.chain.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> ModuleChainPlan:
        try:
            chain = ModuleChain.from_dict(data["chain"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {type(error).__name__}: {error}") from None
        plain = Plan.from_dict({**data, "format": PLAN_FORMAT}, source, check_figures=False)  # measured
        fields = {name: getattr(plain, name) for name in Plan.__dataclass_fields__}
        return cls(**fields, chain=chain)


# -- 1 and 2: the chain and what each block costs ---------------------------------------------------
@dataclass
class _Calls:
    """What the eager forward records about one candidate block."""

    count: int = 0
    first: int = -1
    seconds: float = 0.0
    saved: dict = field(default_factory=dict)  # storage data_ptr -> bytes
    inputs: set = field(default_factory=set)  # storage data_ptrs of its inputs


def _storage_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else None


def _candidates(model: torch.nn.Module) -> dict[str, list[str]]:
    """Container path -> its children's paths, for every ModuleList/Sequential of >= 2 children."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module) >= 2:
            prefix = f"{path}." if path else ""
            found[path] = [f"{prefix}{name}" for name in module._modules]
    return found


def _record_forward(model, args, kwargs, blocks: dict[str, torch.nn.Module]) -> dict[str, _Calls]:
    """One eager forward with grad; per block: calls, order, time and saved-tensor storages."""
    calls = {path: _Calls() for path in blocks}
    resident = {k[0] for t in [*model.parameters(), *model.buffers()] if (k := _storage_key(t))}
    stack: list[str] = []
    order = [0]
    starts: dict[str, float] = {}
    sync = torch.cuda.synchronize if cuda_devices(list(model.parameters())) else (lambda: None)

    def pre(path):
        def hook(module, args, kwargs):
            record = calls[path]
            record.count += 1
            if record.first < 0:
                record.first, order[0] = order[0], order[0] + 1
            leaves = pytree.tree_leaves((args, kwargs))
            record.inputs.update(k[0] for t in leaves if isinstance(t, torch.Tensor) and (k := _storage_key(t)))
            stack.append(path)
            sync()
            starts[path] = time.perf_counter()
        return hook

    def post(path):
        def hook(module, args, output):
            sync()
            calls[path].seconds += time.perf_counter() - starts[path]
            stack.remove(path)
        return hook

    def pack(tensor):
        key = _storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
        if key is not None and key[0] not in resident:
            for path in stack:
                if key[0] not in calls[path].inputs:
                    calls[path].saved[key[0]] = key[1]
        return tensor

    handles = []
    for path, module in blocks.items():
        handles.append(module.register_forward_pre_hook(pre(path), with_kwargs=True))
        handles.append(module.register_forward_hook(post(path)))
    try:
        with preserved_state(model, cuda_devices(list(model.parameters()))):
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                output = model(*args, **kwargs)
            del output
    finally:
        for handle in handles:
            handle.remove()
    return calls


def find_chain(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[str, list[BlockCost]]:
    """The model's chain of repeated blocks, measured: (container path, blocks in call order).

    The chain is the largest nn.ModuleList or nn.Sequential whose children are each called exactly
    once per forward, in their order (ties: the one saving more bytes). Raises :class:`NoChainFound`."""
    candidates = _candidates(model)
    modules = dict(model.named_modules())
    blocks = {path: modules[path] for children in candidates.values() for path in children}
    calls = _record_forward(model, args, kwargs, blocks) if blocks else {}
    best = None
    for container, children in candidates.items():
        records = [calls[c] for c in children]
        firsts = [r.first for r in records]
        if any(r.count != 1 for r in records) or firsts != sorted(firsts):
            continue
        saved = sum(sum(r.saved.values()) for r in records)
        key = (len(children), saved)
        if best is None or key > best[0]:
            best = (key, container, children)
    if best is None:
        raise NoChainFound(
            "found no chain of blocks to checkpoint instead (an nn.ModuleList or nn.Sequential of at least two "
            "blocks, each called once per forward, in order)"
        )
    _, container, children = best
    return container, [BlockCost(c, sum(calls[c].saved.values()), calls[c].seconds) for c in children]


# -- 3: choose the blocks ------------------------------------------------------------------------------
def greedy_order(blocks: list[BlockCost]) -> list[BlockCost]:
    """Blocks by bytes saved per second of recomputation, most first (ties: chain order)."""
    return sorted(blocks, key=lambda b: -b.saved_bytes / max(b.seconds, 1e-9))


def estimated_peak(unplanned_peak: int, chosen: list[BlockCost], rng_bytes: int = 0) -> int:
    """The step's peak if ``chosen`` are checkpointed: their saved bytes leave the forward, each
    keeps a copy of the RNG state (``rng_bytes``: preserve_rng_state), and the backward holds one of
    them again while it recomputes it. An estimate, to start the search."""
    if not chosen:
        return unplanned_peak
    saved = sum(b.saved_bytes for b in chosen)
    return unplanned_peak - saved + max(b.saved_bytes for b in chosen) + rng_bytes * len(chosen)


def rng_state_bytes(devices: list[int]) -> int:
    """Bytes of the RNG states one checkpointed block keeps (CPU, and each CUDA device in use)."""
    return torch.get_rng_state().nbytes + sum(torch.cuda.get_rng_state(d).nbytes for d in devices)


def _in_chain_order(blocks: list[BlockCost], chosen: list[BlockCost]) -> tuple[str, ...]:
    paths = {b.path for b in chosen}
    return tuple(b.path for b in blocks if b.path in paths)


class _Measurer:
    """Measured steps of the model with a prefix of the greedy order checkpointed, cached by prefix."""

    def __init__(self, model, example_inputs, loss_fn, order: list[BlockCost]):
        self.model, self.inputs, self.loss_fn, self.order = model, example_inputs, loss_fn, order
        self.cache: dict[int, StepMeasurement] = {}

    def __call__(self, count: int, repeats: int = 1) -> StepMeasurement:
        if count not in self.cache or self.cache[count].runs < repeats:
            paths = [b.path for b in self.order[:count]]
            module = runtime.checkpoint_blocks(self.model, paths) if paths else self.model
            self.cache[count] = measure_planned_step(module, self.inputs, self.loss_fn, repeats)
        return self.cache[count]


def measure_planned_step(module, example_inputs, loss_fn, repeats: int, warm_up: bool = True) -> StepMeasurement:
    """profiler.memory.measure_step (peak in bytes, seconds per step over ``repeats``), leaving the
    parameters' ``.grad`` as they were: planning must not train, and a planning step's gradients would
    otherwise be added to the user's first real step's. Used by this fallback and by
    planner/native.py's measured native plans.

    ``warm_up=False`` (on CPU; CUDA always warms up) measures the peak on the first step, without
    measure_step's warm-up step: for a model whose ops have all run already in this process (the
    native planner measures after profiling), which leaves nothing lazy to initialise (the peaks of
    9 zoo models, eager and planned, were the same bytes either way). There ``repeats=0`` measures
    the peak alone: ``seconds`` is NaN and ``runs`` 0."""
    grads = [(p, p.grad) for p in module.parameters()]
    try:
        if warm_up:
            return measure_step(module, example_inputs, loss_fn=loss_fn, repeats=max(repeats, 1))
        return measure_step(module, example_inputs, loss_fn=loss_fn, repeats=repeats, warm_up=False)
    finally:
        for p, grad in grads:
            p.grad = grad


def choose_count(measure: _Measurer, budget: int, unplanned: StepMeasurement, order: list[BlockCost],
                 rng_bytes: int = 0) -> int:
    """The fewest blocks of ``order`` (a prefix) whose measured peak fits ``budget``: bisection
    between 0 (known not to fit) and all of them, starting from the estimate's guess. Assumes the
    peak does not grow as more blocks are checkpointed, which holds up to measurement noise."""
    if unplanned.peak_bytes <= budget:
        return 0
    everything = measure(len(order))
    if everything.peak_bytes > budget:
        raise Infeasible(
            f"{format_bytes(budget)} is below the least this model's step reaches by checkpointing whole blocks: "
            f"{format_bytes(everything.peak_bytes)} ({everything.peak_bytes} bytes, measured with all {len(order)} "
            "blocks checkpointed; the model could not be traced, so no finer plan exists)",
            min_budget=everything.peak_bytes, method=METHOD,
        )
    low, high = 0, len(order)  # low does not fit, high fits
    guess = next(
        (k for k in range(1, len(order) + 1) if estimated_peak(unplanned.peak_bytes, order[:k], rng_bytes) <= budget),
        len(order),
    )
    while high - low > 1:
        middle = guess if low < guess < high else (low + high) // 2
        guess = -1
        if measure(middle).peak_bytes <= budget:
            high = middle
        else:
            low = middle
    return high


# -- 4: the plan --------------------------------------------------------------------------------------
def describe_graph(blocks: list[BlockCost], checkpointed: tuple[str, ...], fixed_bytes: int) -> tuple[nx.DiGraph, Schedule]:
    """A cost graph and schedule that describe the plan (see the module docstring): per block a
    forward node (its saved bytes, its forward time) and a backward node, and the loss."""
    graph = nx.DiGraph(fixed_bytes=fixed_bytes, loss_node="loss", granularity=METHOD)
    graph.add_node("loss", cost=0.0, mem=0, workspace=0, pinned=True, output=True, kind="loss", module="")
    for block in blocks:
        graph.add_node(f"fw:{block.path}", cost=block.seconds, mem=block.saved_bytes, kind="forward", module=block.path)
        graph.add_node(f"bw:{block.path}", cost=0.0, mem=0, output=True, kind="backward", module=block.path)
        graph.add_edge(f"fw:{block.path}", f"bw:{block.path}")
    for later, earlier in zip(blocks[1:], blocks[:-1]):
        graph.add_edge(f"bw:{later.path}", f"bw:{earlier.path}")
    if blocks:
        graph.add_edge("loss", f"bw:{blocks[-1].path}")
    graph.graph["fingerprint"] = graph_fingerprint(graph)
    recomputed = set(checkpointed)
    steps = []
    for block in blocks:
        steps.append((COMPUTE, f"fw:{block.path}"))
        if block.path in recomputed:
            steps.append((FREE, f"fw:{block.path}"))
    steps.append((COMPUTE, "loss"))
    for block in reversed(blocks):
        if block.path in recomputed:
            steps.append((COMPUTE, f"fw:{block.path}"))
        steps.append((COMPUTE, f"bw:{block.path}"))
        steps.append((FREE, f"fw:{block.path}"))
    return graph, Schedule(steps)


def plan_module_chain(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None,
                      reason: str = "") -> ModuleChainPlan:
    """The fallback plan for ``model`` (see the module docstring); warns :class:`FallbackWarning`.
    Raises :class:`NoChainFound`, or :class:`solvers.Infeasible` (``min_budget`` measured) when even
    checkpointing every block does not fit ``budget``."""
    started = time.perf_counter()
    args, kwargs = normalise_inputs(example_inputs)
    loss_fn = loss_fn or default_loss
    container, blocks = find_chain(model, args, kwargs)
    where = f"'{container}'" if container else "the model itself"
    warnings.warn(FallbackWarning(
        f"could not trace {type(model).__name__}'s training step ({reason}); falling back to checkpointing whole "
        f"blocks of {where} ({len(blocks)} blocks) with torch.utils.checkpoint. Its peak and time are measured on "
        "the example inputs, not predicted from a cost graph"), stacklevel=3)
    order = greedy_order(blocks)
    measure = _Measurer(model, example_inputs, loss_fn, order)
    unplanned = measure(0, repeats=3)
    budget_bytes = budget.resolve(unplanned.peak_bytes)
    rng_bytes = rng_state_bytes(cuda_devices(list(model.parameters())))
    count = choose_count(measure, budget_bytes, unplanned, order, rng_bytes)
    chosen = measure(count, repeats=3)
    checkpointed = _in_chain_order(blocks, order[:count])
    chain = ModuleChain(container, tuple(blocks), checkpointed, reason)
    graph, schedule = describe_graph(blocks, checkpointed, unplanned.resident_bytes)
    outcome = simulate(graph, schedule)
    plan = ModuleChainPlan(
        schedule=schedule.with_info(
            method=METHOD, status="heuristic", solve_seconds=time.perf_counter() - started,
            budget_bytes=budget_bytes, predicted_peak_bytes=outcome.peak_bytes, compute_cost=outcome.compute_cost,
        ),
        graph=graph,
        budget_bytes=budget_bytes,
        budget_text=str(budget),
        fixed_bytes=unplanned.resident_bytes,
        predicted_peak_bytes=chosen.peak_bytes,
        unplanned_peak_bytes=unplanned.peak_bytes,
        predicted_seconds=chosen.seconds,
        unplanned_seconds=unplanned.seconds,
        fingerprint=runtime.chain.module_fingerprint(model, [b.path for b in blocks]),
        granularity=METHOD,
        device=str(next((p.device for p in model.parameters()), torch.device("cpu"))),
        torch_version=torch.__version__,
        tangent_outputs=(),
        tangent_specs=(),
        inputs=input_layout(args, kwargs).signature,
        model=type(model).__name__,
        profile_seconds=time.perf_counter() - started,
        autocast=autocast_state(),
        chain=chain,
    )
    plan.schedule = plan.schedule.with_info(message=plan.fallback)
    return plan


__all__ = [
    "BlockCost", "CHAIN_FORMAT", "FallbackWarning", "ModuleChain", "ModuleChainPlan", "NoChainFound",
    "find_chain", "plan_module_chain",
]
