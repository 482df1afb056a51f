"""Stacked recurrent networks as stages: each layer of an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` a
module of its own, so that the native executor can checkpoint them one at a time.

A stacked RNN is one module called once: checkpointing it recomputes every layer at once in the
backward and buys almost nothing (docs/zoo.md, "Recurrent networks"). :func:`install_rnn_stages`
gives each stacked RNN of a model a *stage form* of its forward, in place:

- ``rnn.stages``, a parameter-free :class:`RNNStages` whose children ``"0"``, ``"1"``... are the
  layers (:class:`RNNLayerStage`), is registered on the RNN (the parameters stay where they are:
  ``state_dict`` keys, ``named_parameters`` and the optimizer's view of the model are unchanged);
- the RNN's instance attribute ``forward`` becomes a :class:`StagedForward` (picklable and
  deep-copyable, as runtime/native.py's forwards are), which calls the stages in order, each with
  its own layer's weights and hidden state.

Each stage calls the same aten kernel as the stacked module (``_VF.lstm`` / ``_VF.gru`` /
``_VF.rnn_*`` with ``num_layers=1``) on the same tensors in the same layout (time-major, as the
stacked kernel transposes a ``batch_first`` input once), and every layer but the last then applies
the inter-layer dropout (``torch.dropout``, the ``at::dropout`` the stacked kernel calls between
layers, drawing from the generator in the same order): outputs and gradients are the stacked
module's, bit for bit (tests/test_rnn_stages.py). The dropout is the stage's last op, not the next
stage's first: oneDNN's LSTM layer is one op whose results are the output *and* its workspace (the
gates of every step, about 16 times the output on the zoo's LSTM), and the cost model holds all of an op's
results while anything outside a checkpointed region reads one of them; the next stage reading the
dropout's output leaves the workspace to the checkpoint, as eager does. (The last layer's kernel
output still leaves its stage: a plan checkpointing the last stage is predicted no lower than one
that does not, which is also what it measures.)

Time chunks (``time_chunks=K``, opt-in): each layer stage runs its sequence as ``K`` chunk stages,
its children (``rnn.stages_t4.2.1``: layer 2, chunk 1 of 4), the hidden state carried from one to
the next; the dropout is applied to the whole layer output after the chunks, so its masks are still
the stacked module's. The kernel then runs on pieces of the sequence: results and gradients differ
from the stacked module's by rounding (benchmarks/rnn_checkpointing.py reports the difference). Not
for bidirectional RNNs, whose reverse direction runs the sequence backwards, nor packed sequences.
Use: ``install_rnn_stages(model, time_chunks=4)``, then ``planner.profile_for`` and
``planner.plan(..., profile=...)`` (``plan`` itself profiles the per-layer stages).

Because the stages are ordinary child modules called once each, the profiler tags their ops by
their paths, solvers/regions/ makes them candidate regions, and runtime/native.py checkpoints them
as any module: a plan's region ``"rnn.stages.2"`` is layer 2. ``planner.plan`` installs the stages
before profiling; :func:`runtime.native.apply_native` installs them on the RNNs its regions name a
stage of, and :func:`runtime.native.remove_native` removes them (:func:`remove_rnn_stages`): the RNN's
class forward runs again.

Packed sequences run through the stages too (per layer; the kernel's packed form). Not staged: RNN
subclasses that override ``forward`` (their forward is the user's), one-layer RNNs without time
chunks (one stage is the RNN itself), and RNNs on CUDA (cuDNN's stacked kernel draws the
inter-layer dropout inside the kernel, from its own state, so per-layer calls would draw other
masks; not measured either): :func:`install_for_regions` refuses to stage those a plan names.
"""

from __future__ import annotations

import contextlib
import re

import torch
from torch import _VF, nn
from torch._subclasses.fake_tensor import is_fake
from torch.nn.utils.rnn import PackedSequence

STAGES = "stages"
_CONTAINER = re.compile(r"^stages(?:_t(?P<chunks>\d+))?$")
_KERNELS = {"LSTM": _VF.lstm, "GRU": _VF.gru, "RNN_TANH": _VF.rnn_tanh, "RNN_RELU": _VF.rnn_relu}


