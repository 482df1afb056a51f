"""What a distributed wrapper changes in one rank's memory: DDP's buckets, per-block FSDP2's shards,
gathered units and collective buffers, counted against the unsharded step a native plan profiles
(docs/native.md, "Several processes"). :func:`fsdp2_bytes` is an upper bound, what the native search
counts; planner/fsdp2_timeline.py prices one plan's step exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.native import parse_region

DISTRIBUTED = ("ddp", "fsdp2")

# FSDP2 units whose parameters are gathered at once, at most (see fsdp2_bytes): the unit computing
# and the one its backward prefetches; one more while a checkpointed run of several units recomputes.
GATHERED_UNITS = 2


@dataclass(frozen=True)
class FSDP2:
    """Per-block FSDP2: ``torch.distributed.fsdp.fully_shard`` on each module of ``units`` (paths in
    the model), then on the root, over ``world_size`` ranks, with its default
    ``reshard_after_forward=True``. ``units=None``: the repeated blocks (:func:`repeated_blocks`);
    ``units=()``: ``fully_shard`` on the root alone, whose parameters stay gathered all step.
    ``distributed="fsdp2"`` is ``FSDP2(world_size=<the initialised process group's>)``."""

    world_size: int
    units: tuple[str, ...] | None = None

    def __post_init__(self):
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"FSDP2(world_size={self.world_size!r}): a whole number of ranks >= 1")
        if self.units is not None and (isinstance(self.units, str)
                                       or not all(isinstance(u, str) for u in self.units)):
            raise ValueError(f"FSDP2(units={self.units!r}): a tuple of module paths, such as ('layers.0', 'layers.1')")


def distributed_problem(distributed) -> str | None:
    """Why ``distributed`` (``plan(..., distributed=)``) is not accepted, or None when it is."""
    if distributed is None or distributed in DISTRIBUTED or isinstance(distributed, FSDP2):
        return None
    return (f"distributed={distributed!r} is not accounted for; accepted: None, "
            + ", ".join(repr(d) for d in DISTRIBUTED) + " or planner.native.FSDP2(world_size, units)")


def repeated_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """Paths of the modules per-block sharding conventionally makes FSDP2 units: the children of
    every ``nn.ModuleList`` or ``nn.Sequential`` whose class occurs at least twice among their
    siblings and that hold parameters (a transformer's layers, a residual network's blocks)."""
    found = []
    for path, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(container.named_children())
        classes = [type(child) for _, child in children]
        for name, child in children:
            if classes.count(type(child)) >= 2 and any(True for _ in child.parameters()):
                found.append(f"{path}.{name}" if path else name)
    return tuple(found)


