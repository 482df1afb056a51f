"""Capture a training step as one functional aten graph: forward, then backward.

``make_fx`` traces ``forward + autograd.grad(outputs, params, grad_outputs=tangents)`` with fake
tensors, which works on models that ``torch.fx.symbolic_trace`` cannot follow (Hugging Face GPT-2
among them). A second trace through ``torch.func.functionalize`` turns every in-place op into its
out-of-place form, so that any op can be recomputed from its inputs; mutations of buffers
(BatchNorm statistics) remain only as ``copy_`` into the buffer at the end.

Every op is tagged with the module that issued it and its phase: forward ops by module hooks,
backward ops by pre-hooks on the autograd nodes, which know the module whose forward created them.
The grouping step uses these tags (profiler/grouping.py).

The gradients of the model's outputs (``tangents``) are inputs of the graph: the caller's loss
produces them. Which outputs get one is decided by running the planning loss once for real
(profiler/loss.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
# functional_call without calling the module: the root's own hooks stay out of the trace.
from torch.nn.utils.stateless import _reparametrize_module

from .blame import our_frame
from .containers import holds_tensors, register_output_containers
from .dropout import draw_in_place_masks_like_eager, drop_copies_into_fresh_tensors
from .errors import CaptureError, LossMismatch, TraceError, first_line
from .errors import ModelCallError as ModelCallError  # re-exported: profiler/__init__.py imports it from here
from .fusions import fuse_cross_entropy_backward
from .inputs import InputLayout, input_layout
from .lifetimes import AUTOGRAD_SEQ, ForwardLifetimes, tag_releases
from .loss import LossInfo, run_planning_loss
from .loss import default_loss as default_loss  # re-exported: the planner's default loss
from .rnn import DECOMPOSITIONS as RNN_DECOMPOSITIONS
from .state import cuda_devices, preserved_state
from .hf_masks import unpacked_positions_as_eager
from .transformer import masks_applied_as_given


# Device types whose autocast state a plan records (torch.autocast's device_type).
AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> str:
    """The ambient autocast state as text: ``"cpu:bfloat16"``, ``"cpu:bfloat16,cuda:float16"``, or
    ``""`` when autocast is off. A trace made under autocast contains its casts, so the state is
    part of what a plan was made for."""
    enabled = [d for d in AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
    return ",".join(f"{d}:{str(torch.get_autocast_dtype(d)).replace('torch.', '')}" for d in enabled)


@contextlib.contextmanager
def autocast_disabled():
    """Run a traced graph exactly as traced: its casts are already ops of the graph, and autocast
    applied again on top could cast an op's inputs a second time."""
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


# Roles of the graph's placeholders, in order.
PARAM, FROZEN, BUFFER, INPUT, TANGENT = "param", "frozen", "buffer", "input", "tangent"


@dataclass(frozen=True)
class Placeholder:
    role: str
    key: Any  # parameter/buffer name, input index or output index
    name: str  # the fx placeholder's name


@dataclass
class JointGraph:
    """The functional joint graph and what each of its inputs and outputs is.

    ``graph_module`` takes the placeholders in ``placeholders`` order and returns, flat: the model's
    tensor outputs, then parameter gradients (``grad_params``), then input gradients
    (``grad_inputs``). ``mutations`` pairs a mutated buffer/input placeholder with the node holding
    its new value.
    """

    graph_module: fx.GraphModule
    placeholders: list[Placeholder]
    model_outputs: list[str]  # fx node names of the model's tensor outputs
    grad_params: list[tuple[str, str]]  # (parameter name, fx node name of its gradient)
    grad_inputs: list[tuple[int, str]]  # (input index, fx node name)
    mutations: list[tuple[str, str]]  # (placeholder name, fx node name of the new value)
    layout: InputLayout
    output_spec: pytree.TreeSpec
    output_constants: dict[int, Any]  # non-tensor output leaves, by leaf position
    tensor_output_positions: list[int]
    output_requires_grad: list[bool]
    loss: LossInfo
    autocast: str = ""  # autocast_state() while tracing: the graph contains its casts
    # The cross-entropy backward recomputes the log-probabilities from the logits
    # (profiler/fusions.py: recompute_log_probs); the runtime must rewrite its trace the same way.
    log_probs_recomputed: bool = False