def container_name(time_chunks: int = 1) -> str:
    """The name of the stage list on the RNN: ``stages``, or ``stages_t<K>`` with ``K`` time chunks."""
    return STAGES if time_chunks <= 1 else f"{STAGES}_t{time_chunks}"


def _run_kernel(mode: str, input, hx, weights, batch_sizes, bias: bool, train: bool, bidirectional: bool):
    """One layer of the stacked kernel: ``(output, h)`` or, for an LSTM, ``(output, h, c)``."""
    kernel = _KERNELS[mode]
    if batch_sizes is None:
        return kernel(input, hx, weights, bias, 1, 0.0, train, bidirectional, False)
    return kernel(input, batch_sizes, hx, weights, bias, 1, 0.0, train, bidirectional)


class RNNChunkStage(nn.Module):
    """Chunk ``chunk`` of ``chunks`` of one layer's time steps (a child of :class:`RNNLayerStage`)."""

    def __init__(self, mode: str, layer: int, chunk: int, chunks: int):
        super().__init__()
        self.mode, self.layer, self.chunk, self.chunks = mode, layer, chunk, chunks

    def extra_repr(self) -> str:
        return f"{self.mode} layer {self.layer}, time chunk {self.chunk} of {self.chunks}"

    def forward(self, input, hx, weights, bias: bool, train: bool):
        return _run_kernel(self.mode, input, hx, weights, None, bias, train, False)


