"""What ``torch.utils.checkpoint`` itself costs, measured on the model's device.

The op costs of a profile price a checkpointed region's recomputation as its ops run again. The
checkpoint does more (torch/utils/checkpoint.py, non-reentrant, ``preserve_rng_state=True``): at
every call it saves the generators' states and enters its saved-tensor hooks; every tensor autograd
saves inside the region goes through a Python pack hook, and through an unpack hook in the
backward; the recomputation restores the random state (``fork_rng``), runs the region's Python
forward again under its own hooks (packing every saved tensor once more), and records the autograd
graph it then discards. Under a selective save policy (``context_fn`` of
``create_selective_checkpoint_contexts``) every op of the region also goes through a Python
``TorchDispatchMode`` and the policy, in the forward and again in the recomputation.

:func:`measure_checkpoint_costs` measures these on a synthetic region, a chain of ``k`` elementwise
ops on a tiny tensor (each op saves its input: one op, one saved tensor), at two lengths, each run
plain, under ``no_grad`` (what the profile's op costs count of a recomputation), checkpointed, and
checkpointed under each save policy. Differences between the variants are the checkpoint's own
costs; the two lengths split them into a part per region (the intercept) and a part per saved
tensor or per op (the slope). The per-region part is measured twice: stepped back to back (warm,
what a region stepped alone pays: the model's region is fitted against it below) and with the
host's caches emptied before the forward and between the forward and the backward
(profiler/cache_eviction.py), as the rest of a training step empties them between a region's
forward and its recomputation: the cold figure is the one priced. The numbers feed
solvers/regions/costs.py's cost of a region (``graph.graph["checkpoint_costs"]``:
:meth:`CheckpointCosts.as_graph_data`).

Robust to a loaded machine: every variant is stepped in turn in each round (paired), and each
variant's least over the rounds is kept (another process's load only adds time). The whole
calibration is a few hundred tiny steps (~0.2 s on one CPU thread).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
import torch.utils.checkpoint as torch_checkpoint

from .cache_eviction import CacheEvictor, cache_evictor
from .inputs import normalise_inputs
from .state import cuda_devices, preserved_state

# Ops in the short and the long synthetic region: far enough apart that the slope stands out of the
# timer's and the machine's noise, short enough that a round costs about a millisecond on a CPU.
CHAIN_LENGTHS = (4, 36)
ROUNDS = 15
ELEMENTS = 16  # elements of the synthetic tensor: its ops cost their dispatch, not their arithmetic


@dataclass(frozen=True)
class CheckpointCosts:
    """Seconds ``torch.utils.checkpoint`` adds to a training step beyond running a region's ops
    again, on ``device`` (see the module docstring).

    ``region_seconds``: per checkpointed call (generator states saved and restored, hooks entered,
    the checkpoint's own Python, in the forward and the recomputation together), from cold caches as
    in a training step; ``warm_region_seconds`` the same stepped back to back (None where it was
    not measured apart: the same figure).
    ``recomputed_op_seconds``: per op the recomputation runs (its saved tensors packed in the
    forward and the recomputation and unpacked in the backward, the Python forward run again, the
    discarded autograd recording). ``policy_region_seconds`` and ``policy_op_seconds``: per save
    policy (by the names of solvers/regions/policies.py ``SAVE_POLICIES``), what its selective checkpoint
    adds per call, and per op per pass (the forward is one pass over the region's ops, the
    recomputation another over those it runs, cached or not). ``source``: what the figures were
    measured on (``"synthetic"``, or the model's region they were fitted to); ``scale``: the factor
    that put them on the profile's clock (:func:`fit_to_region`; 1 for the synthetic figures)."""

    device: str
    region_seconds: float
    recomputed_op_seconds: float
    policy_region_seconds: dict[str, float] = field(default_factory=dict)
    policy_op_seconds: dict[str, float] = field(default_factory=dict)
    source: str = "synthetic"
    scale: float = 1.0
    warm_region_seconds: float | None = None

    @property
    def back_to_back_region_seconds(self) -> float:
        """Per checkpointed call, stepped back to back (the warm figure, else the one priced)."""
        return self.region_seconds if self.warm_region_seconds is None else self.warm_region_seconds

    def as_graph_data(self) -> dict:
        """The figures as solvers/regions/costs.py reads them from ``graph.graph["checkpoint_costs"]``
        (plain numbers: a plan file keeps them)."""
        return {
            "device": self.device,
            "source": self.source,
            "scale": self.scale,
            "region_seconds": self.region_seconds,
            "warm_region_seconds": self.back_to_back_region_seconds,
            "recomputed_op_seconds": self.recomputed_op_seconds,
            "policy_region_seconds": dict(self.policy_region_seconds),
            "policy_op_seconds": dict(self.policy_op_seconds),
        }


class _Chain(torch.nn.Module):
    """``length`` sines in a row: each saves its input for the backward."""

    def __init__(self, length: int):
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.length):
            x = torch.sin(x)
        return x


def _timed(step: Callable[[], None], sync: Callable[[], None], clock: Callable[[], float]) -> float:
    return _timed_result(step, sync, clock)[0]


def _timed_result(function: Callable[[], object], sync: Callable[[], None],
                  clock: Callable[[], float]) -> tuple[float, object]:
    """Seconds of one call of ``function`` by ``clock`` (the device synchronised around it), and its result."""
    sync()
    started = clock()
    result = function()
    sync()
    return clock() - started, result


@contextlib.contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On a CPU, one torch thread while measuring: the checkpoint's machinery is Python on one
    thread, and parallel ops on an oversubscribed machine wait for each other's threads (a
    4-layer GPT-2's block stepped 42 times took 247 s with 2 threads at load 17 on 2 cores, 11 s
    with one)."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _clock_for(device: torch.device) -> Callable[[], float]:
    """The process's CPU time on a CPU (what other processes' load does not add to: a step
    preempted for 10 ms reads 10 ms longer on the wall clock), the wall clock on a GPU (the host
    waits for the device)."""
    return time.perf_counter if device.type == "cuda" else time.process_time