def _batch_norm_declaring_its_mutation(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm updates the running statistics in place without saying so in its schema,
    so functionalization would miss it. _native_batch_norm_legit runs the same kernel (same numbers,
    bit for bit) and declares the mutation, which functionalization turns into a copy_ into the
    buffer that the runtime applies once per step."""
    aten = torch.ops.aten
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training, momentum, eps)


_DECOMPOSITIONS = {torch.ops.aten.native_batch_norm.default: _batch_norm_declaring_its_mutation, **RNN_DECOMPOSITIONS}


class _ModuleTagger:
    """Tags each traced op with the module that issued it (forward) or whose backward it is."""

    def __init__(self, model: torch.nn.Module):
        self.names = {module: name for name, module in model.named_modules(remove_duplicate=False)}
        self.stack: list[str] = []
        self.starts: list[int] = []
        self.owner: dict[int, str] = {}  # autograd sequence number -> module name
        self.handles = []

    def _set(self, module: str, phase: str, autograd_node: int | None = None, autograd_seq: int | None = None) -> None:
        tags = {"module": module, "phase": phase}
        if autograd_node is not None:
            tags["autograd_node"] = autograd_node
        if autograd_seq is not None:  # the node's own number, which its forward op carries (profiler/lifetimes.py)
            tags[AUTOGRAD_SEQ] = autograd_seq
        fx_traceback.current_meta["custom"] = tags

    def _pre(self, module, args):
        self.stack.append(self.names.get(module, type(module).__name__))
        self.starts.append(torch.autograd._get_sequence_nr())
        self._set(self.stack[-1], "forward")

    def _post(self, module, args, output):
        first, last = self.starts.pop(), torch.autograd._get_sequence_nr()
        name = self.stack.pop()
        for seq in range(first, last):
            self.owner.setdefault(seq, name)  # inner modules finish first and claim first
        self._set(self.stack[-1] if self.stack else "", "forward")

    def __enter__(self):
        self.handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
            torch.nn.modules.module.register_module_forward_hook(self._post),
        ]
        self._set("", "forward")
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def tag_backward(self, roots) -> None:
        """Pre-hooks on every autograd node reachable from ``roots`` set the tag of its backward ops:
        the module, and the node's number (eager autograd holds a node's saved tensors and incoming
        gradients until the node's last op: solvers/regions/prediction.py, autograd_node_holds)."""
        seen, stack = set(), [r for r in roots if r is not None]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            module = self.owner.get(node._sequence_nr(), "")
            number, seq = len(seen), node._sequence_nr()

            def before(grad_outputs, module=module, number=number, seq=seq):
                self._set(module, "backward", number, seq)

            def after(grad_inputs, grad_outputs, module=module):
                # The engine releases the node's inputs and saved tensors here; what runs before the
                # next node (adding two gradients of one tensor) is nobody's.
                self._set(module, "backward")

            node.register_prehook(before)
            node.register_hook(after)
            stack.extend(fn for fn, _ in node.next_functions if fn is not None)
        self._set("", "backward")


def capture(
    model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None = None, loss: LossInfo | None = None,
    fuse_loss: bool = True, hold_activations: bool = True,
) -> tuple[JointGraph, list[torch.Tensor]]:
    """Trace the joint forward+backward graph of ``model`` on ``(args, kwargs)``.

    Runs ``loss_fn`` once eagerly to learn which outputs it differentiates; with ``loss`` (from a
    saved plan) that is known and nothing runs eagerly. ``model.forward`` is traced, not
    ``model(...)``: hooks on the root module are not part of the step, because the planned module
    runs them around its own forward. That keeps wrappers that work through root hooks (FSDP2's
    all-gather and reshard) out of the graph when a saved plan is traced inside them. Returns the
    graph and example tangents (the loss's real gradients, or zeros). The model, its buffers and the
    global RNG are left as they were.

    ``fuse_loss=False`` keeps the cross-entropy backward as eager autograd runs it (two ops, both
    logits-sized) instead of profiler/fusions.py's one op: for planning what eager PyTorch executes
    (the native executor).

    ``hold_activations=False`` runs the loss's eager forward without autograd (a memory-bounded
    profile: profiler/loss.py, ``run_planning_loss``).

    Raises :class:`ModelCallError` when the model or the loss raises eagerly, :class:`TraceError`
    when the tracer cannot follow the model, and any error raised inside the profiler's own code
    (profiler/blame.py) as it is.
    """
    register_output_containers()
    state = _StepState.of(model, args, kwargs)
    if loss is None:
        with preserved_state(model, cuda_devices([*state.trainable.values(), *state.frozen.values(), *state.inputs])):
            loss, tangents = run_planning_loss(model, args, kwargs, loss_fn or default_loss,
                                               hold_activations=hold_activations)
    else:
        tangents = [torch.zeros(s.shape, dtype=s.dtype, device=s.device) for s in loss.tangent_specs]
    step = _JointStep(model, state, loss)
    functional = _trace(step, [*state.flat(), *tangents])
    _simplify(functional, fuse_loss)
    return _joint_graph(functional, step), tangents


@dataclass(frozen=True)
class _StepState:
    """The tensors the step is traced on, in the graph's placeholder order: trainable parameters,
    frozen parameters, buffers, the inputs' tensors (the tangents follow them)."""

    trainable: dict[str, torch.Tensor]
    frozen: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]
    layout: InputLayout

    @classmethod
    def of(cls, model: torch.nn.Module, args: tuple, kwargs: dict) -> _StepState:
        layout = input_layout(args, kwargs)
        leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
        params = dict(model.named_parameters())
        return cls(
            trainable={n: p for n, p in params.items() if p.requires_grad},
            frozen={n: p for n, p in params.items() if not p.requires_grad},
            buffers=dict(model.named_buffers()),
            inputs=[leaves[i] for i in layout.tensor_positions],
            layout=layout,
        )

    @property
    def input_grad_indices(self) -> list[int]:
        """The inputs whose gradients the step computes (floating-point tensors requiring grad)."""
        return [i for i, t in enumerate(self.inputs) if t.requires_grad and t.is_floating_point()]

    def flat(self) -> list[torch.Tensor]:
        return [*self.trainable.values(), *self.frozen.values(), *self.buffers.values(), *self.inputs]

    def split(self, flat: tuple) -> tuple[list, ...]:
        """``flat`` (the placeholders' values, tangents last) as trainable, frozen, buffers, inputs, tangents."""
        chunks, offset = [], 0
        for count in (len(self.trainable), len(self.frozen), len(self.buffers), len(self.inputs)):
            chunks.append(list(flat[offset : offset + count]))
            offset += count
        return (*chunks, list(flat[offset:]))

    def roles(self, tangent_outputs: tuple[int, ...]) -> list[tuple[str, Any]]:
        """(role, key) of each placeholder, in order."""
        return (
            [(PARAM, n) for n in self.trainable]
            + [(FROZEN, n) for n in self.frozen]
            + [(BUFFER, n) for n in self.buffers]
            + [(INPUT, i) for i in range(len(self.inputs))]
            + [(TANGENT, i) for i in tangent_outputs]
        )


