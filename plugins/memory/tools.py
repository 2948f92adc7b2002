"""The memory tools: ``memory_search`` (BM25 over the index) and ``memory_get`` (a slice)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from plugins.memory.config import memory_config
from plugins.memory.index import MemoryIndex, read_memory
from roost import Services, Settings, Tool, ToolContext, ToolError, check_keys, int_arg, str_arg

DEFAULT_RESULTS = 5
MAX_RESULTS = 20
DEFAULT_GET_LINES = 200
MAX_GET_LINES = 1_000
MAX_GET_CHARS = 20_000
"""``memory_get`` stops at a line boundary before this many characters."""


def memory_tools(settings: Settings, services: Services) -> list[Tool]:
    """``memory_search`` and ``memory_get``, over the plugin's FTS5 index."""
    store = services.sessions
    cap = memory_config(settings).max_file_bytes
    index = MemoryIndex(store.db, store.lock, settings.workspaces_dir, cap)

    async def memory_search(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("query",), optional=("limit",))
        query = str_arg(args, "query").strip()
        limit = min(int_arg(args, "limit", DEFAULT_RESULTS, minimum=1), MAX_RESULTS)
        if not query:
            raise ToolError("'query' must not be empty", code="INVALID_ARGUMENT")
        hits = await index.search(context.workspace, query, limit)
        if not hits:
            return (f"No memory matches {query!r}. Try other words (names, topics, dates "
                    "like 2026-11-20), or list_files memory/.")
        lines = [f"{len(hits)} match(es) for {query!r}, best first:"]
        for n, hit in enumerate(hits, 1):
            span = (f"line {hit.start_line}" if hit.start_line == hit.end_line
                    else f"lines {hit.start_line}-{hit.end_line}")
            lines.append(f"{n}. {hit.path} {span} (score {hit.score:.2f})\n   {hit.snippet}")
        lines.append("Read more with memory_get (path, from_line).")
        return "\n".join(lines)

    async def memory_get(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path",), optional=("from_line", "lines"))
        path = str_arg(args, "path")
        start = int_arg(args, "from_line", 1, minimum=1)
        count = min(int_arg(args, "lines", DEFAULT_GET_LINES, minimum=1), MAX_GET_LINES)
        display, text, _ = await asyncio.to_thread(read_memory, context.workspace, path, cap)
        return _slice(display, text.splitlines(), start, count)

    return [
        Tool(
            name="memory_search",
            read_only=True,
            description=(
                "Keyword search of your memory (MEMORY.md, memory/*.md). Returns the best "
                "passages first: path, line range, snippet. Use before answering about past "
                "conversations, people, decisions, preferences or dates."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Keywords."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                              "description": f"Default {DEFAULT_RESULTS}."},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            execute=memory_search,
        ),
        Tool(
            name="memory_get",
            read_only=True,
            description=(
                "Read lines of MEMORY.md or memory/<name>.md (e.g. a memory_search hit). "
                "For other files use read_file."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "e.g. 'memory/2026-01-31.md'."},
                    "from_line": {"type": "integer", "minimum": 1,
                                  "description": "First line (default 1)."},
                    "lines": {"type": "integer", "minimum": 1, "maximum": MAX_GET_LINES,
                              "description": f"Default {DEFAULT_GET_LINES}."},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            execute=memory_get,
        ),
    ]


def _slice(display: str, lines: Sequence[str], start: int, count: int) -> str:
    total = len(lines)
    if not total:
        return f"({display} is empty)"
    if start > total:
        raise ToolError(f"from_line {start} is past the end of {display} ({total} lines)",
                        code="INVALID_ARGUMENT")
    shown: list[str] = []
    size = 0
    for line in lines[start - 1:start - 1 + count]:
        if shown and size + len(line) + 1 > MAX_GET_CHARS:
            break
        shown.append(line)
        size += len(line) + 1
    end = start + len(shown) - 1
    text = "\n".join(shown)
    if len(text) > MAX_GET_CHARS:  # one enormous line
        text = text[:MAX_GET_CHARS] + " [... line cut]"
    footer = (f"\n[{total - end} more line(s): memory_get from_line={end + 1}]"
              if end < total else "")
    return f"{display} lines {start}-{end} of {total}:\n{text}{footer}"
