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
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {os.path.basename(key)} truncated]"
    text = text.strip()
    _cache[key] = (stamp, text)
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return text
