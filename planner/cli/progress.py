"""Progress on stderr: on a terminal, ``Profiling Sequential... done in 1.2 s`` on one line per
phase; elsewhere (a log, a pipe, CI) one plain line as each phase starts, ``plan-checkpoints:
Profiling Sequential``, so that a long solve in a log says what it is doing. ``-q`` turns it off.
Errors and warnings are separate lines that start ``plan-checkpoints: error:`` / ``warning:``."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import TextIO
from collections.abc import Iterator

PREFIX = "plan-checkpoints: "


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None, terminal: bool | None = None):
        self.stream = stream or sys.stderr
        self.terminal = _isatty(self.stream) if terminal is None else terminal
        self.enabled = True if enabled is None else enabled

    def _print(self, text: str, end: str = "\n") -> None:
        try:
            print(text, end=end, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed pipe must not turn progress into a failure
            pass

    def note(self, text: str) -> None:
        if self.enabled:
            self._print(text if self.terminal else PREFIX + text)

    @contextmanager
    def task(self, text: str) -> Iterator[None]:
        """On a terminal, ``text...`` before and ``done in N s`` after a step that can take a while;
        elsewhere one line, ``plan-checkpoints: text``, as it starts."""
        started = time.perf_counter()
        if self.enabled:
            if self.terminal:
                self._print(f"{text}...", end="")
            else:
                self._print(PREFIX + text)
        try:
            yield
        except BaseException:
            if self.enabled and self.terminal:
                self._print(" failed")
            raise
        if self.enabled and self.terminal:
            self._print(f" done in {time.perf_counter() - started:.1f} s")


def is_progress_line(line: str) -> bool:
    """A line :class:`Progress` writes off a terminal (for tests and tools that read stderr)."""
    return line.startswith(PREFIX) and not line.startswith((PREFIX + "error:", PREFIX + "warning:"))
