"""Bound how long a phase of the command line may take (profiling), with SIGALRM.

The solvers keep their own time limits (solvers/clock.py); profiling runs the user's model, whose
time nothing else bounds. A POSIX interval timer raises :class:`PhaseTimeout` in the main thread at
the next Python bytecode after the limit: a long native op delays it until it returns, no more.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class PhaseTimeout(TimeoutError):
    """A phase of the command line ran past its time limit; the message says which and the limit."""


class _Expired(BaseException):
    """Raised by the timer inside the bounded code: a BaseException, so that the user's model code or
    the profiler's ``except Exception`` (which wraps a model's errors) cannot take it for theirs."""


@contextlib.contextmanager
def time_bound(seconds: float | None, message: str) -> Iterator[None]:
    """Raise :class:`PhaseTimeout` (``message``) if the block runs longer than ``seconds``; ``None``,
    or outside the main thread (where no signal can be delivered): no bound."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, 1e8))  # setitimer overflows on absurd values
    try:
        yield
    except _Expired:
        raise PhaseTimeout(message) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
