"""Writing files so that no reader ever sees half of one: write a temporary file in the same
folder, then rename it over the target (a rename within a folder is atomic).

Output paths are checked before any work (:func:`check_output`): a path that is one of the
command's inputs, a folder, a device, or in a folder that cannot be written is refused up front,
naming the user's path, never the hidden temporary file. A write that fails anyway (a full disk)
raises :class:`WriteError`, names the user's path, and leaves neither the temporary file nor a
changed target behind.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable


class WriteError(OSError):
    """An output file that cannot be written; the message names the user's path and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return self.args[0]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), what: str = "output",
                 option: str = "--out") -> str:
    """Refuse ``path`` before any work if writing it would destroy an input or cannot succeed.
    Creates nothing: a folder to be made is only checked to be makeable. Returns the path."""
    path = os.fspath(path)
    if not path or path.endswith(os.sep):
        raise WriteError(path or "''", f"{option} must name a file, not a folder")
    for source in inputs:
        if source is not None and os.path.exists(source) and os.path.exists(path) and _same_file(path, source):
            raise WriteError(path, f"it is the input {os.fspath(source)}; {option} must name another file "
                                   "(writing there would destroy the input)")
    if os.path.lexists(path):
        mode = os.stat(path).st_mode if os.path.exists(path) else 0
        if stat.S_ISDIR(mode):
            raise WriteError(path, f"it is a folder; {option} must name a file")
        if not stat.S_ISREG(mode):
            raise WriteError(path, f"it is not a regular file (a device, a pipe or a broken link); {option} "
                                   "must name an ordinary file, which is replaced whole")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise WriteError(path, f"{existing} is not a folder")
    if existing == folder:
        try:  # the only sure test of writability (root passes every os.access check)
            handle, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=folder)
        except OSError as error:
            raise WriteError(path, f"its folder {folder} cannot be written ({error.strerror or error})") from None
        os.close(handle)
        os.unlink(probe)
    else:  # the folder is to be made: try making one beside it (root passes every os.access check)
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tmp-probe-", dir=existing))
        except OSError as error:
            raise WriteError(path, f"its folder cannot be made in {existing} ({error.strerror or error})") from None
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file, then rename. Raises
    :class:`WriteError` naming ``path`` when that fails; the target is then unchanged."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(path) and not os.path.isfile(path):  # a folder, a device: never rename over it
        raise WriteError(path, "it is not a regular file")
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=folder)
    except OSError as error:
        raise WriteError(path, error.strerror or str(error)) from None
    try:
        with os.fdopen(handle, "wb" if isinstance(data, bytes) else "w") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private; these are ordinary files
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise WriteError(path, error.strerror or str(error)) from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
