"""Progress lines on a terminal, silence elsewhere (logs and pipes stay clean)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator, TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    @contextmanager
    def task(self, text: str) -> Iterator[None]:
        """Print ``text...`` before and ``done in N s`` after a step that can take a while."""
        started = time.perf_counter()
        if self.enabled:
            print(f"{text}...", end="", file=self.stream, flush=True)
        try:
            yield
        except BaseException:
            if self.enabled:
                print(" failed", file=self.stream, flush=True)
            raise
        if self.enabled:
            print(f" done in {time.perf_counter() - started:.1f} s", file=self.stream, flush=True)
