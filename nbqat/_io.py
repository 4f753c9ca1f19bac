"""Atomic file writes: the one place that writes a file by temporary file + rename.

A file nbqat writes (a checkpoint, the exported ONNX model, forecasts) is either complete or
absent: it is written to a temporary file in the same folder, flushed to disk, then renamed over
the target (``os.replace``, atomic on POSIX and Windows); on any error the temporary file is
removed and nothing is left at the target.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["atomic_open"]


def _umask() -> int:
    """The process umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "wb", *, prefix: str = ".nbqat-", **kwargs: Any
) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on a clean exit it replaces ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The target; its folder must exist.
    mode : str, default "wb"
        ``"wb"`` or ``"w"`` (text).
    prefix : str, default ".nbqat-"
        Prefix of the temporary file's name.
    **kwargs
        Passed to :func:`os.fdopen` (e.g. ``newline=""`` for csv).

    Yields
    ------
    file object
        Write to it; it is flushed, fsynced and renamed over ``path`` when the block ends.
        The file gets the mode a plain ``open()`` would give (``0o666 & ~umask``: 0644 under
        umask 022), not :func:`tempfile.mkstemp`'s 0600.

    Raises
    ------
    FileNotFoundError
        When the folder of ``path`` does not exist.
    IsADirectoryError
        When ``path`` is a folder.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # named here: mkstemp's error names the temporary file
        raise FileNotFoundError(f"{os.fspath(path)!r}: the folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{os.fspath(path)!r} is a folder: pass a file name")
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() honours the umask
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