@dataclass
class _Learnt:
    """What tracing the step learns about the model's outputs and gradients."""

    spec: pytree.TreeSpec | None = None
    positions: list[int] = field(default_factory=list)  # leaf positions of the tensor outputs
    constants: dict[int, Any] = field(default_factory=dict)  # the other leaves, by position
    requires_grad: list[bool] = field(default_factory=list)  # of each tensor output
    present: list[bool] = field(default_factory=list)  # of each gradient target: a gradient is returned


class _JointStep:
    """The training step as one function of flat tensors, for ``make_fx``: the model's forward on
    the parameters, buffers and inputs given, then ``autograd.grad`` of the differentiated outputs
    with the tangents given. Returns the tensor outputs, then the gradients that exist."""

    def __init__(self, model: torch.nn.Module, state: _StepState, loss: LossInfo):
        self.model, self.state, self.loss = model, state, loss
        self.tagger = _ModuleTagger(model)
        self.learnt = _Learnt()
        self.lifetimes = ForwardLifetimes()

    def __call__(self, *flat):
        params, frozen, buffers, inputs, tangents = self.state.split(flat)
        names = (*self.state.trainable, *self.state.frozen, *self.state.buffers)
        call_args, call_kwargs = self.state.layout.unflatten(inputs)
        with _reparametrize_module(self.model, dict(zip(names, params + frozen + buffers)), tie_weights=True), \
                unpacked_positions_as_eager(self.model, call_args, call_kwargs):
            with self.lifetimes:
                output = self.model.forward(*call_args, **call_kwargs)
            self.lifetimes.finish()
        outputs = self._tensor_outputs(output)
        differentiated = [outputs[i] for i in _checked_tangent_outputs(self.loss, len(outputs))]
        self.tagger.tag_backward([t.grad_fn for t in differentiated])
        targets = params + [inputs[i] for i in self.state.input_grad_indices]
        grads = torch.autograd.grad(differentiated, targets, grad_outputs=tangents, allow_unused=True)
        self.learnt.present = [g is not None for g in grads]
        return (*outputs, *[g for g in grads if g is not None])

    def _tensor_outputs(self, output) -> list[torch.Tensor]:
        """The output's tensor leaves; its structure and other leaves go to ``learnt``."""
        leaves, self.learnt.spec = pytree.tree_flatten(output)
        self.learnt.positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.learnt.constants = {i: leaf for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor)}
        for leaf in self.learnt.constants.values():
            if holds_tensors(leaf):  # returned as traced, it would hand the caller fake tensors
                raise TraceError(
                    f"the model's output holds tensors inside a {type(leaf).__name__}, which the tracer cannot "
                    "see into (register it with torch.utils._pytree)",
                    reason=f"tensors inside a {type(leaf).__name__} output",
                )
        outputs = [leaves[i] for i in self.learnt.positions]
        self.learnt.requires_grad = [t.requires_grad for t in outputs]
        return outputs


