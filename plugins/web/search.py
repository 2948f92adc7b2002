"""``web_search``: a query to the configured search backend, the hits as a numbered list."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from roost import (
    SearchBackend,
    SearchResult,
    Tool,
    ToolContext,
    ToolError,
    ToolRetry,
    check_keys,
    int_arg,
    str_arg,
)

__all__ = ["DEFAULT_COUNT", "MAX_COUNT", "choose_backend", "format_results", "web_search_tool"]

log = logging.getLogger("roost.plugins.web.search")

DEFAULT_COUNT = 5
MAX_COUNT = 10
MAX_QUERY = 400
"""Characters of query accepted (the APIs take about this much)."""


def choose_backend(wanted: str | None, offered: Iterable[SearchBackend]) -> SearchBackend | None:
    """The backend named ``wanted`` (the web table's ``search_backend``), else the first offered."""
    backends = list(offered)
    if wanted is None:
        return backends[0] if backends else None
    for backend in backends:
        if backend.name == wanted:
            return backend
    names = ", ".join(b.name for b in backends) or "none"
    log.warning("search_backend is %r, but no such backend is configured (configured: "
                "%s); web_search is not offered", wanted, names)
    return None


def format_results(query: str, backend: str, results: Sequence[SearchResult]) -> str:
    """``results`` as a compact numbered list: title, URL, snippet."""
    if not results:
        return f"No results for {query!r} ({backend})."
    lines = [f"Results for {query!r} ({backend}):"]
    for number, result in enumerate(results, 1):
        lines.append(f"{number}. {result.title or result.url}")
        lines.append(f"   {result.url}")
        if result.snippet:
            lines.append(f"   {result.snippet}")
    return "\n".join(lines)


def web_search_tool(backend: SearchBackend, *, timeout: float) -> Tool:
    """The ``web_search`` tool over ``backend``."""

    async def web_search(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("query",), optional=("count",))
        query = " ".join(str_arg(args, "query").split())
        if not query:
            raise ToolError("'query' is empty", code="INVALID_ARGUMENT")
        if len(query) > MAX_QUERY:
            raise ToolError(f"'query' is {len(query)} characters; keep it under {MAX_QUERY}",
                            code="INVALID_ARGUMENT")
        count = min(int_arg(args, "count", DEFAULT_COUNT, minimum=1), MAX_COUNT)
        results = list(await backend.search(query, count))[:count]
        return format_results(query, backend.name, results)

    return Tool(
        name="web_search",
        read_only=True,
        description=(
            "Search the web and get a numbered list of results (title, URL, snippet). "
            "Use web_fetch on a result's URL to read the page itself."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for."},
                "count": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT,
                          "description": f"How many results (default {DEFAULT_COUNT})."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        execute=web_search,
        timeout=timeout + 5.0,
        retry=ToolRetry(max_attempts=3, initial_delay=0.5, max_delay=2.0, max_total=10.0),
        meta={"backend": backend.name},
    )
