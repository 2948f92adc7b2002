"""Small workspace files read on every run, cached until they change."""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("roost.workspaces.cache")

_CACHE_SIZE = 4096
_cache: OrderedDict[str, tuple[tuple[int, int, int], str]] = OrderedDict()


def read_cached(path: Path | str, max_chars: int, *, within: Path | str | None = None) -> str:
    """The stripped text of ``path`` (at most ``max_chars``), or '' if unreadable.

    A stat is far cheaper than a read; the (inode, mtime, size) stamp changes
    on an edit by hand and on the atomic replace the file tools do.
    ``within``: the file must resolve inside this directory (a workspace): a
    symbolic link that leads out of it reads as '' (and is logged), exactly as
    the file tools refuse it.
    """
    key = os.fspath(path)
    try:
        st = os.lstat(key)
        if stat.S_ISLNK(st.st_mode):
            if within is not None and not is_within(key, within):
                log.warning("%s is a link that leads out of its workspace; not read",
                            os.path.basename(key))
                return ""
            st = os.stat(key)
    except OSError:
        return ""
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _cache.get(key)
    if hit is not None and hit[0] == stamp:
        _cache.move_to_end(key)
        return hit[1]
    try:
        with open(key, encoding="utf-8", errors="replace") as f:
            text = f.read(max_chars + 1)
    except OSError:
        return ""
    text = clip(text.strip(), max_chars, f"{os.path.basename(key)} is {st.st_size:,} bytes")
    # Every new workspace starts from the same templates: one copy of each text
    # serves them all (a new session held ~12 KB of duplicates without this).
    text = sys.intern(text)
    _cache[key] = (stamp, text)
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return text


def is_within(path: Path | str, root: Path | str) -> bool:
    """Whether ``path``, every link followed, lands inside ``root``."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def clip(text: str, limit: int, why: str) -> str:
    """``text`` cut to about ``limit`` characters (at a line end if one is near), marked."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    if cut < limit * 4 // 5:
        cut = limit
    return f"{text[:cut].rstrip()}\n[... truncated: {why}]"
