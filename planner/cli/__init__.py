"""The command line, ``plan-checkpoints`` (docs/contract.md, "The command line").

``command``: the entry point and the planning command; ``show``: ``plan-checkpoints show``, a plan
file's memory profile (``plots``: its figures); ``maxbatch``: ``--max-batch``; ``modelfile``: loading
a model file; ``progress`` and ``timebound``: progress lines and ``--*-time-limit``. The sweep tool,
``plan-checkpoints batch``, is planner/sweep/. Nothing here imports torch until a command needs it.
"""

from .command import main

__all__ = ["main"]
