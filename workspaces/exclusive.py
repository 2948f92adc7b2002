"""One lock per workspace, for tools that must not run while another changes its files.

The ``exec`` sandbox can create links in a workspace; a tool that hands a workspace
path to a library that opens it (``sql``: SQLite opens its database and journals by
path) holds :func:`workspace_lock` so no ``exec`` call of that workspace runs meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from pathlib import Path

# Weak values: a lock lives while someone holds or waits for it.
_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


def workspace_lock(workspace: str | os.PathLike[str]) -> asyncio.Lock:
    """The lock of ``workspace`` (one per real path, shared by every caller in this process)."""
    key = os.path.realpath(Path(workspace))
    lock = _locks.get(key)
    if lock is None:
        lock = _locks[key] = asyncio.Lock()
    return lock
