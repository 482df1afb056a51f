"""Group the joint graph's ops into the nodes of the cost graph.

The aten graph has thousands of ops; exact solvers want hundreds of nodes. Ops are grouped into
*units* and units into *groups*:

- A **unit** is one op that allocates memory, with the ``getitem``s that unpack its outputs. Ops
  that only alias an existing storage (``view``, ``t``, ``expand``, ``detach``...) are not units:
  they cost nothing, so every group that reads an alias recomputes it from its base. That way no
  group ever holds a view of another group's storage, and freeing a group really frees its bytes.
- A **group** is a contiguous run, in trace order, of units with the same key: the phase (forward
  or backward) and the module that issued them, cut at ``depth`` module levels (``None``: every
  unit its own group). Contiguous runs of a topological order always give an acyclic graph.
- Units that produce what must outlive the schedule's choices (the model's outputs, gradients,
  the new values of mutated buffers) are cut into groups of their own, so that holding them does
  not hold their neighbours' activations too. When one op mixes such values with ordinary ones
  (``native_layer_norm_backward`` returns the input gradient with the weight's), the special values
  leave through an *extraction* node that reads the group and holds only them.

Storage identity comes from the fake tensors of the trace: two values alias iff they share a storage.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from .capture import TANGENT, JointGraph, is_buffer_mutation
from .lifetimes import LIFETIME_TAGS
from .storage import storage_bytes

# Classes of exported values; a group or extraction node holds values of one class.
NORMAL, MODEL_OUTPUT, GRADIENT, MUTATION = "normal", "model_output", "gradient", "mutation"
# The special classes, first the one a value of several classes (a model output that is also a
# buffer's new value) lives in.
SPECIAL_CLASSES = (MODEL_OUTPUT, GRADIENT, MUTATION)
# A forward group's values that the backward reads, held apart from those only the forward reads
# (batch norm's mean and inverse std, not its output; a dropout's noise, not its output).
SAVED = "saved"
# Values are held apart only when those only the forward reads are at least this many times larger:
# while the group and its extraction are both held, the held-apart values count twice (a short,
# conservative error), against the forward-only values freed until the backward (a long gain).
SAVED_APART_RATIO = 1


@dataclass
class Group:
    """One node of the cost graph made of ops. ``units`` are fx node names of allocating ops in
    trace order; ``nodes`` all fx nodes to run (units, their getitems and the aliases they read)."""

    id: str
    phase: str
    module: str
    units: list[str]
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # fx names of base values read from outside
    exports: list[str] = field(default_factory=list)  # fx names of values others read (bases or aliases)
    value_class: str = NORMAL
    random: bool = False
    # The autograd node whose backward ran every unit (profiler/capture.py's tag), None when the
    # units are not all of one node (forward groups, coarse groupings).
    autograd_node: int | None = None
    # A one-op group's tags from profiler/lifetimes.py: a forward op's ordinal, the autograd node it
    # created, the last op its result was alive through (absent: it outlived the forward) and the
    # version an in-place op overwrote; a backward op's autograd node's sequence number.
    lifetime: dict = field(default_factory=dict)


@dataclass
class Extraction:
    """A node that holds some special values of ``source``: its model outputs, gradients or mutations."""

    id: str
    source: str
    values: list[str]
    value_class: str


@dataclass
class Grouping:
    groups: list[Group]
    extractions: list[Extraction]
    value_owner: dict[str, str]  # fx name of a base value -> id of the group that computes it
    base_of: dict[str, str]  # fx name of any tensor value -> fx name of its base (itself if a base)
    fixed: set[str]  # placeholder names other than tangents
    tangents: set[str]
    depth: int | None
    # fx name of a forward base value -> the extraction node the backward reads it from
    backward_holder: dict[str, str] = field(default_factory=dict)

    def source_for(self, base: str, phase: str) -> str:
        """The node a group of ``phase`` reads ``base`` from (not for placeholders)."""
        if phase == "backward" and base in self.backward_holder:
            return self.backward_holder[base]
        return self.value_owner[base]


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _storage(tensor: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(tensor.untyped_storage())


# Arguments that carry a forward's random draw into its backward: an op taking them replays that
# draw from them and takes nothing from the generator.
_DRAW_ARGUMENTS = {"philox_seed", "philox_offset"}


def is_random(node: fx.Node) -> bool:
    """Whether ``node`` draws from the global generator (dropout, SDPA with dropout, bernoulli).

    CUDA's attention backwards (``_scaled_dot_product_{efficient,flash,cudnn}_attention_backward``)
    carry the ``nondeterministic_seeded`` tag too, but read their forward's draw from its
    ``philox_seed``/``philox_offset`` outputs: they are not random, and running one on placeholder
    tensors (the traced executor's RNG pre-pass) reads garbage seeds and offsets (a segfault on an
    H100)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    return not any(argument.name in _DRAW_ARGUMENTS for argument in target._schema.arguments)