def shard_bytes(p: torch.Tensor, world: int) -> int:
    """One rank's shard of ``p`` as FSDP2 stores it: dim 0 split in ``world`` chunks, each padded to
    the largest (``ceil(dim0 / world)`` rows; a 0-d tensor is one row)."""
    rows = p.shape[0] if p.dim() else 1
    return -(-rows // world) * (p.numel() // max(rows, 1)) * p.element_size()


def resolve_fsdp2(model: torch.nn.Module, distributed) -> FSDP2:
    if isinstance(distributed, FSDP2):
        return distributed
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("distributed='fsdp2' takes the world size from the process group, which is not "
                         "initialised here: call torch.distributed.init_process_group first, or pass "
                         "planner.native.FSDP2(world_size=..., units=...)")
    return FSDP2(world_size=dist.get_world_size())


def _units_inside(region: str, units) -> int:
    """How many FSDP2 units a region's checkpoint runs whole (their forward hooks run again when it
    recomputes)."""
    path, segment, _ = parse_region(region)
    if segment is None:
        roots = [path]
    else:
        roots = [f"{path}.{i}" if path else str(i) for i in range(*segment)]
    return sum(1 for u in units if any(r == "" or u == r or u.startswith(r + ".") for r in roots))


def fsdp2_bytes(model: torch.nn.Module, spec: FSDP2, regions=()) -> int:
    """What per-block FSDP2 changes in one rank's step, in bytes, against the unsharded step the
    profile traced with ``regions`` checkpointed (negative where sharding saves more than gathering
    costs).

    The unsharded step holds every parameter whole and their gradients as the backward makes them.
    Under FSDP2 (torch/distributed/fsdp/_fully_shard; FSDPParamGroup's unshard, reshard,
    pre_backward's prefetch and foreach_reduce) one rank holds, besides the same activations:

    - each parameter's padded shard (:func:`shard_bytes`), for the whole step, in place of the
      whole parameter;
    - the parameters not in any unit (the root's group) gathered for the whole step: the root does
      not reshard after forward;
    - at most :data:`GATHERED_UNITS` units' gathered parameters at once (or as many as there are),
      each counted as the largest
      unit's (padded: ``world_size`` shards): after forward each unit reshards; the backward gathers
      the unit it runs and prefetches the one before (FSDP2's default prefetch); one more when a
      region holds several units, whose recomputation runs their forward hooks and gathers each
      again beside those two;
    - collective buffers, each counted as the largest group's (a unit's or the root's gathered
      parameters): an all-gather's output beside the parameters copied out of it and its input (one
      shard), and a reduce-scatter's flat input, which FSDP2 keeps until the next unit's
      reduce-scatter (``reduce_scatter_states``): the backward prefetches the unit before while the
      input of the unit after is still held (with two units or more; else one buffer at a time).

    Gradients: a unit's backward makes whole gradients, reduce-scatters them and keeps a shard. At
    any moment that is at most what the unsharded step holds (whole gradients of the same
    parameters), so the unsharded step's gradients, already in its figure, bound them. The sum is an
    upper bound, as loose as the gathered units' and the buffers' moments are apart."""
    world = spec.world_size
    units = repeated_blocks(model) if spec.units is None else tuple(spec.units)
    modules = dict(model.named_modules())
    missing = [u for u in units if u not in modules or u == ""]
    if missing:
        raise ValueError(f"FSDP2 units {missing} are not submodules of {type(model).__name__} "
                         "(paths as model.named_modules() gives them; the root is sharded last, not a unit)")
    owner: dict[int, str] = {}  # parameter -> the innermost unit holding it ("" for the root's group)
    for unit in sorted(units, key=lambda u: u.count(".")):  # outer first: inner units claim theirs after
        for p in modules[unit].parameters():
            owner[id(p)] = unit
    params = {id(p): p for p in model.parameters()}
    whole = sum(p.numel() * p.element_size() for p in params.values())
    shards = sum(shard_bytes(p, world) for p in params.values())
    gathered: dict[str, int] = {}
    for key, p in params.items():
        unit = owner.get(key, "")
        gathered[unit] = gathered.get(unit, 0) + world * shard_bytes(p, world)
    root = gathered.pop("", 0)
    largest = max(gathered.values(), default=0)
    spanning = any(_units_inside(region, units) > 1 for region in regions)
    at_once = min(GATHERED_UNITS + spanning, len(gathered))
    buffer = max(largest, root)
    # An all-gather beside a held reduce-scatter input needs two units; otherwise one buffer at a time.
    collectives = (2 if len(gathered) >= 2 else 1) * buffer + -(-buffer // world)
    return shards + root + at_once * largest + collectives - whole


def describe_distributed(model: torch.nn.Module, distributed) -> str | None:
    """``distributed`` as a plan records it: ``"ddp"``, or ``"fsdp2"`` with its world size and units."""
    if distributed is None or distributed == "ddp":
        return distributed
    spec = resolve_fsdp2(model, distributed)
    units = repeated_blocks(model) if spec.units is None else tuple(spec.units)
    shown = ", ".join(units[:4]) + (f" and {len(units) - 4} more" if len(units) > 4 else "")
    return f"fsdp2, {spec.world_size} ranks, units {shown or 'none (the root alone)'}"


def wrapper_bytes(model: torch.nn.Module, distributed, regions=()) -> int:
    """Bytes a distributed wrapper changes on each device against the step the profile traced.

    ``"ddp"``: DistributedDataParallel's gradient buckets, allocated when it wraps the model and
    held for good: one copy of the trainable parameters' gradients (its default,
    ``gradient_as_bucket_view=False``; with views the buckets are the gradients and this counts
    them twice, an over-estimate). ``"fsdp2"`` or an :class:`FSDP2`: :func:`fsdp2_bytes` with
    ``regions`` checkpointed, negative where sharding saves memory. None: nothing."""
    problem = distributed_problem(distributed)
    if problem:
        raise ValueError(problem)
    if distributed is None:
        return 0
    if distributed == "ddp":
        trainable = {id(p): p for p in model.parameters() if p.requires_grad}.values()
        return sum(p.numel() * p.element_size() for p in trainable)
    return fsdp2_bytes(model, resolve_fsdp2(model, distributed), regions)


def refuse_wrapped(model: torch.nn.Module) -> None:
    """A clear error for a model already wrapped by DDP or sharded by FSDP2: plan (and apply) first,
    then wrap. Sharded parameters are DTensors the profiler cannot run with plain inputs, and a plan
    made of the wrapper would name the wrapper's modules."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        raise ValueError("the model is wrapped in DistributedDataParallel: plan and apply the plan on the model "
                         "before wrapping it (ddp.module here), with distributed='ddp' to count the buckets")
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed
        return
    sharded = [path or type(model).__name__ for path, m in model.named_modules() if isinstance(m, FSDPModule)]
    if sharded:
        raise ValueError(f"{', '.join(sharded[:3])}{' and more' if len(sharded) > 3 else ''} already sharded by "
                         "fully_shard: plan and apply the plan on the unsharded model first (every rank builds it "
                         "the same way), then fully_shard each block and the root; pass distributed='fsdp2' to count "
                         "the sharding in the budget")
