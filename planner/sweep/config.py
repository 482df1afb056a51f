"""The YAML file of ``plan-checkpoints batch`` (docs/batch.md): models x budgets x solvers x executors.

Read from yaml's node tree rather than from plain Python values, so that every error can say the
file and line it is about and what is accepted there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..budget import Budget, BudgetError, parse_budget
from .executors import ACCEPTED_EXECUTORS, EXECUTORS, ExecutorChoice, choices, default_executor, refusal

TOP_KEYS = {
    "models": "the list of models (required)",
    "budgets": "budgets for every model",
    "solvers": "solvers for every model (default: auto)",
    "executor": "native, traced or [native, traced] (default: planner.plan's for each solver)",
    "device": "cpu, cuda or cuda:N (default: where build_model puts the model)",
    "time_limit": "seconds each solve may search",
    "granularity": "module (default), module:N or op",
}
MODEL_KEYS = {
    "file": "the model file (required; relative to the YAML file)",
    "name": "the model's name in tables and file names (default: the file's name)",
    "model_fn": "function building the model (default: build_model)",
    "inputs_fn": "function giving the example inputs (default: example_inputs)",
    "loss_fn": "function taking the output to the loss (default: loss_fn if the file defines one)",
    "model_kwargs": "keyword arguments for model_fn",
    "inputs_kwargs": "keyword arguments for inputs_fn",
    "loss_kwargs": "keyword arguments for loss_fn after the output",
    "budgets": "this model's budgets (instead of the top-level ones)",
    "solvers": "this model's solvers (instead of the top-level ones)",
    "executor": "this model's executor(s)",
    "time_limit": "this model's time limit",
    "granularity": "this model's granularity",
}
MAX_VALUES = 10_000
MAX_SWEEP_FILE_BYTES = 10 * 2**20
MAX_NAME = 100  # a run's files are named <model>__<budget>__<solver>[__<executor>].json: within 255 bytes
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """A sweep file that cannot be run; the message names the file and line."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    file: str  # absolute path
    model_fn: str = "build_model"
    inputs_fn: str = "example_inputs"
    loss_fn: str | None = None  # None: the file's loss_fn if it has one, else the default loss
    model_kwargs: dict = field(default_factory=dict)
    inputs_kwargs: dict = field(default_factory=dict)
    loss_kwargs: dict = field(default_factory=dict)
    time_limit: float | None = None
    granularity: str = "module"
    file_digest: str = ""  # the file's content: editing the model file makes its runs stale


