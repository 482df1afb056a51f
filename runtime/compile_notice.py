"""Dynamo's ``context_fn`` notice, not shown for a native plan's own save policies.

torch.compile logs, once per process, "Detected that context_fn is passed to torch.utils.checkpoint
under torch.compile. Please make sure the checkpointed region does not contain in-place ops"
(``torch._higher_order_ops.wrap``, ``tag_activation_checkpoint_impl``) for any checkpoint called
with a ``context_fn``. A region with a save policy (runtime/save_policies.py) passes one; the
notice then appeared in every compiled run with a ``+draws`` region, asking the user about regions
they did not write, whose in-place draws the policy handles by design. :func:`quiet_for_save_policies`
adds a filter to that logger that drops the record when the ``context_fn`` being compiled is one of
ours (found in the compiling frame), and keeps it for any other.

Caveat: PyTorch emits the notice through a cached ``warning_once``; once our region has consumed
it, a user's own ``context_fn`` compiled later in the same process does not get it either.
"""

from __future__ import annotations

import functools
import logging
import sys

LOGGER = "torch._higher_order_ops.wrap"
_MESSAGE = "Detected that context_fn is passed to torch.utils.checkpoint under torch.compile"
_COMPILING_FRAME = "tag_activation_checkpoint_impl"


def _is_save_policy_context(context_fn) -> bool:
    from .save_policies import SavePolicy

    return (isinstance(context_fn, functools.partial) and bool(context_fn.args)
            and isinstance(context_fn.args[0], SavePolicy))


class SavePolicyNoticeFilter(logging.Filter):
    """Drops dynamo's ``context_fn`` notice for a context function of a native save policy."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _MESSAGE not in str(record.msg):
            return True
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code.co_name == _COMPILING_FRAME:
                return not _is_save_policy_context(frame.f_locals.get("context_fn"))
            frame = frame.f_back
        return True


def quiet_for_save_policies() -> None:
    """Add :class:`SavePolicyNoticeFilter` to dynamo's logger, once per process."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, SavePolicyNoticeFilter) for f in logger.filters):
        logger.addFilter(SavePolicyNoticeFilter())


__all__ = ["LOGGER", "SavePolicyNoticeFilter", "quiet_for_save_policies"]