class RNNLayerStage(nn.Module):
    """Layer ``layer`` of a stacked RNN, parameter-free: called with that layer's weights and hidden
    state; returns ``(output, h)`` or, for an LSTM, ``(output, h, c)``. Every layer but the last
    applies the inter-layer dropout to its output, as the stacked kernel does. With time chunks its
    children ``"0"``, ``"1"``... (:class:`RNNChunkStage`) run the chunks."""

    def __init__(self, mode: str, layer: int, last: bool, time_chunks: int = 1):
        super().__init__()
        self.mode, self.layer, self.last = mode, layer, last
        if time_chunks > 1:
            for k in range(time_chunks):
                self.add_module(str(k), RNNChunkStage(mode, layer, k, time_chunks))

    def extra_repr(self) -> str:
        return f"{self.mode} layer {self.layer}"

    def forward(self, input, hx, weights, dropout: float, bias: bool, train: bool, bidirectional: bool,
                batch_sizes=None):
        chunks = list(self._modules.values())
        if not chunks:
            output, *state = _run_kernel(self.mode, input, hx, weights, batch_sizes, bias, train, bidirectional)
        else:
            outputs = []
            # One split (its backward concatenates the chunks' gradients), not K slices (each slice's
            # backward scatters into a zero tensor of the whole input's size).
            steps, count = input.shape[0], len(chunks)
            sizes = [steps // count + (k < steps % count) for k in range(count)]
            for stage, piece in zip(chunks, torch.split(input, sizes, dim=0)):
                if piece.shape[0] == 0:  # a sequence shorter than the number of chunks
                    continue
                output, *state = stage(piece, hx, weights, bias, train)
                hx = tuple(state) if len(state) == 2 else state[0]
                outputs.append(output)
            output = torch.cat(outputs, 0)
        if not self.last and dropout and train:
            output = torch.dropout(output, dropout, True)
        return (output, *state)


class RNNStages(nn.Module):
    """A stacked RNN's layers, children ``"0"``, ``"1"``... (:class:`RNNLayerStage`), run in order on
    a time-major input (or a packed sequence's data): returns the last layer's output and each
    layer's final states, concatenated. A module, not an ``nn.ModuleList``, so that every module path
    a plan may name is one that is called (a region ``"rnn.stages"`` checkpoints every layer as one)."""

    def __init__(self, mode: str, num_layers: int, time_chunks: int = 1):
        super().__init__()
        self.mode = mode
        for layer in range(num_layers):
            self.add_module(str(layer), RNNLayerStage(mode, layer, layer == num_layers - 1, time_chunks))

    def forward(self, input, hx, weights, dropout: float, bias: bool, train: bool, bidirectional: bool,
                batch_sizes=None):
        lstm = self.mode == "LSTM"
        directions = 2 if bidirectional else 1
        layers = list(self._modules.values())
        per_layer = len(weights) // len(layers)
        finals: list[list[torch.Tensor]] = [[], []]
        for layer, stage in enumerate(layers):
            rows = slice(layer * directions, (layer + 1) * directions)
            state = (hx[0][rows], hx[1][rows]) if lstm else hx[rows]
            input, *out = stage(input, state, weights[layer * per_layer:(layer + 1) * per_layer], dropout, bias,
                                train, bidirectional, batch_sizes)
            for kept, tensor in zip(finals, out):
                kept.append(tensor)
        if lstm:
            return input, torch.cat(finals[0], 0), torch.cat(finals[1], 0)
        return input, torch.cat(finals[0], 0)


def _stageable(module: nn.Module) -> str | None:
    """Why ``module`` gets no stages (None: it does)."""
    if not isinstance(module, nn.RNNBase):
        return "not an RNN"
    if type(module).forward not in (nn.LSTM.forward, nn.GRU.forward, nn.RNN.forward):
        return f"{type(module).__name__} overrides forward"
    if module.mode not in _KERNELS:
        return f"mode {module.mode!r}"
    devices = sorted({p.device.type for p in module.parameters()} - {"cpu"})
    if devices:
        # cuDNN's stacked kernel draws the inter-layer dropout inside the kernel, from its own state,
        # which per-layer calls cannot reproduce; and no stage form was measured there.
        return f"its parameters are on {devices[0]}: stages are made for CPU RNNs only"
    return None


def install_rnn_stages(model: nn.Module, time_chunks: int = 1, paths=None) -> list[str]:
    """Give every stacked RNN of ``model`` (or those at ``paths``) its stage form, in place; return
    their paths. ``time_chunks > 1`` also splits each layer's sequence in that many chunk stages
    (results differ from the stacked module's by rounding; refused for bidirectional RNNs). An RNN
    already staged the same way is left as it is; staged another way, its stages are replaced.
    Without time chunks, one-layer RNNs are not staged (their one stage would be the RNN)."""
    if isinstance(time_chunks, bool) or not isinstance(time_chunks, int) or time_chunks < 1:
        raise ValueError(f"time_chunks={time_chunks!r}: a whole number >= 1")
    name = container_name(time_chunks)
    installed = []
    targets = model.named_modules() if paths is None else [(p, model.get_submodule(p)) for p in paths]
    for path, rnn in list(targets):
        if _stageable(rnn) is not None:
            if paths is not None:
                raise ValueError(f"{path!r} cannot be run as stages: {_stageable(rnn)}")
            continue
        if time_chunks == 1 and rnn.num_layers < 2:
            continue
        if time_chunks > 1 and rnn.bidirectional:
            raise ValueError(f"{path or 'the model'!r} is bidirectional: its reverse direction runs the sequence "
                             "backwards, so it cannot be cut in time chunks carried forwards; use time_chunks=1 "
                             "(one stage per layer, both directions in it)")
        current = staged_as(rnn)
        if current == name:
            installed.append(path)
            continue
        if current is not None:
            _uninstall(rnn)
        if hasattr(rnn, name):
            raise ValueError(f"{path or 'the model'!r} already has an attribute {name!r}: its stages cannot be "
                             "registered")
        rnn.add_module(name, RNNStages(rnn.mode, rnn.num_layers, time_chunks))
        rnn.__dict__["forward"] = StagedForward(rnn, name)
        installed.append(path)
    return installed


def staged_as(rnn: nn.Module) -> str | None:
    """The name of ``rnn``'s stage list when it runs as stages, else None."""
    forward = rnn.__dict__.get("forward")
    return forward.name if isinstance(forward, StagedForward) else None


def _uninstall(rnn: nn.Module) -> None:
    forward = rnn.__dict__.pop("forward")
    rnn._modules.pop(forward.name, None)


def remove_rnn_stages(model: nn.Module) -> nn.Module:
    """Undo :func:`install_rnn_stages`: every RNN runs its class forward again, its stages gone."""
    for module in list(model.modules()):
        if staged_as(module) is not None:
            _uninstall(module)
    return model


@contextlib.contextmanager
def staged_for_trace(model: nn.Module):
    """Stacked RNNs as stages while the block runs (the trace a native plan is searched on), undone
    after; a model staged already (time chunks, opted in by the user) is traced as it is and kept."""
    installed = [] if stage_paths(model) else install_rnn_stages(model)
    try:
        yield model
    finally:
        if installed:
            remove_rnn_stages(model)  # apply_native installs them again for regions that name a stage


def stage_paths(model: nn.Module) -> list[str]:
    """The stage modules' paths in ``model`` (layers and time chunks)."""
    return [path for path, module in model.named_modules() if isinstance(module, (RNNLayerStage, RNNChunkStage))]


def install_for_regions(model: nn.Module, regions) -> list[str]:
    """Stage the RNNs that ``regions`` (a native plan's, ``"rnn.stages.2"``, ``"rnn.stages_t4.1.chunks.0"``)
    name a stage of, the way the names say; return their paths. Regions naming no stage: nothing."""
    wanted: dict[str, int] = {}
    modules = dict(model.named_modules())
    for region in regions:
        path = region.partition("@")[0]
        path = re.sub(r"\[\d+:\d+\]$", "", path)
        parts = path.split(".")
        for i, part in enumerate(parts):
            match = _CONTAINER.match(part)
            owner = ".".join(parts[:i])
            if match and isinstance(modules.get(owner), nn.RNNBase):
                chunks = int(match["chunks"] or 1)
                if wanted.setdefault(owner, chunks) != chunks:
                    raise ValueError(f"the regions name stages of {owner!r} with {wanted[owner]} and {chunks} time "
                                     "chunks: this plan was not made by the planner")
                break
    for path, chunks in wanted.items():
        try:
            install_rnn_stages(model, chunks, paths=[path])
        except ValueError as error:
            from .module import PlanMismatch

            raise PlanMismatch(f"the plan checkpoints layers of {path!r} as stages (runtime/rnn.py), which this "
                               f"model cannot run: {error}") from None
    return list(wanted)


def left_whole(rnn: nn.RNNBase, input, hx):
    """``rnn``'s class forward, the RNN run whole. Only hands the call on: profiler/capture.py counts
    it among the drivers, so that what the tracer raises below it is the tracer's failure (the
    model then gets the planner's answer for a model it cannot trace), not a bug of ours."""
    return type(rnn).forward(rnn, input, hx)


class StagedForward:
    """An RNN's ``forward`` run as its stages (``rnn.<name>``), each layer one call: the class
    forward's argument handling (unbatched inputs, default zero states, packed sequences, its
    checks), then the layers. Stored as the RNN's instance attribute ``forward``; a plain object so
    that ``deepcopy`` and ``torch.save`` copy it with the model."""

    def __init__(self, module: nn.RNNBase, name: str = STAGES):
        self.module = module
        self.name = name

    def __call__(self, input, hx=None):
        rnn = self.module
        packed = isinstance(input, PackedSequence)
        if packed and self.name != STAGES:
            raise ValueError("an RNN staged in time chunks takes padded tensors, not a PackedSequence: "
                             "plan without time chunks for packed sequences")
        update = getattr(rnn, "_update_flat_weights", None)
        if update is not None:
            update()
        if packed and is_fake(input.batch_sizes):
            # Traced with fake tensors, a packed batch's sizes are data (made from the lengths the
            # model was given): each layer's size would be a guard on data (GuardOnDataDependentSymNode).
            # The RNN is left whole: its class forward, as the model wrote it.
            return left_whole(rnn, input, hx)
        if packed:
            return _run_packed(rnn, self.name, input, hx)
        return _run_padded(rnn, self.name, input, hx)


def _run_packed(rnn: nn.RNNBase, name: str, input: PackedSequence, hx):
    """The stages on a packed sequence's data, left whole (the kernel's packed form, per layer);
    returns a PackedSequence and the final states in the caller's batch order, as the class forward."""
    data, batch_sizes, sorted_indices, unsorted_indices = input
    hx = _zero_states(rnn, data, int(batch_sizes[0])) if hx is None else \
        _given_states(rnn, hx, True, sorted_indices)
    rnn.check_forward_args(data, hx, batch_sizes)
    x, hidden = _run_stages(rnn, name, data, hx, batch_sizes)
    return PackedSequence(x, batch_sizes, sorted_indices, unsorted_indices), rnn.permute_hidden(hidden, unsorted_indices)


def _run_padded(rnn: nn.RNNBase, name: str, input: torch.Tensor, hx):
    """The stages on a padded (batched 3-D or unbatched 2-D) input, time-major inside as the stacked
    kernel runs it; returns the output and final states in the caller's layout."""
    if input.dim() not in (2, 3):
        raise ValueError(f"{type(rnn).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
    is_batched = input.dim() == 3
    if not is_batched:
        input = input.unsqueeze(0 if rnn.batch_first else 1)
    batch = input.size(0) if rnn.batch_first else input.size(1)
    hx = _zero_states(rnn, input, batch) if hx is None else _given_states(rnn, hx, is_batched, None)
    rnn.check_forward_args(input, hx, None)
    x = input.transpose(0, 1) if rnn.batch_first else input
    x, hidden = _run_stages(rnn, name, x, hx, None)
    output = x.transpose(0, 1) if rnn.batch_first else x
    if not is_batched:
        output = output.squeeze(0 if rnn.batch_first else 1)
        hidden = tuple(s.squeeze(1) for s in hidden) if rnn.mode == "LSTM" else hidden.squeeze(1)
    return output, rnn.permute_hidden(hidden, None)


def _zero_states(rnn: nn.RNNBase, data: torch.Tensor, batch: int):
    """The class forward's default initial states: zeros, ``(h, c)`` for an LSTM (``h`` of the
    projection's size when it has one), else ``h``."""
    # The sizes as separate arguments, as nn.LSTM passes them: a packed batch's size is a tensor.
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    hidden_size = rnn.proj_size if rnn.proj_size > 0 else rnn.hidden_size
    h = torch.zeros(layers, batch, hidden_size, dtype=data.dtype, device=data.device)
    if rnn.mode != "LSTM":
        return h
    return h, torch.zeros(layers, batch, rnn.hidden_size, dtype=data.dtype, device=data.device)


def _given_states(rnn: nn.RNNBase, hx, is_batched: bool, sorted_indices):
    """The caller's initial states checked (the class forward's error), batched and in the packed
    batch's sorted order."""
    lstm = rnn.mode == "LSTM"
    states = hx if lstm else (hx,)
    want = 3 if is_batched else 2
    if any(s.dim() != want for s in states):
        raise RuntimeError(f"For {'batched 3-D' if is_batched else 'unbatched 2-D'} input, hx should also be "
                           f"{want}-D but got {', '.join(f'{s.dim()}-D' for s in states)} tensors")
    if not is_batched:
        hx = tuple(s.unsqueeze(1) for s in hx) if lstm else hx.unsqueeze(1)
    return rnn.permute_hidden(hx, sorted_indices)


def _run_stages(rnn: nn.RNNBase, name: str, x: torch.Tensor, hx, batch_sizes):
    """The layers in order on a time-major input (or packed data): ``(output, h)`` or, for an LSTM,
    ``(output, (h, c))``, the states concatenated over the layers."""
    x, *hidden = rnn._modules[name](x, hx, rnn._flat_weights, rnn.dropout, rnn.bias, rnn.training,
                                    rnn.bidirectional, batch_sizes)
    return x, (tuple(hidden) if rnn.mode == "LSTM" else hidden[0])


__all__ = ["RNNChunkStage", "RNNLayerStage", "RNNStages", "STAGES", "StagedForward", "container_name", "install_for_regions",
           "install_rnn_stages", "remove_rnn_stages", "stage_paths", "staged_as"]