def _module_key(node: fx.Node, depth: int | None) -> tuple[str, str]:
    tags = node.meta.get("custom") or {}
    module = tags.get("module", "")
    phase = tags.get("phase", "forward")
    if depth is not None and module:
        module = ".".join(module.split(".")[:depth])
    return phase, module


@dataclass
class _Analysis:
    """Alias structure of the graph."""

    base_of: dict[str, str]
    unit_of: dict[str, str]  # fx name of a unit's op or getitem -> the unit's op name
    units: list[str]
    storages: dict[str, list]  # fx name -> storages of its tensors


def analyse(graph: fx.Graph) -> _Analysis:
    """Find units (allocating ops) and, for every value, its base (the unit value or placeholder
    that owns its storage), walking the graph in trace order."""
    walk = _AliasWalk(_Analysis({}, {}, [], {}))
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):  # inputs and constants: always resident
            walk.resident(node)
        elif node.op == "call_function":
            walk.call(node)
    return walk.analysis


@dataclass
class _AliasWalk:
    """:func:`analyse`'s state: the analysis so far, and which value first held each storage."""

    analysis: _Analysis
    storage_owner: dict = field(default_factory=dict)  # storage -> fx name of the value that first held it

    def _record_storages(self, node: fx.Node) -> list:
        storages = self.analysis.storages[node.name] = [_storage(t) for t in _tensors(node.meta.get("val"))]
        return storages

    def resident(self, node: fx.Node) -> None:
        """A placeholder or constant: the base of its own storages (unless an earlier one holds them)."""
        for s in self._record_storages(node):
            self.storage_owner.setdefault(s, node.name)
        self.analysis.base_of[node.name] = node.name

    def call(self, node: fx.Node) -> None:
        """An op: a getitem, a view of existing storages, or a unit (it allocates, or makes no tensor)."""
        storages = self._record_storages(node)
        if node.target is operator.getitem:
            self._unpack(node)
            return
        new = [s for s in storages if s not in self.storage_owner]
        if storages and not new:
            self._view(node)
            return
        self.analysis.units.append(node.name)
        self.analysis.unit_of[node.name] = node.name
        self.analysis.base_of[node.name] = node.name
        for s in new:
            self.storage_owner[s] = node.name

    def _unpack(self, node: fx.Node) -> None:
        base_of, unit_of = self.analysis.base_of, self.analysis.unit_of
        parent = node.args[0]
        if parent.name not in unit_of:  # unpacking an aliasing op (split): an alias of the same base
            base_of[node.name] = base_of[parent.name]
            return
        # Unpacking an allocating op: part of its unit, and the base of its storages (not the tuple).
        unit_of[node.name] = unit_of[parent.name]
        base_of[node.name] = node.name
        for s in self.analysis.storages[node.name]:
            if self.storage_owner.get(s) == parent.name:
                self.storage_owner[s] = node.name

    def _view(self, node: fx.Node) -> None:
        """Every output aliases something that exists: a view-like op. Its base is that of the input
        it views (not merely the first value with that storage: the same tensor may be passed in
        twice, as input_ids and labels)."""
        storages = self.analysis.storages
        first = storages[node.name][0]
        viewed = next((a for a in node.all_input_nodes if first in storages.get(a.name, ())), None)
        owner = viewed.name if viewed is not None else self.storage_owner[first]
        self.analysis.base_of[node.name] = self.analysis.base_of.get(owner, owner)


