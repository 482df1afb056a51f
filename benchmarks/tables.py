"""A benchmark's results as a Markdown table, printed and written to the file the docs quote."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.files import write_atomic  # noqa: E402


def markdown_table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def publish(text: str, out: str | None) -> None:
    """Print ``text`` and, when ``out`` is given, write it there (through a temporary file)."""
    print(text)
    if out:
        write_atomic(out, text)
