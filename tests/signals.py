"""Helpers for the tests that send Ctrl-C (SIGINT) to a subprocess."""

import signal


def default_sigint() -> None:
    """``preexec_fn`` for such a subprocess: SIGINT's default action. A test run started in the
    background by a non-interactive shell (``cmd &``) ignores SIGINT; children inherit that, and
    Python then installs no KeyboardInterrupt handler, so the Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