def _variants(chain: _Chain, x: torch.Tensor,
              policy_contexts: Mapping[str, Callable[[], Callable]]) -> dict[str, Callable[[], Callable[[], None]]]:
    """Each variant as a function that prepares one step (outside the timer: a policy's context is
    made per call) and returns it."""

    def backward_of(run):
        def prepare():
            def step():
                run().sum().backward()
            return step
        return prepare

    def no_grad():
        def step():
            with torch.no_grad():
                chain(x)
        return step

    def checkpointed(make_context=None):
        def prepare():
            kwargs = {} if make_context is None else {"context_fn": make_context()}

            def step():
                torch_checkpoint.checkpoint(chain, x, use_reentrant=False, preserve_rng_state=True,
                                            **kwargs).sum().backward()
            return step
        return prepare

    variants = {"plain": backward_of(lambda: chain(x)), "no_grad": no_grad, "checkpoint": checkpointed()}
    for name, make_context in policy_contexts.items():
        variants[f"policy:{name}"] = checkpointed(make_context)
    return variants


def _least_times(device: torch.device, policy_contexts: Mapping[str, Callable[[], Callable]],
                 rounds: int) -> dict[tuple[int, str], float]:
    """(chain length, variant) -> least seconds of one step over ``rounds`` rounds, every variant of
    both lengths stepped once per round."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = _clock_for(device)
    prepared = {}
    for length in CHAIN_LENGTHS:
        x = torch.randn(ELEMENTS, device=device, requires_grad=True)
        for name, prepare in _variants(_Chain(length), x, policy_contexts).items():
            prepared[(length, name)] = (prepare, x)
    least: dict[tuple[int, str], float] = {}
    for round_number in range(rounds + 1):  # the first round warms up (lazy initialisation), untimed
        for key, (prepare, x) in prepared.items():
            step = prepare()
            seconds = _timed(step, sync, clock)
            x.grad = None
            if round_number:
                least[key] = min(least.get(key, seconds), seconds)
    return least


def _cold_least_times(device: torch.device, evictor: CacheEvictor, rounds: int) -> dict[tuple[int, str], float]:
    """(chain length, ``"plain"`` or ``"checkpoint"``) -> least seconds of one step over ``rounds``
    rounds, the host's caches emptied before its forward and between its forward and its backward
    (the emptying untimed), and ``"no_grad"``, the forward alone, warm; every variant of both
    lengths stepped once per round after an untimed one."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = _clock_for(device)
    prepared = []
    for length in CHAIN_LENGTHS:
        chain, x = _Chain(length), torch.randn(ELEMENTS, device=device, requires_grad=True)
        prepared.append(((length, "no_grad"), lambda chain=chain, x=x: _no_grad_call(chain, x), x))
        prepared.append(((length, "plain"), lambda chain=chain, x=x: chain(x), x))
        prepared.append(((length, "checkpoint"),
                         lambda chain=chain, x=x: torch_checkpoint.checkpoint(chain, x, use_reentrant=False,
                                                                              preserve_rng_state=True), x))
    least: dict[tuple[int, str], float] = {}
    for round_number in range(rounds + 1):
        for key, forward, x in prepared:
            if key[1] == "no_grad":  # the recomputed ops as the profile times them: warm, forward only
                seconds = _timed(forward, sync, clock)
                if round_number:
                    least[key] = min(least.get(key, seconds), seconds)
                continue
            evictor.evict()
            forward_seconds, output = _timed_result(forward, sync, clock)
            evictor.evict()
            seconds = forward_seconds + _timed(lambda output=output: output.sum().backward(), sync, clock)
            del output
            x.grad = None
            if round_number:
                least[key] = min(least.get(key, seconds), seconds)
    return least


