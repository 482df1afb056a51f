"""Writing files so that no reader ever sees half of one: write a temporary file in the same
folder, then rename it over the target (a rename within a folder is atomic)."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file, then rename."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=folder)
    try:
        with os.fdopen(handle, "wb" if isinstance(data, bytes) else "w") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private; these are ordinary files
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
