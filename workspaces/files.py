"""Putting received files into a workspace: safe names, no overwrites, no duplicates."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import unicodedata
import uuid
from pathlib import Path

from bot.contracts.tools import ToolError
from workspaces.beneath import make_dirs, open_beneath, read_fd, unlink_at
from workspaces.root import WorkspaceRoot

MAX_FILE_NAME = 100
"""Longest file name :func:`safe_file_name` produces (bytes on disk stay well under 255)."""

_UNSAFE_NAME = re.compile(r"[^\w.\- ()+,=@\[\]]", re.UNICODE)
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)),
             *(f"LPT{i}" for i in range(10))}


def safe_file_name(name: str, fallback: str = "file") -> str:
    """A file name that is safe to create anywhere: ``../../etc/passwd`` → ``passwd``.

    Only the last path component is kept (``/`` and ``\\`` both count);
    letters and digits of any script survive (NFC-normalized), other
    characters become ``_``; leading dots and spaces go (no hidden files), a
    Windows device name gets a ``_``, and a long name is cut to
    :data:`MAX_FILE_NAME` characters keeping its extension. ``fallback`` is
    used when nothing is left.
    """
    base = re.split(r"[/\\]", unicodedata.normalize("NFC", name))[-1]
    base = _UNSAFE_NAME.sub("_", base).strip(" .")
    base = re.sub(r"_{2,}", "_", base)
    if not base or set(base) <= {"_", "-", "."}:
        base = fallback
    stem, dot, ext = base.rpartition(".")
    if not dot:
        stem, ext = base, ""
    if stem.upper() in _RESERVED:
        stem += "_"
    ext = ext[:16]
    suffix = f".{ext}" if ext else ""
    stem = stem[: MAX_FILE_NAME - len(suffix)] or "file"
    return stem + suffix


def _numbered(name: str, number: int) -> str:
    if number == 1:
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return f"{name}-{number}"
    return f"{stem}-{number}.{ext}"


def store_file(workspace: Path, directory: str, name: str, data: bytes,
               max_tries: int = 1000) -> str:
    """Write ``data`` as ``<directory>/<name>`` in ``workspace``; returns the relative path.

    ``name`` must already be safe (:func:`safe_file_name`). An existing file is
    never overwritten: ``-2``, ``-3``... is added before the extension. A file
    with the same name (or a numbered one) and identical bytes is reused
    instead, so a run executed again after a crash does not store a second
    copy. The file appears whole or not at all (written aside, then linked in
    place, which also settles a race between two writers of one name).
    Raises :class:`~bot.contracts.tools.ToolError` if the directory is not
    inside the workspace (a symlink pointing out, say).
    """
    return store_file_at(workspace, directory, name, data, max_tries)[0]


def store_file_at(workspace: Path, directory: str, name: str, data: bytes,
                  max_tries: int = 1000) -> tuple[str, Path]:
    """:func:`store_file`, also returning the stored file's absolute path.

    Everything happens relative to the directory's descriptor, opened below the
    workspace without following a link (a link the user made inside is resolved
    first, :class:`~workspaces.root.WorkspaceRoot`); the file is written aside,
    synced, its pages dropped from the page cache (nothing reads them soon), and
    linked into place under a free name.
    """
    with WorkspaceRoot(workspace, create=True) as root:
        parts = root.resolve(root.parts(directory), directory)
        try:
            dir_fd = make_dirs(root.fd, parts)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"{directory!r} is a link that leads outside your workspace",
                                code="PATH_ESCAPE") from None
            raise
    temp = f".incoming-{uuid.uuid4().hex}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                # Fresh page-cache pages cost ~2 ms per MB to fill on a VM; reused ones less.
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        shown = "/".join(parts)
        for number in range(1, max_tries + 1):
            candidate = _numbered(name, number)
            where = (workspace.joinpath(*parts, candidate))
            try:
                os.link(temp, candidate, src_dir_fd=dir_fd, dst_dir_fd=dir_fd,
                        follow_symlinks=False)
            except FileExistsError:
                if _same(dir_fd, candidate, data):
                    return f"{shown}/{candidate}", where
                continue
            return f"{shown}/{candidate}", where
        raise ToolError(f"{directory} holds too many files named like {name}",
                        code="INVALID_PATH")
    finally:
        with contextlib.suppress(OSError):
            unlink_at(dir_fd, temp)
        os.close(dir_fd)


def _same(dir_fd: int, name: str, data: bytes) -> bool:
    """Whether ``name`` is a regular file (not a link) holding exactly ``data``."""
    try:
        fd = open_beneath(dir_fd, (name,), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        return read_fd(fd, len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)
