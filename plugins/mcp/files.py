"""Files an MCP tool returned, written into the caller's workspace without a race.

:func:`save_new` creates ``mcp/<server>/<stem><extension>`` below the workspace
root: every directory is opened relative to the one before with ``O_NOFOLLOW``
(a link the model made in the workspace is refused, never followed), and the
file is created with ``O_CREAT | O_EXCL``, never over an existing one. A name
already taken (two results in the same second) gets the next free ``-1``,
``-2``... suffix, so each saved file keeps the content the model is told it holds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

__all__ = ["MAX_TRIES", "save_new"]

MAX_TRIES = 1_000
"""Suffixes tried before giving up (``EEXIST``)."""

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _component(name: str) -> str:
    """``name`` as one safe path component (no separator, never ``.`` or ``..``)."""
    cleaned = _UNSAFE.sub("_", name)[:100]
    return cleaned if cleaned.strip(".") else "_" + cleaned


def _subdirectory(parent: int, name: str) -> int:
    """The directory ``name`` in ``parent``, made if missing, opened without following a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=parent)
    return os.open(name, _DIRECTORY, dir_fd=parent)


def save_new(workspace: Path, server: str, stem: str, extension: str, data: bytes) -> str:
    """Write ``data`` to a new file ``mcp/<server>/<stem>[-n]<extension>`` below
    ``workspace``; the path written, relative to it. Raises :class:`OSError`."""
    folders = ["mcp", _component(server)]
    stem = _component(stem)
    fds = [os.open(workspace, _DIRECTORY)]
    try:
        for folder in folders:
            fds.append(_subdirectory(fds[-1], folder))
        for attempt in range(MAX_TRIES):
            name = f"{stem}{f'-{attempt}' if attempt else ''}{extension}"
            try:
                fd = os.open(name, _NEW_FILE, 0o666, dir_fd=fds[-1])
            except FileExistsError:
                continue
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fds[-1])
                raise
            return "/".join([*folders, name])
        raise OSError(errno.EEXIST, f"no free name for {stem}{extension} after {MAX_TRIES}")
    finally:
        for fd in fds:
            os.close(fd)
