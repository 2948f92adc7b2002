"""Small workspace files read on every run, cached until they change."""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections import OrderedDict
from pathlib import Path

from bot.contracts.tools import ToolError
from workspaces.beneath import read_fd
from workspaces.root import WorkspaceRoot

log = logging.getLogger("roost.workspaces.cache")

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