def _no_grad_call(chain: _Chain, x: torch.Tensor) -> None:
    with torch.no_grad():
        chain(x)


def _line(short: float, long: float) -> tuple[float, float]:
    """(intercept, slope) through (CHAIN_LENGTHS[0], short) and (CHAIN_LENGTHS[1], long), each
    clamped at zero: a cost the noise made negative is no cost."""
    a, b = CHAIN_LENGTHS
    slope = max(0.0, (long - short) / (b - a))
    return max(0.0, short - slope * a), slope


def measure_checkpoint_costs(device: torch.device | str = "cpu",
                             policy_contexts: Mapping[str, Callable[[], Callable]] | None = None,
                             rounds: int = ROUNDS, cold_region_seconds: float | None = None) -> CheckpointCosts:
    """Measure :class:`CheckpointCosts` on ``device``. ``policy_contexts``: save-policy name ->
    a function that makes the ``context_fn`` of one checkpointed call under that policy (the
    runtime's, runtime/save_policies.py, so that what is timed is what plans run).
    ``cold_region_seconds``: :func:`measure_cold_region_seconds` where the caller has it (it does
    not depend on the policies), else measured here."""
    device = torch.device(device)
    policy_contexts = dict(policy_contexts or {})
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), one_cpu_thread(device):
        least = _least_times(device, policy_contexts, rounds)

    def extra(length: int, variant: str, base: str) -> float:
        return least[(length, variant)] - least[(length, base)]

    short, long = CHAIN_LENGTHS
    # The checkpoint's step against the plain one is its own cost plus the region's ops run again:
    # those the profile prices (the no_grad forward), taken out.
    checkpoint_extra = [extra(n, "checkpoint", "plain") - least[(n, "no_grad")] for n in CHAIN_LENGTHS]
    warm_region_seconds, op_seconds = _line(*checkpoint_extra)
    if cold_region_seconds is None:
        cold_region_seconds = measure_cold_region_seconds(device, rounds)
    # The per-op part is the warm one (the model's region refits it); the per-call part cold, at
    # least the warm one (noise cannot make emptied caches faster).
    region_seconds = max(warm_region_seconds, cold_region_seconds or 0.0)
    policy_region, policy_op = {}, {}
    for name in policy_contexts:
        intercept, slope = _line(extra(short, f"policy:{name}", "checkpoint"), extra(long, f"policy:{name}", "checkpoint"))
        # Each op passes the policy's dispatch mode twice: in the forward and in the recomputation.
        policy_region[name], policy_op[name] = intercept, slope / 2
    return CheckpointCosts(str(device), region_seconds, op_seconds, policy_region, policy_op,
                           warm_region_seconds=warm_region_seconds)