def _checked_tangent_outputs(loss: LossInfo, outputs: int) -> tuple[int, ...]:
    """The outputs ``loss`` differentiates, checked against the number of tensor outputs: a saved
    plan's loss, for a model with fewer outputs, is a :class:`LossMismatch`, not a tracing failure."""
    unknown = [i for i in loss.tangent_outputs if i >= outputs]
    if unknown:
        raise LossMismatch(
            f"the plan's loss differentiates model output #{unknown[0]}, but this model returns "
            f"{outputs} tensor output(s): the plan was made for another model or loss; make a new plan")
    return loss.tangent_outputs


def _replay(graph_module: fx.GraphModule) -> Callable:
    """Run a traced graph op by op (keeping each op's tags), without recording autograd: the joint
    graph is already differentiated."""

    def run(*args):
        with torch.no_grad():
            return fx.Interpreter(graph_module).run(*args)

    return run


# Our functions that only hand the model to the tracer (profiler/blame.py): what raises below them
# in torch is the tracer's failure, not theirs.
_DRIVERS = frozenset({"_trace", "_JointStep.__call__", "_replay.<locals>.run", "left_whole"})  # runtime/rnn.py


def _trace(step: _JointStep, flat_inputs: list[torch.Tensor]) -> fx.GraphModule:
    """The step traced twice with fake tensors: as it runs (decompositions applied, ops tagged with
    their module and phase), then functionalized. A failure of the model or the tracer is a
    :class:`TraceError`; one raised by our own code is raised as it is, with a note saying where."""
    try:
        # Fake tensors' cache off: a cached call made outputs unlike a first call's (the storage of a
        # copy into a slice, 376 bytes or 384; one tensor or two for oneDNN LSTM's bias gradients),
        # so the same model traced to graphs with other sizes, and the runtime's trace refused the
        # plan made on the profiler's (different fingerprints).
        with fx_traceback.preserve_node_meta(), step.tagger, masks_applied_as_given(), \
                torch._dynamo.config.patch(fake_tensor_cache_enabled=False):
            traced = make_fx(step, tracing_mode="fake", decomposition_table=_DECOMPOSITIONS)(*flat_inputs)
            draw_in_place_masks_like_eager(traced)  # before functionalization rewrites bernoulli_
            tag_releases(traced, step.lifetimes)  # the second trace copies each node's tags
            with autocast_disabled():  # the first trace recorded autocast's casts; replay them as they are
                return make_fx(torch.func.functionalize(_replay(traced), remove="mutations"),
                               tracing_mode="fake")(*flat_inputs)
    except CaptureError:
        raise
    except Exception as error:
        where = our_frame(error, _DRIVERS)
        if where is not None:
            error.add_note(f"plan-checkpoints: raised in its own code ({where}) while tracing the model, "
                           "not by the model: a bug of plan-checkpoints")
            raise
        raise _trace_error(error) from error


