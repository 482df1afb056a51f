"""What every method shares about how it is called: its options and its default time limit.

- :func:`check_options`: an option a method does not take is refused, by every method alike, with a
  ``TypeError`` that names the options it accepts (a misspelt ``slotz=3`` must not be ignored).
- :data:`DEFAULT_TIME_LIMIT`: the seconds a searching method (``ilp``, ``cpsat``, ``exhaustive``)
  takes when the caller gives no limit, so that no call runs unbounded.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable

from .schedule import Schedule

# Seconds a searching method may take when the caller gives no time limit (docs/solvers.md): long
# enough for the exact methods to prove optimality on the graphs of the benchmark that they can
# prove at all, short enough that a call never hangs (cpsat below the minimum budget of
# a 33-node graph ran for more than 600 s without a limit).
DEFAULT_TIME_LIMIT = 300.0

# The longest time limit accepted (seconds: a week). A larger one is no limit at all in practice
# (``1e308`` meant "never stop": CP-SAT below a model's minimum searched on for good), so it is
# refused, by solvers.solve, planner.plan and the command line alike (:func:`check_time_limit`).
MAX_TIME_LIMIT = 7 * 24 * 3600.0
TIME_LIMIT_FORMS = f"a positive number of seconds, at most {MAX_TIME_LIMIT:g} (a week)"

# The positional arguments of every method function; everything else it takes is an option.
_ARGUMENTS = ("graph", "budget", "time_limit")


def time_limit_or_default(time_limit: float | None) -> float:
    """The caller's limit (seconds), or :data:`DEFAULT_TIME_LIMIT` when none is given."""
    return DEFAULT_TIME_LIMIT if time_limit is None else float(time_limit)


def check_time_limit(time_limit, what: str = "time_limit") -> float | None:
    """``time_limit`` as seconds (a float), or ``None`` for the default. Raises ``ValueError`` saying
    what is accepted for anything else: not a real number, a bool, nan, 0 or less, or more than
    :data:`MAX_TIME_LIMIT` (infinity included), so that every limit is finite and kept."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) \
            or not 0 < float(time_limit) <= MAX_TIME_LIMIT:  # nan fails the comparison too
        shown = repr(time_limit) if len(repr(time_limit)) <= 40 else f"{repr(time_limit)[:24]}..."
        raise ValueError(f"{what} {shown} is not accepted: give {TIME_LIMIT_FORMS}, or none for the default "
                         f"({DEFAULT_TIME_LIMIT:g} s for the searching solvers)")
    return float(time_limit)


def accepted_options(function: Callable[..., Schedule]) -> list[str]:
    """The option names (keyword arguments besides graph, budget and time_limit) ``function`` takes."""
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters
            if p.name not in _ARGUMENTS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_options(method: str, function: Callable[..., Schedule], options: dict) -> None:
    """Raise ``TypeError`` naming the accepted options when ``options`` has one ``function`` does not take."""
    accepted = accepted_options(function)
    unknown = sorted(name for name in options if name not in accepted)
    if unknown:
        takes = ", ".join(f"{name}=" for name in ("time_limit", *accepted))
        raise TypeError(f"{method}: unknown option(s) {', '.join(map(repr, unknown))}; it accepts {takes}")
