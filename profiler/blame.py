"""Whose code raised an error caught while tracing: the model's (or torch's tracer), or ours.

``make_fx`` runs the model's forward and backward on fake tensors, and with them code of this
project: the decompositions it installs (profiler/capture.py, profiler/rnn.py), its module hooks,
the functions it patches into torch (profiler/transformer.py) and the graph passes between the two
traces (profiler/dropout.py). A model the tracer cannot follow gets the fallback plan
(planner/fallback.py); an error raised in our own code is a bug of ours, and a fallback would hide
it, so it must reach the caller as it is.

The rule, from the traceback (innermost frame last): find the innermost frame that is neither
torch's nor the standard library's. When it is in our packages and is not one of the *drivers*
(the functions that only hand the model to the tracer: an error raised below them, in torch, is
the tracer's), our code raised the error. A driver that raised by itself, with nothing below it,
raised it too.
"""

from __future__ import annotations

import sysconfig
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parent.parent
# The project's packages (the repository root also holds the tests' models and a virtual environment).
OUR_PACKAGES = tuple(_ROOT / name for name in ("profiler", "runtime", "planner", "solvers"))
# Frames of these run on behalf of whoever called them: they decide nothing about blame.
_NEUTRAL = tuple(Path(p).resolve() for p in {Path(torch.__file__).parent, sysconfig.get_paths()["stdlib"],
                                             sysconfig.get_paths()["platstdlib"]})


@dataclass(frozen=True)
class OurFrame:
    """Where in our code an error was raised: file (relative to the repository), line, function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def our_frame(error: BaseException, drivers: frozenset[str] = frozenset()) -> OurFrame | None:
    """The frame of our code that raised ``error`` (or an exception it was raised from or while
    handling), or None when the model, a library or torch's tracer raised it. ``drivers``: the
    qualified names (``co_qualname``) of our functions that only call the tracer."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _innermost_ours(current.__traceback__, drivers)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _innermost_ours(tb: types.TracebackType | None, drivers: frozenset[str]) -> OurFrame | None:
    frames = [(frame, line) for frame, line in traceback.walk_tb(tb)]
    deciding = [(i, frame, line) for i, (frame, line) in enumerate(frames) if not _is_neutral(frame)]
    if not deciding:
        return None
    index, frame, line = deciding[-1]
    path = _path(frame)
    if path is None or not any(path.is_relative_to(package) for package in OUR_PACKAGES):
        return None
    is_driver = frame.f_code.co_qualname in drivers
    if is_driver and index != len(frames) - 1:  # raised below the driver, in torch: the tracer's error
        return None
    return OurFrame(str(path.relative_to(_ROOT)), line, frame.f_code.co_qualname)


def _path(frame: types.FrameType) -> Path | None:
    name = frame.f_code.co_filename
    if name.startswith("<"):  # "<frozen ...>", "<string>", fx's "<eval_with_key>": generated code
        return None
    return Path(name).resolve()


def _is_neutral(frame: types.FrameType) -> bool:
    path = _path(frame)
    return path is None or any(path.is_relative_to(p) for p in _NEUTRAL)