def _trace_error(error: Exception) -> TraceError:
    """The tracer's failure, in one short line (its own messages are long)."""
    reason = first_line(error)
    reason = reason if len(reason) <= 160 else reason[:157] + "..."
    return TraceError(
        f"could not trace the model's training step ({reason}). "
        "The model's forward must be traceable by torch.fx.experimental.proxy_tensor.make_fx "
        "(no data-dependent Python control flow on tensor values).",
        reason=reason,
    )


def _simplify(functional: fx.GraphModule, fuse_loss: bool) -> None:
    """The rewrites after tracing, in place. The profiler measures, and the runtime runs, the
    rewritten graph: both capture through here."""
    if fuse_loss:
        fuse_cross_entropy_backward(functional)
    # Values nothing reads are computed by the eager step but need not be by ours: an nn.LSTM
    # stacks every layer's final states (h_n, c_n) at the end of its forward, and when the model
    # uses only the output sequence that stack held every layer's oneDNN workspace (profiler/rnn.py)
    # alive to the end of the forward, so that no layer could be recomputed (a 6-layer LSTM
    # language model's least budget was 84% of its peak). Random ops stay, dead or not: their
    # draws advance the generator, and later draws must be the eager step's.
    drop_copies_into_fresh_tensors(functional)
    functional.graph.eliminate_dead_code()
    functional.recompile()


def is_buffer_mutation(node: fx.Node) -> bool:
    """Whether ``node`` writes the new value of a buffer (or input) the step mutates:
    functionalization leaves each mutation as a ``copy_`` into its placeholder."""
    return node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder"


def _joint_graph(functional: fx.GraphModule, step: _JointStep) -> JointGraph:
    """Name what the traced graph's placeholders and outputs are (and detach its buffer mutations)."""
    graph, learnt = functional.graph, step.learnt
    roles = step.state.roles(step.loss.tangent_outputs)
    placeholder_nodes = [n for n in graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in graph.nodes if n.op == "output")
    returned = [a.name if isinstance(a, fx.Node) else None for a in pytree.tree_leaves(output_node.args[0])]
    outputs = len(learnt.positions)
    grad_params, grad_inputs = _gradients(returned[outputs:], step)
    return JointGraph(
        graph_module=functional,
        placeholders=[Placeholder(role, key, node.name) for (role, key), node in zip(roles, placeholder_nodes)],
        model_outputs=returned[:outputs],
        grad_params=grad_params,
        grad_inputs=grad_inputs,
        mutations=_detach_mutations(graph),
        layout=step.state.layout,
        output_spec=learnt.spec,
        output_constants=learnt.constants,
        tensor_output_positions=learnt.positions,
        output_requires_grad=learnt.requires_grad,
        loss=step.loss,
        autocast=autocast_state(),
    )


def _gradients(returned: list[str], step: _JointStep) -> tuple[list[tuple[str, str]], list[tuple[int, str]]]:
    """The returned gradients (fx names, in order) as ``(parameter name, name)`` and ``(input index,
    name)``: gradient targets that got none (unused) return nothing."""
    targets = [(PARAM, n) for n in step.state.trainable] + [(INPUT, i) for i in step.state.input_grad_indices]
    values = iter(returned)
    grad_params, grad_inputs = [], []
    for (role, key), present in zip(targets, step.learnt.present):
        if present:
            (grad_params if role == PARAM else grad_inputs).append((key, next(values)))
    return grad_params, grad_inputs


def _detach_mutations(graph: fx.Graph) -> list[tuple[str, str]]:
    """The step's buffer mutations as (placeholder name, fx name of the new value). Readers of a
    mutated buffer are made to read the buffer itself: the runtime applies the mutation once, at the
    end of the forward pass, never by re-running its ``copy_``."""
    mutations = []
    for node in graph.nodes:
        if is_buffer_mutation(node):
            mutations.append((node.args[0].name, node.args[1].name))
            node.replace_all_uses_with(node.args[0], propagate_meta=False)
    return mutations
