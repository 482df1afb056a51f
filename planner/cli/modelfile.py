"""Load a model file: a Python file defining ``build_model()`` and ``example_inputs()`` (docs/contract.md,
"The command line"), and optionally ``loss_fn(output)``.

A model file is code and runs as such; what this module makes sure of is that its failures are the
model file's, reported in one line: a file that raises, calls ``sys.exit()`` or ``os._exit()`` (at
import, in its functions, or in the model's forward: :func:`guarded`), names a function it does not
define itself (an imported ``shutil.rmtree`` is never called), or returns the wrong kind of thing.

Nothing of torch is imported until the file is found to exist (:func:`check_model_path`), so that a
mistyped path is answered at once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import traceback
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterator

CONTRACT = (
    "a model file defines build_model() returning an nn.Module and example_inputs() returning a tuple "
    "of positional arguments or a dict of keyword arguments, and may define loss_fn(output) -> scalar"
)


class ModelFileError(ValueError):
    """The model file is missing, does not import, lacks a function, or a function fails."""


@dataclass
class ModelFile:
    path: str
    model: Any  # torch.nn.Module
    example_inputs: Any
    loss_fn: Callable | None
    # Optional inputs_at(batch) -> example inputs at that batch size, for --max-batch: where scaling
    # dimension 0 of every tensor input is not how the model's batch grows.
    inputs_at: Callable | None = None
    optimizer: Any = None  # --optimizer-fn: the torch.optim.Optimizer the file builds over the model



# -- sys.exit() and os._exit() in the user's code ------------------------------------------------------
class ModelExit(SystemExit):
    """``os._exit(code)`` called by the model file's code while it runs under :func:`guarded`."""


_REAL_EXIT = os._exit
_guarded_threads: dict[int, int] = {}  # thread id -> depth of guarded() in it
_lock = threading.Lock()


def _guarded_exit(code=0):
    if _guarded_threads.get(threading.get_ident()):
        raise ModelExit(code)
    _REAL_EXIT(code)


def _install_exit_guard() -> None:
    """Replace ``os._exit`` (and ``posix._exit``, the same function) by one that raises in a thread
    running the user's code and exits as before anywhere else (a worker's watchdog thread, a forked
    child finishing)."""
    if os._exit is not _guarded_exit:
        os._exit = _guarded_exit
        posix = sys.modules.get("posix")
        if posix is not None and getattr(posix, "_exit", None) is _REAL_EXIT:
            posix._exit = _guarded_exit


@contextmanager
def guarded(path: str, what: str) -> Iterator[None]:
    """Run the model file's code: ``sys.exit()`` or ``os._exit()`` inside becomes a ModelFileError
    (``what`` says when: "in build_model()", "in the model's forward or loss_fn") rather than the
    end of the process with a status that says nothing went wrong."""
    _install_exit_guard()
    ident = threading.get_ident()
    with _lock:
        _guarded_threads[ident] = _guarded_threads.get(ident, 0) + 1
    try:
        yield
    except SystemExit as stop:
        call = "os._exit" if isinstance(stop, ModelExit) else "sys.exit"
        code = stop.code if stop.code is not None else ""
        raise ModelFileError(f"model file {path} called {call}({code!r}) {what}{_where(stop, path)}; a model file's "
                             "code must return or raise, not end the process") from None
    finally:
        with _lock:
            _guarded_threads[ident] -= 1
            if not _guarded_threads[ident]:
                del _guarded_threads[ident]


def _where(error: BaseException, path: str) -> str:
    """' (model.py, line 12)' for the innermost frame of the model file, if any."""
    path = os.path.abspath(path)
    if isinstance(error, SyntaxError) and error.lineno:
        return f" ({os.path.basename(path)}, line {error.lineno})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == path]
    return f" ({os.path.basename(path)}, line {frames[-1].lineno})" if frames else ""


def _describe(error: BaseException) -> str:
    if isinstance(error, SyntaxError):  # str() repeats the file and line that _where gives
        text = error.msg or ""
    else:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- the file ---------------------------------------------------------------------------------------------
def check_model_path(path: str) -> str:
    """The absolute path of an existing .py file, or a ModelFileError saying what it is instead.
    Imports nothing."""
    absolute = os.path.abspath(path)
    if os.path.isdir(absolute):
        raise ModelFileError(f"model file {absolute} is a folder, not a file; {CONTRACT}")
    if not os.path.exists(absolute):
        raise ModelFileError(f"model file {absolute} does not exist")
    if not os.path.isfile(absolute):
        raise ModelFileError(f"model file {absolute} is not a regular file; {CONTRACT}")
    if not absolute.endswith(".py"):
        raise ModelFileError(f"model file {absolute} is not a .py file; {CONTRACT}")
    return absolute