def measure_cold_region_seconds(device: torch.device | str = "cpu", rounds: int = ROUNDS) -> float | None:
    """Seconds the checkpoint itself adds per call from cold caches (the module docstring): the
    synthetic chain's per-call part, stepped with the host's caches emptied before its forward and
    between its forward and its backward. None where the emptying buffer cannot be had."""
    device = torch.device(device)
    evictor = cache_evictor()
    if evictor is None:
        return None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), one_cpu_thread(device):
        cold = _cold_least_times(device, evictor, rounds)
    return _line(*[cold[(n, "checkpoint")] - cold[(n, "plain")] - cold[(n, "no_grad")] for n in CHAIN_LENGTHS])[0]


# -- the model's own region --------------------------------------------------------------------------
# The synthetic region prices the checkpoint's machinery per op of a tiny chain. A model's ops carry
# more: a transformer block's eager forward dispatches about twice the ops of its traced graph
# (views, detaches), each through the policy's dispatch mode with more arguments to walk, and its
# Python forward runs again. Measured on the benchmark GPT-2's block (one CPU thread): the synthetic
# rates explain a fifth of what "@matmuls" costs beyond its ops. So the rates are fitted to one of
# the model's own regions, the synthetic figures kept as their floor and for the per-call part.
#
# What a variant adds beyond its ops is a few percent of the region's step (nanoGPT's block: 1-7 ms
# of a 70 ms step), so the fit is a small difference of large times. Fitted from each variant's least
# over 4 rounds, four calibrations of nanoGPT's block in a row (load 4-6) gave 44-87 us per op
# recomputed and 32-75 us per op per pass under `projections`, and every plan of a model moves with
# its calibration (docs/benchmarks/clock.md: four of 2026-11-27's five misses beyond 3 points had
# their model's other plans off on the same side). So each round is fitted on its own (the variant's time less the plain step and
# the forward of the same round: paired, a load that shifts a round shifts all its variants) and the
# median over the rounds is taken; and the four policies, which differ only in the policy function
# the same dispatch mode calls, are fitted together as one factor on their synthetic rates.

# A small region's residual is as noisy against its step as a large one's, and its rounds are cheap:
# up to 16 of them within the time limit. The residual MLP's block (a round 0.29 s) fitted 6-93 us
# per op recomputed over four calibrations of 8 rounds, 57-86 over four of 32 (load 0-1); a
# transformer block's round (0.6 s) stops at the time limit as before.
REGION_ROUNDS = 16
REGION_SECONDS = 5.0  # no round is started after this many seconds of the wall clock (one at least)


@dataclass(frozen=True)
class RegionShape:
    """What the cost model counts of one region under one variant (plain or a policy):
    ``forward_ops`` in its forward, ``pass_ops`` its recomputation passes (up to PyTorch's early
    stop, the policy's cached ones included), ``recomputed_ops`` of those run again, their share
    of the forward's seconds (``recomputed_share``), and the forward's ops' seconds
    (``forward_seconds``), by the profile's op costs."""

    forward_ops: int
    pass_ops: int
    recomputed_ops: int
    recomputed_share: float
    forward_seconds: float = 0.0


class _Captured(Exception):
    """Raised by the capturing hook: the forward need not go past the region."""