def _special_values(joint: JointGraph, base_of: dict[str, str]) -> dict[str, str]:
    """Base value name -> the special class it has to live in (the first that applies of
    :data:`SPECIAL_CLASSES`)."""
    special: dict[str, str] = {}
    for name in joint.model_outputs:
        if name is not None:
            special[base_of[name]] = MODEL_OUTPUT
    for _, name in joint.grad_params + joint.grad_inputs:
        special.setdefault(base_of[name], GRADIENT)
    for _, name in joint.mutations:
        special.setdefault(base_of[name], MUTATION)
    return special


def group_graph(joint: JointGraph, depth: int | None) -> Grouping:
    """Group the joint graph's units (module levels cut at ``depth``; None: one group per unit).

    Four passes: runs of units with the same key (:func:`_runs`), their names (:func:`_named_groups`),
    what each group runs and reads (:func:`_read_and_run`), and what it hands to others, special
    classes and saved values held apart by extraction nodes (:func:`_exports_and_extractions`)."""
    graph = joint.graph_module.graph
    nodes = {node.name: node for node in graph.nodes}
    analysis = analyse(graph)
    special = _special_values(joint, analysis.base_of)
    # The runtime applies the copies of new values into mutated buffers once per step; no group runs them.
    copies = {node.name for node in graph.nodes if is_buffer_mutation(node)}
    groups = _named_groups(_runs(nodes, analysis, special, depth, skipped=copies), nodes)
    value_owner = _value_owners(groups, nodes, analysis.unit_of)
    readers: dict[str, set[str]] = {name: {_CALLER} for name in special}
    for group in groups:
        _read_and_run(group, graph, nodes, analysis, value_owner, readers)
    extractions, backward_holder = _exports_and_extractions(groups, nodes, analysis.unit_of, special, readers)
    tangents = {p.name for p in joint.placeholders if p.role == TANGENT}
    fixed = {p.name for p in joint.placeholders} - tangents
    return Grouping(groups, extractions, value_owner, analysis.base_of, fixed, tangents, depth, backward_holder)


# The reader of the special values outside the graph: the caller (model outputs), the optimizer
# (gradients), the runtime (new buffer values). Any reader makes a value an export.
_CALLER = "<out>"


def _pure_special_class(values: list[str], special: dict[str, str]) -> str | None:
    """The class of a unit all of whose ``values`` are special, the first of :data:`SPECIAL_CLASSES`
    among theirs; None when any of them is ordinary."""
    if not all(v in special for v in values):
        return None
    classes = {special[v] for v in values}
    return next(c for c in SPECIAL_CLASSES if c in classes)


def _runs(nodes: dict[str, fx.Node], analysis: _Analysis, special: dict[str, str], depth: int | None,
          skipped: set[str]) -> list[tuple[tuple, list[str]]]:
    """Pass 1: contiguous runs, in trace order, of units with the same key: phase, module cut at
    ``depth``, and the special class of units that make only special values (so that those form
    runs of their own); with ``depth`` None, every unit its own run."""
    runs: list[tuple[tuple, list[str]]] = []
    for index, unit in enumerate(analysis.units):
        if unit in skipped:
            continue
        phase, module = _module_key(nodes[unit], depth)
        value_class = _pure_special_class(_unit_values(unit, nodes, analysis.unit_of), special) or NORMAL
        key = (phase, module, value_class, index if depth is None else None)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(unit)
        else:
            runs.append((key, [unit]))
    return runs