def import_model_file(path: str):
    """Import ``path`` as a module (its folder on sys.path, so it can import its neighbours)."""
    path = check_model_path(path)
    spec = importlib.util.spec_from_file_location(f"plan_checkpoints_model_{uuid.uuid4().hex[:8]}", path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        with guarded(path, "while being imported"):
            spec.loader.exec_module(module)
    except ModelFileError:
        raise
    except BaseException as error:  # a user's file can raise anything
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ModelFileError(f"model file {path} failed to import: {_describe(error)}{_where(error, path)}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def own_function(module, name: str, path: str, option: str, required: bool = True) -> Callable | None:
    """The function ``name`` that the model file defines itself. A name the file imported (``from
    shutil import rmtree``) is refused: only the file's own functions are ever called."""
    function = getattr(module, name, None)
    if function is None:
        if not required:
            return None
        raise ModelFileError(f"model file {path} defines no {name}(); {CONTRACT} ({option} names another function)")
    if not callable(function):
        raise ModelFileError(f"{name} in {path} is not a function; {CONTRACT}")
    owner = getattr(function, "__module__", None)
    if owner != module.__name__:
        source = f"from {owner}" if isinstance(owner, str) else "from elsewhere"
        raise ModelFileError(f"{name} in {path} is not defined in the file (it is imported {source}); only functions "
                             f"the model file defines are called: define {name}() there ({option} names another)")
    return function


def _call(function: Callable, name: str, path: str, kwargs: dict | None = None):
    try:
        with guarded(path, f"in {name}()"):
            return function(**(kwargs or {}))
    except ModelFileError:
        raise
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ModelFileError(f"{name}() in {path} raised {_describe(error)}{_where(error, path)}") from None


def to_device(value, device):
    import torch
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def check_inputs(inputs, name: str, path: str) -> None:
    """example_inputs() must give a tuple (or list) of positional arguments, a dict of keyword
    arguments named by strings, or one tensor."""
    import torch

    if not isinstance(inputs, (tuple, list, dict, torch.Tensor)):
        raise ModelFileError(f"{name}() in {path} returned {type(inputs).__name__}; it must return a tuple of "
                             "positional arguments or a dict of keyword arguments")
    if isinstance(inputs, dict):
        bad = [key for key in inputs if not (isinstance(key, str) and key.isidentifier())]
        if bad:
            raise ModelFileError(f"{name}() in {path} returned a dict with the key {bad[0]!r}; a dict of keyword "
                                 "arguments maps argument names (strings such as 'input_ids') to values")


def load_model_file(path: str, model_fn: str = "build_model", inputs_fn: str = "example_inputs",
                    device: str | None = None, model_kwargs: dict | None = None, inputs_kwargs: dict | None = None,
                    loss_fn: str | None = None, loss_kwargs: dict | None = None,
                    optimizer_fn: str | None = None) -> ModelFile:
    """Import the file, build the model (in training mode) and its example inputs, on ``device``.
    ``loss_fn`` names the loss function (None: the file's ``loss_fn`` if it defines one);
    ``optimizer_fn`` a function of the file that builds the optimizer over the model (--optimizer-fn)."""
    import functools

    import torch

    module = import_model_file(path)
    path = os.path.abspath(path)
    build = own_function(module, model_fn, path, "--model-fn")
    make_inputs = own_function(module, inputs_fn, path, "--inputs-fn")
    loss = own_function(module, loss_fn or "loss_fn", path, "loss_fn", required=loss_fn is not None)
    model = _call(build, model_fn, path, model_kwargs)
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"{model_fn}() in {path} returned {type(model).__name__}, not an nn.Module; {CONTRACT}")
    inputs = _call(make_inputs, inputs_fn, path, inputs_kwargs)
    check_inputs(inputs, inputs_fn, path)
    if loss is not None and loss_kwargs:
        loss = functools.partial(loss, **loss_kwargs)
    if device is not None:
        target = torch.device(device)
        if target.type == "cuda" and not torch.cuda.is_available():
            raise ModelFileError(f"device {device} was asked for but CUDA is not available on this machine")
        model = model.to(target)
        inputs = to_device(inputs, target)
    model.train()
    inputs_at = own_function(module, "inputs_at", path, "inputs_at", required=False)
    if inputs_at is not None and device is not None:
        inputs_at = functools.partial(_inputs_on, inputs_at, torch.device(device))
    optimizer = _optimizer(module, optimizer_fn, path, model) if optimizer_fn else None
    return ModelFile(path, model, inputs, loss, inputs_at, optimizer)


def _optimizer(module, name: str, path: str, model):
    """``name(model)``, which must be a torch.optim.Optimizer (over the model's parameters: the
    planner checks that)."""
    import torch

    function = own_function(module, name, path, "--optimizer-fn")
    optimizer = _call(lambda: function(model), name, path)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ModelFileError(f"{name}(model) in {path} returned {type(optimizer).__name__}; --optimizer-fn names a "
                             "function of the model file that returns a torch.optim.Optimizer over the model's "
                             "parameters (e.g. torch.optim.AdamW(param_groups, lr=...))")
    return optimizer


def _inputs_on(inputs_at: Callable, device, batch: int):
    return to_device(inputs_at(batch), device)
