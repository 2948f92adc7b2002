"""Roost names for MCP tools: ``<server>__<tool>``, safe for every provider.

Providers accept tool names of at most 64 characters from ``[a-zA-Z0-9_-]``.
Other characters become ``_``; a name still too long is cut and given a short
hash of the full name, so the same tool always gets the same name and two
long names that share a beginning do not collide.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container, Iterable

MAX_NAME = 64
SEPARATOR = "__"

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_CHARS = 8


def tool_name(server: str, tool: str) -> str:
    """The Roost name of MCP tool ``tool`` of server ``server``."""
    full = f"{server}{SEPARATOR}{tool}"
    safe = _UNSAFE.sub("_", full)
    return safe if len(safe) <= MAX_NAME else _shortened(safe, full)


def _shortened(safe: str, full: str) -> str:
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{safe[:MAX_NAME - _HASH_CHARS - 1]}_{digest}"


def tool_names(server: str, tools: Iterable[str],
               taken: Container[str] = ()) -> dict[str, str]:
    """Roost name -> MCP name for every tool of ``server``, collisions resolved.

    Two MCP names can map to one Roost name (``a.b`` and ``a_b``), and so can two
    servers (``a`` with ``b__c``, ``a__b`` with ``c``; ``taken`` holds the names
    already given): the later one gets a hash suffix of its server and name,
    which is stable across listings.
    """
    names: dict[str, str] = {}
    for tool in tools:
        name = tool_name(server, tool)
        if name in names or name in taken:
            name = _shortened(name[:MAX_NAME - _HASH_CHARS - 1], f"{server}\0{tool}")
        names[name] = tool
    return names