def _named_groups(runs: list[tuple[tuple, list[str]]], nodes: dict[str, fx.Node]) -> list[Group]:
    """Pass 2: a group per run, named ``fw:<module>#k`` or ``bw:<module>#k``, ``k`` counting the
    earlier groups of the same phase and module (``<root>`` for the model's own ops)."""
    groups: list[Group] = []
    seen: dict[tuple[str, str], int] = {}
    for (phase, module, _, _), units in runs:
        k = seen.get((phase, module), 0)
        seen[(phase, module)] = k + 1
        prefix = "fw" if phase == "forward" else "bw"
        autograd_nodes = {(nodes[u].meta.get("custom") or {}).get("autograd_node") for u in units}
        groups.append(Group(id=f"{prefix}:{module or '<root>'}#{k}", phase=phase, module=module, units=units,
                            random=any(is_random(nodes[u]) for u in units),
                            autograd_node=autograd_nodes.pop() if len(autograd_nodes) == 1 else None,
                            lifetime=one_op_lifetime(nodes, units)))
    return groups


def one_op_lifetime(nodes: dict[str, fx.Node], units: list[str]) -> dict:
    """The lifetime tags (profiler/lifetimes.py) of a group of one op; none for several."""
    if len(units) != 1:
        return {}
    tags = nodes[units[0]].meta.get("custom") or {}
    return {key: tags[key] for key in LIFETIME_TAGS if key in tags}


def _value_owners(groups: list[Group], nodes: dict[str, fx.Node], unit_of: dict[str, str]) -> dict[str, str]:
    """fx name of each value the groups' units make -> the id of its group."""
    return {value: group.id for group in groups for unit in group.units for value in _unit_values(unit, nodes, unit_of)}


def _read_and_run(group: Group, graph: fx.Graph, nodes: dict[str, fx.Node], analysis: _Analysis,
                  value_owner: dict[str, str], readers: dict[str, set[str]]) -> None:
    """Pass 3, one group: set what it runs (``nodes``: its units, their getitems, the aliases they
    read and the constants they read, in trace order) and what it reads from outside (``inputs``:
    bases made elsewhere, placeholders included), and record it in ``readers`` (base -> group ids)."""
    base_of, unit_of = analysis.base_of, analysis.unit_of
    members: set[str] = set()
    inputs: list[str] = []
    for unit in group.units:
        members.add(unit)
        members.update(u.name for u in nodes[unit].users if unit_of.get(u.name) == unit)
        for arg in nodes[unit].all_input_nodes:
            members.update(_alias_chain(arg, base_of, unit_of))
            base = base_of[arg.name]
            if nodes[base].op == "get_attr":  # a constant: copied into the group's code
                members.add(base)
                continue
            if value_owner.get(base) != group.id and base not in inputs:
                inputs.append(base)
            readers.setdefault(base, set()).add(group.id)
    group.nodes = [n.name for n in graph.nodes if n.name in members]
    group.inputs = inputs


def _exports_and_extractions(groups: list[Group], nodes: dict[str, fx.Node], unit_of: dict[str, str],
                             special: dict[str, str], readers: dict[str, set[str]]
                             ) -> tuple[list[Extraction], dict[str, str]]:
    """Pass 4: each group's ``exports`` (its values another group or the caller reads) and
    ``value_class``, the extraction nodes that hold some of them apart (:func:`_held_apart`), and
    which extraction the backward reads each held-apart forward value from."""
    extractions: list[Extraction] = []
    backward_holder: dict[str, str] = {}
    phase_of = {group.id: group.phase for group in groups}
    for group in groups:
        group.exports = _exports(group, nodes, unit_of, readers)
        held_apart = _held_apart(group, special, readers, phase_of, nodes)
        if group.phase == "forward" and group.value_class == NORMAL:
            # The backward reads what a forward group holds apart from the extraction, so that the
            # group itself can be freed once the forward is done with it (batch norm's backward
            # reads the new running statistics: through the group they kept its output alive).
            backward_holder.update((value, e.id) for e in held_apart for value in e.values)
        extractions.extend(held_apart)
    return extractions, backward_holder


def _exports(group: Group, nodes: dict[str, fx.Node], unit_of: dict[str, str], readers: dict[str, set[str]]
             ) -> list[str]:
    """The values of ``group`` that another group or the caller reads, in trace order."""
    values = [value for unit in group.units for value in _unit_values(unit, nodes, unit_of)]
    return [value for value in values if readers.get(value, set()) - {group.id}]


