"""A workspace opened as a directory descriptor: every user path is opened below it once.

:class:`WorkspaceRoot` is how tools, prompt sections and media reach a user's
files. A path is checked (:func:`workspaces.beneath.split_path`), links the
user made that stay inside are resolved explicitly
(:func:`workspaces.beneath.resolve_links`), and the result is opened with no
link followed at any component; everything after works on the descriptor.
Failures raise :class:`~bot.contracts.tools.ToolError` with the codes of the
file tools (``INVALID_ARGUMENT``, ``INVALID_PATH``, ``PATH_ESCAPE``) or the
:class:`OSError` of the open for the caller to word (``NOT_FOUND`` and so on).

:func:`read_cached` reads the small workspace files every run reads (``USER.md``,
``AGENTS.md``...) through a root, cached until the open file's stamp changes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from collections import OrderedDict
from pathlib import Path
from types import TracebackType

from bot.contracts.tools import ToolError
from workspaces.beneath import (
    Parts,
    PathRefused,
    open_beneath,
    open_root,
    read_fd,
    resolve_links,
    split_path,
)

log = logging.getLogger("roost.workspaces.cache")

_ATTEMPTS = 3
"""Opens tried per path: a link swapped in after resolving makes the next one re-resolve."""


def user_parts(user_path: object) -> Parts:
    """``user_path`` checked and split; raises :class:`ToolError` (``INVALID_ARGUMENT``,
    ``INVALID_PATH``, ``PATH_ESCAPE``)."""
    if not isinstance(user_path, str):
        raise ToolError(f"path must be a string, got {type(user_path).__name__}",
                        code="INVALID_ARGUMENT")
    try:
        return split_path(user_path)
    except PathRefused as exc:
        raise ToolError(str(exc), code="PATH_ESCAPE" if exc.escape else "INVALID_PATH") from None


class WorkspaceRoot:
    """An open workspace directory; use as a context manager (it holds a descriptor).

    ``follow`` (default ``True``) lets :meth:`open` and :meth:`resolve` take the
    links a user made that point inside the workspace; ``False`` refuses any link.
    ``create`` makes the workspace directory first if it is missing.
    """

    def __init__(self, workspace: Path | str, *, follow: bool = True,
                 create: bool = False) -> None:
        self.where = os.fspath(workspace)
        self.follow = follow
        if create:
            # The workspace itself is the operator's path (its parents are Roost's).
            os.makedirs(self.where, exist_ok=True)
        self.fd = open_root(self.where)
        self._roots: tuple[str, ...] | None = None

    def __enter__(self) -> WorkspaceRoot:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the workspace's descriptor (descriptors opened below it stay open)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def parts(self, user_path: object) -> Parts:
        """``user_path`` checked and split (:func:`user_parts`)."""
        return user_parts(user_path)

    def resolve(self, parts: Parts, shown: str) -> Parts:
        """``parts`` with the links on the way resolved (they must stay inside)."""
        if not self.follow:
            raise ToolError(f"path {shown!r} goes through a link; links are not followed "
                            "here", code="PATH_ESCAPE")
        if self._roots is None:
            self._roots = tuple(dict.fromkeys((self.where, os.path.realpath(self.where))))
        try:
            return resolve_links(self.fd, parts, root_paths=self._roots)
        except PathRefused as exc:
            raise ToolError(f"path {shown!r} is outside your workspace",
                            code="PATH_ESCAPE") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"path {shown!r} cannot be resolved: too many links",
                                code="INVALID_PATH") from None
            raise

    def open(self, user_path: str | Parts, flags: int = os.O_RDONLY,
             mode: int = 0o644) -> tuple[int, Parts]:
        """Open ``user_path`` below the workspace once: ``(descriptor, resolved parts)``.

        A read-only open does not block on a FIFO (``O_NONBLOCK``): check the
        descriptor's type with :func:`os.fstat`; with ``O_DIRECTORY`` anything but a
        directory raises :class:`NotADirectoryError`. The caller closes the descriptor.
        """
        parts = user_path if isinstance(user_path, tuple) else self.parts(user_path)
        shown = user_path if isinstance(user_path, str) else "/".join(user_path)
        directory = bool(flags & os.O_DIRECTORY)
        if flags & (os.O_WRONLY | os.O_RDWR) == 0:
            # O_DIRECTORY is checked on the descriptor: with it, a link as the last
            # name fails with ENOTDIR, not ELOOP, and would pass for a file.
            flags = (flags & ~os.O_DIRECTORY) | os.O_NONBLOCK | os.O_NOCTTY
        for attempt in range(_ATTEMPTS):
            try:
                fd = open_beneath(self.fd, parts, flags, mode)
                if directory and not stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
                return fd, parts
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EXDEV) or attempt == _ATTEMPTS - 1:
                    if exc.errno in (errno.ELOOP, errno.EXDEV):
                        raise ToolError(f"path {shown!r} is a link that changed while it "
                                        "was opened, or leads outside your workspace",
                                        code="PATH_ESCAPE") from None
                    raise
            parts = self.resolve(parts, shown)
        raise AssertionError("unreachable")

    def display(self, parts: Parts) -> str:
        """How a resolved path is shown: workspace-relative, ``.`` for the root."""
        return "/".join(parts) or "."


# -- small files read on every run, cached until they change ------------------------------

_CACHE_SIZE = 4096
_cache: OrderedDict[str, tuple[tuple[int, int, int, int], str]] = OrderedDict()


def read_cached(path: Path | str, max_chars: int, *, within: Path | str | None = None,
                root: WorkspaceRoot | None = None) -> str:
    """The stripped text of ``path`` (at most ``max_chars``), or '' if unreadable.

    The file is opened once and everything after works on that descriptor: the
    cached text is used only when the (device, inode, mtime, size) stamp of the
    open file matches the one it was read with, so a path swapped between two
    calls can never serve text of another file. ``within``: the file is opened
    below this directory (a workspace) with no link followed at open
    (:class:`workspaces.root.WorkspaceRoot`); a link the user made that stays
    inside is resolved, one that leads out reads as '' (and is logged). ``root``:
    ``within`` already open (several files of one workspace read in a row).
    """
    key = os.fspath(path)
    try:
        fd = _open(key, within, root)
    except ToolError as exc:
        log.warning("%s not read: %s", os.path.basename(key), exc)
        return ""
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        hit = _cache.get(key)
        if hit is not None and hit[0] == stamp:
            _cache.move_to_end(key)
            return hit[1]
        data = read_fd(fd, 4 * (max_chars + 1))
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")[:max_chars + 1]
    text = clip(text.strip(), max_chars, f"{os.path.basename(key)} is {st.st_size:,} bytes")
    # Every new workspace starts from the same templates: one copy of each text
    # serves them all (a new session held ~12 KB of duplicates without this).
    text = sys.intern(text)
    _cache[key] = (stamp, text)
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return text


def _open(key: str, within: Path | str | None, root: WorkspaceRoot | None) -> int:
    """A read-only descriptor of ``key``: below ``within`` without following links there."""
    if within is None:
        return os.open(key, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    base = os.fspath(within).rstrip(os.sep) or os.sep
    if not key.startswith(base + os.sep):
        raise ToolError(f"{key!r} is not inside {base!r}", code="PATH_ESCAPE")
    if root is not None:
        return root.open(key[len(base) + 1:])[0]
    with WorkspaceRoot(base) as opened:
        return opened.open(key[len(base) + 1:])[0]


def clip(text: str, limit: int, why: str) -> str:
    """``text`` cut to about ``limit`` characters (at a line end if one is near), marked."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    if cut < limit * 4 // 5:
        cut = limit
    return f"{text[:cut].rstrip()}\n[... truncated: {why}]"
