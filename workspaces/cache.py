"""Small workspace files read on every run, cached until they change."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

_CACHE_SIZE = 4096
_cache: OrderedDict[str, tuple[tuple[int, int, int], str]] = OrderedDict()


def read_cached(path: Path | str, max_chars: int) -> str:
    """The stripped text of ``path`` (at most ``max_chars``), or '' if unreadable.

    A stat is far cheaper than a read; the (inode, mtime, size) stamp changes
    on an edit by hand and on the atomic replace the file tools do.
    """
    key = os.fspath(path)
    try:
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
    _cache[key] = (stamp, text)
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return text


def clip(text: str, limit: int, why: str) -> str:
    """``text`` cut to about ``limit`` characters (at a line end if one is near), marked."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    if cut < limit * 4 // 5:
        cut = limit
    return f"{text[:cut].rstrip()}\n[... truncated: {why}]"