def capture_region_inputs(model: torch.nn.Module, path: str, example_inputs) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` the submodule at ``path`` is called with in ``model``'s forward on
    ``example_inputs`` (its first call), detached, each keeping whether it required grad. The
    forward stops at that call; the random state and buffers are left as they were."""
    args, kwargs = normalise_inputs(example_inputs)
    module = model.get_submodule(path)
    found: list = []

    def hook(_module, hook_args, hook_kwargs):
        def keep(value):
            if isinstance(value, torch.Tensor):
                return value.detach().requires_grad_(value.requires_grad and value.is_floating_point())
            return value
        found.append(pytree.tree_map(keep, (tuple(hook_args), dict(hook_kwargs))))
        raise _Captured

    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with preserved_state(model, cuda_devices([*model.parameters(), *tensors])):
            model(*args, **kwargs)
    except _Captured:
        pass
    finally:
        handle.remove()
    if not found:
        raise ValueError(f"module {path!r} is not called in the forward")
    return found[0]


def _backward_of_outputs(output) -> None:
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if leaves:
        sum(t.float().sum() for t in leaves).backward()


def measure_region_steps(module: torch.nn.Module, args: tuple, kwargs: dict,
                         policy_contexts: Mapping[str, Callable[[], Callable]] | None = None,
                         rounds: int = REGION_ROUNDS, time_limit: float = REGION_SECONDS) -> dict[str, list[float]]:
    """Seconds of one forward and backward of ``module`` on ``(args, kwargs)``, one per timed round
    (every variant has as many, round ``i`` at index ``i``): ``"plain"``,
    ``"forward"`` (the forward alone, recording autograd, as a recomputation runs it), ``"checkpoint"`` (non-reentrant, generator states preserved) and ``"policy:<name>"`` under each
    of ``policy_contexts`` (as :func:`measure_checkpoint_costs`). Every variant stepped in turn in
    each round, after one untimed round, on one CPU thread (:func:`one_cpu_thread`); no round
    starts after ``time_limit`` seconds once one has been timed. Gradients, buffers and the random
    state are restored."""
    policy_contexts = dict(policy_contexts or {})
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    devices = cuda_devices([*module.parameters(), *tensors])
    sync = torch.cuda.synchronize if devices else (lambda: None)
    clock = _clock_for(torch.device("cuda" if devices else "cpu"))

    def call(*call_args, **call_kwargs):
        return module(*call_args, **call_kwargs)

    def prepare(variant: str):
        name = variant.partition(":")[2]
        context = {"context_fn": policy_contexts[name]()} if name else {}

        def step():
            if variant == "forward":
                module(*args, **kwargs)
                return
            if variant == "plain":
                output = module(*args, **kwargs)
            else:
                output = torch_checkpoint.checkpoint(call, *args, use_reentrant=False, preserve_rng_state=True,
                                                     **context, **kwargs)
            _backward_of_outputs(output)
        return step

    variants = ["plain", "forward", "checkpoint", *(f"policy:{name}" for name in policy_contexts)]
    grads = [(p, p.grad) for p in module.parameters()]
    timed: dict[str, list[float]] = {variant: [] for variant in variants}
    started = time.perf_counter()
    device = torch.device("cuda" if devices else "cpu")
    try:
        with preserved_state(module, devices), one_cpu_thread(device):
            for round_number in range(rounds + 1):
                if round_number > 1 and time.perf_counter() - started > time_limit:
                    break
                for variant in variants:
                    step = prepare(variant)
                    seconds = _timed(step, sync, clock)
                    for p, _ in grads:
                        p.grad = None
                    if round_number:
                        timed[variant].append(seconds)
    finally:
        for p, grad in grads:
            p.grad = grad
        for t in tensors:
            t.grad = None
    return timed


def fit_to_region(synthetic: CheckpointCosts, steps: Mapping[str, Sequence[float]], shapes: Mapping[str, RegionShape],
                  source: str, rescale: bool = True) -> CheckpointCosts:
    """``synthetic`` with its per-op rates raised to what one region of the model measured
    (``steps``: :func:`measure_region_steps`, seconds per round; ``shapes``: the cost model's counts
    of that region under the same variants). What a variant's step adds over the plain one of the
    same round, less the recomputed ops (that round's forward's share of them) and the per-call
    parts, is its residual; the median over the rounds is fitted. The plain checkpoint's residual is
    spread over the ops it recomputes. The policies' residuals (beyond the plain checkpoint's rate)
    are fitted together, as one factor on the synthetic per-op rates over the ops of their two passes
    (the forward and the recomputation): the policies share their dispatch mode and differ by their
    policy function, whose relative cost the synthetic chain measures without the model's noise. A
    rate the measurement puts below the synthetic one keeps the synthetic one.

    Last, every figure is put on the profile's scale: times the profile's seconds of the region's
    forward over its measured forward (median). The profile times each op by the wall clock, which
    another process's load stretches (a 6-layer GPT-2 profiled at load 12 on 2 cores summed to
    906 ms, its eager step took 311 ms of CPU), and its plans are chosen, and their overhead
    predicted, by ratios to those op costs: a checkpoint's cost must be in the same seconds.
    ``rescale=False`` where the region was stepped with fewer threads than the profile's ops ran on
    (a CPU profile with several threads): its forward is slower than the profile's, its Python
    overhead is not."""
    plain = shapes["checkpoint"]
    rounds = range(len(steps["plain"]))

    def residual(variant: str, shape: RegionShape, known: float) -> list[float]:
        """Per round: what ``variant`` adds over the plain step beyond its recomputed ops and ``known``."""
        return [steps[variant][i] - steps["plain"][i] - steps["forward"][i] * shape.recomputed_share - known
                for i in rounds]

    # The region was stepped back to back: the per-call part it paid is the warm one.
    warm_region = synthetic.back_to_back_region_seconds
    checkpoint_residual = statistics.median(residual("checkpoint", plain, warm_region))
    op_rate = max(synthetic.recomputed_op_seconds, checkpoint_residual / max(plain.recomputed_ops, 1))
    fitted = [name for name in synthetic.policy_op_seconds if f"policy:{name}" in steps and f"policy:{name}" in shapes]
    factor = 1.0
    if fitted:
        per_round = [0.0 for _ in rounds]
        synthetic_seconds = 0.0  # what the synthetic rates predict over the fitted policies' passes
        for name in fitted:
            shape = shapes[f"policy:{name}"]
            known = (warm_region + op_rate * shape.recomputed_ops
                     + synthetic.policy_region_seconds.get(name, 0.0))
            per_round = [a + b for a, b in zip(per_round, residual(f"policy:{name}", shape, known))]
            synthetic_seconds += synthetic.policy_op_seconds[name] * (shape.forward_ops + shape.pass_ops)
        if synthetic_seconds > 0:
            factor = max(1.0, statistics.median(per_round) / synthetic_seconds)
    policy_rates = {name: seconds * (factor if name in fitted else 1.0)
                    for name, seconds in synthetic.policy_op_seconds.items()}
    forward = statistics.median(steps["forward"])
    scale = plain.forward_seconds / forward if rescale and plain.forward_seconds > 0 and forward > 0 else 1.0
    return CheckpointCosts(synthetic.device, synthetic.region_seconds * scale, op_rate * scale,
                           {name: seconds * scale for name, seconds in synthetic.policy_region_seconds.items()},
                           {name: seconds * scale for name, seconds in policy_rates.items()}, source, scale,
                           warm_region * scale)


__all__ = ["CHAIN_LENGTHS", "CheckpointCosts", "RegionShape", "capture_region_inputs", "fit_to_region",
           "measure_checkpoint_costs", "measure_cold_region_seconds", "measure_region_steps", "one_cpu_thread"]