def _held_apart(group: Group, special: dict[str, str], readers: dict[str, set[str]], phase_of: dict[str, str],
                nodes: dict[str, fx.Node]) -> list[Extraction]:
    """Set ``group.value_class`` from its exports; return the extraction nodes that hold some of
    them apart: one per special class when they mix classes (:func:`_split_classes`), and for an
    ordinary forward group the values only its backward reads (:func:`_saved_apart`)."""
    group.value_class, apart = _split_classes(group.exports, special)
    held = [Extraction(f"{group.id}/{cls}", group.id, values, cls) for cls, values in apart.items()]
    if group.phase == "forward" and group.value_class == NORMAL:
        saved = _saved_apart([v for v in group.exports if v not in special], readers, phase_of, nodes)
        if saved:
            held.append(Extraction(f"{group.id}/{SAVED}", group.id, saved, SAVED))
    return held


def _split_classes(exports: list[str], special: dict[str, str]) -> tuple[str, dict[str, list[str]]]:
    """The class of a group with these ``exports``, and the special values it hands to extraction
    nodes, by class: a group whose exports are of one class is of that class and hands nothing on;
    one whose exports mix classes is ``normal`` and hands each special class to an extraction, so
    that holding a gradient does not hold an activation."""
    classes = {special.get(v, NORMAL) for v in exports}
    if len(classes) <= 1:
        return (classes.pop() if classes else NORMAL), {}
    apart = {cls: [v for v in exports if special.get(v) == cls] for cls in SPECIAL_CLASSES}
    return NORMAL, {cls: values for cls, values in apart.items() if values}


def _saved_apart(ordinary: list[str], readers: dict[str, set[str]], phase_of: dict[str, str],
                 nodes: dict) -> list[str]:
    """Of a forward group's ordinary exports, those to hold apart for the backward, or none.

    Holding a node holds all its values, so a backward that reads only some of them keeps the rest,
    which only the next forward op reads, alive until then: ``native_batch_norm``'s normalised
    activation (its backward reads the mean and inverse std), a dropout's output (its backward reads
    the noise; CPU dropout is noise, scale, multiply in one module). With the running statistics also
    read from their extraction, the benchmark U-Net's store-all peak went from 241.9 MiB to
    183.9 MiB, eager's (either change alone: no gain); held apart at 1:1 (the dropouts' output and
    noise are the same size), the benchmark GPT-2's and BERT's store-all went from 493.5 and
    425.8 MiB to 481.5 and 412.8 (eager: 481.4 and 412.7; the ratio was 8 before). Done when the
    values the backward does not read are :data:`SAVED_APART_RATIO` times the bytes of those it
    reads, or more.
    """
    saved = [v for v in ordinary if any(phase_of.get(r) == "backward" for r in readers.get(v, ()))]
    transient = [v for v in ordinary if v not in saved]
    if not saved or not transient:
        return []
    saved_bytes = sum(_value_bytes(nodes[v]) for v in saved)
    transient_bytes = sum(_value_bytes(nodes[v]) for v in transient)
    return saved if transient_bytes >= SAVED_APART_RATIO * max(saved_bytes, 1) else []


def _value_bytes(node: fx.Node) -> int:
    """Bytes of the storages of a value's tensors (fake tensors of the trace)."""
    return sum({_storage(t): storage_bytes(t) for t in _tensors(node.meta.get("val"))}.values())


def _unit_values(unit: str, nodes: dict, unit_of: dict) -> list[str]:
    """The tensor values a unit produces: the op itself, or its getitems for a multi-output op."""
    getitems = [u.name for u in nodes[unit].users if u.target is operator.getitem and unit_of.get(u.name) == unit]
    return getitems if getitems else [unit]


def _alias_chain(node: fx.Node, base_of: dict, unit_of: dict) -> list[str]:
    """The alias ops from ``node``'s base down to ``node`` (empty when ``node`` is a base)."""
    chain = []
    current = node
    while current.op == "call_function" and current.name not in unit_of:
        chain.append(current.name)
        sources = [a for a in current.all_input_nodes if base_of.get(a.name) == base_of[node.name]]
        if not sources:
            break
        current = sources[0]
    return chain