@dataclass(frozen=True)
class Run:
    """One model x budget x solver x executor; ``id`` names its plan and record files."""

    id: str
    model: ModelSpec
    budget: Budget
    solver: str
    device: str | None
    executor: ExecutorChoice | None = None  # None: planner.plan's default for the solver

    def __post_init__(self):
        if self.executor is None:
            object.__setattr__(self, "executor", ExecutorChoice(default_executor(self.solver), given=False))

    def settings(self) -> dict:
        """Everything the run's result depends on: a record made for other settings is stale."""
        spec = self.model
        return {
            "file": spec.file, "file_digest": spec.file_digest, "model_fn": spec.model_fn,
            "inputs_fn": spec.inputs_fn, "loss_fn": spec.loss_fn, "model_kwargs": spec.model_kwargs,
            "inputs_kwargs": spec.inputs_kwargs, "loss_kwargs": spec.loss_kwargs,
            "granularity": spec.granularity, "device": self.device, "budget": str(self.budget),
            "solver": self.solver, "time_limit": spec.time_limit,
            "executor": self.executor.name, "executor_given": self.executor.given,
        }

    def digest(self) -> str:
        text = json.dumps(self.settings(), sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Sweep:
    path: str
    models: tuple[ModelSpec, ...]
    runs: tuple[Run, ...]
    device: str | None

    def runs_of(self, model: ModelSpec) -> list[Run]:
        return [run for run in self.runs if run.model.name == model.name]


# -- reading yaml nodes with their lines -------------------------------------------------------------
class _Reader:
    def __init__(self, path: str):
        self.path = path
        self.constructor = yaml.SafeLoader("")  # builds plain values from nodes

    def error(self, node: yaml.Node | None, message: str) -> ConfigError:
        where = f", line {node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.path}{where}: {message}")

    def value(self, node: yaml.Node) -> Any:
        return self.constructor.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, what: str, accepted: dict[str, str]) -> dict[str, yaml.Node]:
        """The mapping's values by key; unknown or repeated keys are errors that list the accepted keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping of keys ({', '.join(accepted)}), got {_kind(node)}")
        result: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key not in accepted:
                listing = "; ".join(f"{k}: {meaning}" for k, meaning in accepted.items())
                raise self.error(key_node, f"unknown key {key!r} in {what}; accepted keys are {listing}")
            if key in result:
                raise self.error(key_node, f"key {key!r} appears twice in {what}")
            result[key] = value_node
        return result

    def items(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        """A list, or one scalar standing for a list of one (``budgets: 60%``)."""
        if isinstance(node, yaml.SequenceNode):
            if not node.value:
                raise self.error(node, f"{what} is an empty list")
            return list(node.value)
        if isinstance(node, yaml.ScalarNode) and self.value(node) is not None:
            return [node]
        raise self.error(node, f"{what} must be a list, got {_kind(node)}")

    def string(self, node: yaml.Node, what: str, pattern: re.Pattern | None = None, hint: str = "") -> str:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
            raise self.error(node, f"{what} must be {hint or 'a string'}, got {_show(self, node)}")
        return value

    def kwargs(self, node: yaml.Node, what: str) -> dict:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping of keyword arguments, got {_kind(node)}")
        if _expanded_size(node) > MAX_VALUES:  # aliases of aliases: a few lines that expand to billions
            raise self.error(node, f"{what} expands to more than {MAX_VALUES} values (through aliases); keyword "
                                   "arguments are a few plain values")
        for key_node, _ in node.value:
            key = self.value(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or not key.isidentifier():
                raise self.error(key_node, f"{what}: {key!r} is not a keyword argument name")
        return self.value(node)

    def time_limit(self, node: yaml.Node) -> float:
        from solvers.options import TIME_LIMIT_FORMS, check_time_limit

        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        try:
            return check_time_limit(value if isinstance(value, (int, float)) else "not a number")
        except ValueError:
            raise self.error(node, f"time_limit must be {TIME_LIMIT_FORMS}, got {_show(self, node)}") from None

    def granularity(self, node: yaml.Node) -> str:
        from profiler.api import parse_granularity

        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        try:
            parse_granularity(value)
        except ValueError as error:
            raise self.error(node, str(error)) from None
        return f"module:{value}" if isinstance(value, int) else value

    def budgets(self, node: yaml.Node) -> list[tuple[Budget, yaml.Node]]:
        result = []
        for item in self.items(node, "budgets"):
            if not isinstance(item, yaml.ScalarNode):
                raise self.error(item, f"a budget must be a single value such as 60% or 12GB, got {_kind(item)}")
            try:
                budget = parse_budget(self.value(item))
            except BudgetError as error:
                raise self.error(item, str(error)) from None
            if any(_budget_slug(b) == _budget_slug(budget) for b, _ in result):
                raise self.error(item, f"budget {budget} is listed twice")
            result.append((budget, item))
        return result

    def solvers(self, node: yaml.Node) -> list[tuple[str, yaml.Node]]:
        from solvers import METHODS

        accepted = ["auto", *METHODS]
        result: list[tuple[str, yaml.Node]] = []
        for item in self.items(node, "solvers"):
            value = self.value(item) if isinstance(item, yaml.ScalarNode) else None
            if value not in accepted:
                raise self.error(item, f"unknown solver {_show(self, item)}; accepted: {', '.join(accepted)}")
            if any(value == solver for solver, _ in result):
                raise self.error(item, f"solver {value} is listed twice")
            result.append((value, item))
        return result

    def executors(self, node: yaml.Node) -> list[str]:
        """``native``, ``traced``, or a list of them."""
        result: list[str] = []
        for item in self.items(node, "executor"):
            value = self.value(item) if isinstance(item, yaml.ScalarNode) else None
            if value not in EXECUTORS:
                raise self.error(item, f"unknown executor {_show(self, item)}; accepted: {ACCEPTED_EXECUTORS}")
            if value in result:
                raise self.error(item, f"executor {value} is listed twice")
            result.append(value)
        return result


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` stands for once its aliases are expanded (acyclic: checked before)."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if ready:
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), 2 * MAX_VALUES)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _kind(node: yaml.Node | None) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node is None or node.tag.endswith(":null"):
        return "nothing"
    return f"{node.value!r}"


def _show(reader: _Reader, node: yaml.Node) -> str:
    return repr(reader.value(node)) if isinstance(node, yaml.ScalarNode) else _kind(node)


def _budget_slug(budget: Budget) -> str:
    """The budget as it goes in file names: ``60%`` -> ``60pct``, ``1.5GiB`` -> ``1.5GiB``."""
    text = str(budget).replace("%", "pct").replace(" ", "")
    return re.sub(r"[^A-Za-z0-9.]", "_", text)


def _file_digest(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()[:16]


# -- the sweep ---------------------------------------------------------------------------------------
def compose(path: str) -> tuple[_Reader, yaml.Node]:
    """Parse the file into yaml nodes; malformed YAML is an error with its line and column."""
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # a FIFO blocks, /dev/zero never ends
            kind = "a folder" if os.path.isdir(path) else "not a regular file (a device or a pipe)"
            raise ConfigError(f"cannot read sweep file {path}: it is {kind}; a sweep file is a YAML file (docs/batch.md)")
        if os.path.getsize(path) > MAX_SWEEP_FILE_BYTES:
            raise ConfigError(f"sweep file {path} is {os.path.getsize(path)} bytes; a sweep file is a YAML file of "
                              f"at most {MAX_SWEEP_FILE_BYTES} bytes")
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except UnicodeDecodeError as error:
        raise ConfigError(f"sweep file {path} is not UTF-8 text (byte {error.start}); a sweep file is a YAML file") from None
    except OSError as error:
        raise ConfigError(f"cannot read sweep file {path}: {error.strerror or error}") from None
    reader = _Reader(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = error.problem or error.context or "cannot be parsed"
        raise ConfigError(f"{path}{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; a sweep file is a few levels of lists and mappings") from None
    if root is None:
        raise ConfigError(f"{path}: the file is empty; a sweep lists models and budgets (see docs/batch.md)")
    _plain_values_only(reader, root)
    return reader, root


_PLAIN_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}


def _plain_values_only(reader: _Reader, root: yaml.Node) -> None:
    """Refuse tags other than YAML's plain ones (``!!python/object``, ``!!binary``, ``!custom``) and
    an anchor used inside itself, before any value is built: a sweep file holds strings, numbers,
    booleans, lists and mappings."""
    on_path: set[int] = set()
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        if id(node) in on_path:
            raise reader.error(node, "an anchor is used inside itself (a recursive value); a sweep file holds plain "
                                     "values")
        if id(node) in seen:  # an alias of a node already checked
            continue
        seen.add(id(node))
        if node.tag not in _PLAIN_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise reader.error(node, f"the tag {tag!r} is not accepted; a sweep file holds plain values (strings, "
                                     "numbers, booleans, lists and mappings), and builds no Python objects")
        on_path.add(id(node))
        stack.append((node, True))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, False) for child in reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                stack.extend(((value, False), (key, False)))


def load_sweep(path: str) -> Sweep:
    """Read and check the whole sweep file before any run starts."""
    reader, root = compose(path)
    top = reader.mapping(root, "the sweep", TOP_KEYS)
    if "models" not in top:
        raise reader.error(root, "the sweep has no 'models' list")
    device = _device(reader, top["device"]) if "device" in top else None
    defaults = {
        "budgets": reader.budgets(top["budgets"]) if "budgets" in top else None,
        "solvers": reader.solvers(top["solvers"]) if "solvers" in top else [("auto", None)],
        "executor": reader.executors(top["executor"]) if "executor" in top else None,
        "time_limit": reader.time_limit(top["time_limit"]) if "time_limit" in top else None,
        "granularity": reader.granularity(top["granularity"]) if "granularity" in top else "module",
    }
    models: list[ModelSpec] = []
    runs: list[Run] = []
    folder = os.path.dirname(os.path.abspath(path))
    for index, node in enumerate(reader.items(top["models"], "models")):
        spec, budgets, solvers, executors = _model(reader, node, index, folder, defaults)
        if any(m.name == spec.name for m in models):
            raise reader.error(node, f"two models are named {spec.name!r}; give each a different 'name'")
        models.append(spec)
        compared = executors is not None and len(executors) > 1  # the run ids then name their executor
        for budget, _ in budgets:
            for solver in solvers:
                for executor in choices(executors, solver):
                    run_id = f"{spec.name}__{_budget_slug(budget)}__{solver}" + (f"__{executor.name}" if compared else "")
                    runs.append(Run(run_id, spec, budget, solver, device, executor))
    return Sweep(os.path.abspath(path), tuple(models), tuple(runs), device)


def _model(reader: _Reader, node: yaml.Node, index: int, folder: str, defaults: dict):
    what = f"models[{index}]"
    keys = reader.mapping(node, what, MODEL_KEYS)
    if "file" not in keys:
        raise reader.error(node, f"{what} has no 'file' (the model file defining build_model() and example_inputs())")
    file = os.path.normpath(os.path.join(folder, reader.string(keys["file"], "file", hint="a path to a .py file")))
    from ..cli.modelfile import ModelFileError, check_model_path

    try:
        check_model_path(file)
    except ModelFileError as error:
        raise reader.error(keys["file"], str(error).split("; ")[0]) from None
    stem = os.path.splitext(os.path.basename(file))[0]
    name = reader.string(keys["name"], "name", _NAME, "letters, digits, '.', '_' or '-'") if "name" in keys else stem
    if not _NAME.match(name) or len(name) > MAX_NAME:
        shown = repr(name if len(name) <= 40 else name[:40] + "...")
        where, what, fix = ((keys["name"], f"the name {shown}", "give a shorter 'name'") if "name" in keys
                            else (keys["file"], f"the file name {shown}", "give a 'name'"))
        raise reader.error(where, f"{what} cannot name the model in file names: letters, digits, '.', '_' or '-', "
                                  f"at most {MAX_NAME} characters; {fix}")
    functions = {}
    for key in ("model_fn", "inputs_fn", "loss_fn"):
        if key in keys:
            functions[key] = reader.string(keys[key], key, _FUNCTION, "a function name")
    kwargs = {key: reader.kwargs(keys[key], key) for key in ("model_kwargs", "inputs_kwargs", "loss_kwargs") if key in keys}
    budgets = reader.budgets(keys["budgets"]) if "budgets" in keys else defaults["budgets"]
    if budgets is None:
        raise reader.error(node, f"{what} ({name}) has no budgets: give 'budgets' at the top of the file or in the model")
    solvers = reader.solvers(keys["solvers"]) if "solvers" in keys else defaults["solvers"]
    executors = reader.executors(keys["executor"]) if "executor" in keys else defaults["executor"]
    _check_executors(reader, f"{what} ({name})", executors, solvers, keys.get("executor", node))
    spec = ModelSpec(
        name=name, file=file, **functions, **kwargs,
        time_limit=reader.time_limit(keys["time_limit"]) if "time_limit" in keys else defaults["time_limit"],
        granularity=reader.granularity(keys["granularity"]) if "granularity" in keys else defaults["granularity"],
        file_digest=_file_digest(file),
    )
    return spec, budgets, [solver for solver, _ in solvers], executors


def _check_executors(reader: _Reader, what: str, executors: list[str] | None, solvers: list[tuple[str, yaml.Node]],
                     executor_node: yaml.Node) -> None:
    """Every solver is run by one of the model's executors (``executors`` None: planner.plan's
    default for each, which always runs it); the error is at the solver's line."""
    for solver, solver_node in solvers if executors is not None else ():
        problem = refusal(executors, solver)
        if problem:
            raise reader.error(solver_node if solver_node is not None else executor_node, f"{what}: {problem}")


def _device(reader: _Reader, node: yaml.Node) -> str:
    value = reader.value(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(value, str) or not re.match(r"^(cpu|cuda(:\d+)?)$", value):
        raise reader.error(node, f"device must be cpu, cuda or cuda:N, got {_show(reader, node)}")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise reader.error(node, f"device {value}: CUDA is not available on this machine")
    return value
