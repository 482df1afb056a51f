"""Load a model file: a Python file defining ``build_model()`` and ``example_inputs()`` (SPEC.md,
"Command line"), and optionally ``loss_fn(output)``."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

CONTRACT = (
    "a model file defines build_model() returning an nn.Module and example_inputs() returning a tuple "
    "of positional arguments or a dict of keyword arguments, and may define loss_fn(output) -> scalar"
)


class ModelFileError(ValueError):
    """The model file is missing, does not import, lacks a function, or a function fails."""


@dataclass
class ModelFile:
    path: str
    model: torch.nn.Module
    example_inputs: Any
    loss_fn: Callable | None


def _where(error: BaseException, path: str) -> str:
    """' (model.py, line 12)' for the innermost frame of the model file, if any."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == path]
    if isinstance(error, SyntaxError) and error.lineno:
        return f" ({os.path.basename(path)}, line {error.lineno})"
    return f" ({os.path.basename(path)}, line {frames[-1].lineno})" if frames else ""


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def import_model_file(path: str):
    """Import ``path`` as a module (its folder on sys.path, so it can import its neighbours)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ModelFileError(f"model file {path} does not exist")
    if not path.endswith(".py"):
        raise ModelFileError(f"model file {path} is not a .py file; {CONTRACT}")
    spec = importlib.util.spec_from_file_location(f"plan_checkpoints_model_{uuid.uuid4().hex[:8]}", path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # a user's file can raise anything, SystemExit included
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ModelFileError(f"model file {path} failed to import: {_describe(error)}{_where(error, path)}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _call(module, name: str, path: str, what: str):
    function = getattr(module, name, None)
    if function is None:
        option = "--model-fn" if what == "model" else "--inputs-fn"
        raise ModelFileError(f"model file {path} defines no {name}(); {CONTRACT} ({option} names another function)")
    if not callable(function):
        raise ModelFileError(f"{name} in {path} is not a function; {CONTRACT}")
    try:
        return function()
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ModelFileError(f"{name}() in {path} raised {_describe(error)}{_where(error, os.path.abspath(path))}") from None


def to_device(value, device: torch.device):
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def load_model_file(path: str, model_fn: str = "build_model", inputs_fn: str = "example_inputs",
                    device: str | None = None) -> ModelFile:
    """Import the file, build the model (in training mode) and its example inputs, on ``device``."""
    module = import_model_file(path)
    model = _call(module, model_fn, path, "model")
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"{model_fn}() in {path} returned {type(model).__name__}, not an nn.Module; {CONTRACT}")
    inputs = _call(module, inputs_fn, path, "inputs")
    if not isinstance(inputs, (tuple, list, dict, torch.Tensor)):
        raise ModelFileError(
            f"{inputs_fn}() in {path} returned {type(inputs).__name__}; it must return a tuple of positional "
            "arguments or a dict of keyword arguments"
        )
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        raise ModelFileError(f"loss_fn in {path} is not a function; {CONTRACT}")
    if device is not None:
        target = torch.device(device)
        if target.type == "cuda" and not torch.cuda.is_available():
            raise ModelFileError("--device cuda was given but CUDA is not available on this machine")
        model = model.to(target)
        inputs = to_device(inputs, target)
    model.train()
    return ModelFile(os.path.abspath(path), model, inputs, loss_fn)
