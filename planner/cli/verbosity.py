"""The ``-v`` / ``-q`` options every subcommand shares (plan, ``show``, ``batch``) and what ``-v`` logs."""

from __future__ import annotations

import argparse
import logging
import sys


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="log what the solvers do on stderr (-vv: in detail)")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr, only errors and warnings")


def setup_logging(verbose: int) -> None:
    """-v: the tool's loggers (solvers.ilp, solvers.cpsat...) at INFO on stderr; -vv: DEBUG."""
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("plan-checkpoints: %(name)s: %(message)s"))
        for name in ("planner", "solvers", "profiler", "runtime"):
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            logger.setLevel(logging.INFO if verbose == 1 else logging.DEBUG)
