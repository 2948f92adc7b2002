"""Web search backends: what the ``roost_search_backends`` hook offers ``web_search``.

A backend turns a query into a few results. Roost ships SearXNG, Brave Search and
Tavily (``plugins/web``); a plugin adds another by returning a
:class:`SearchBackend` from ``roost_search_backends`` when it is configured. The
``search_backend`` of ``[plugins."plugins.web"]`` names the one to use (else the first offered).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["SearchBackend", "SearchResult"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One hit: its title, its URL and a short extract of the page (plain text)."""

    title: str
    url: str
    snippet: str = ""


@runtime_checkable
class SearchBackend(Protocol):
    """A search engine ``web_search`` can ask.

    ``name`` is what ``search_backend`` selects it by. ``search`` returns at
    most ``count`` results, best first, and raises :class:`bot.contracts.tools.ToolError`
    for failures the model should read (``retryable=True`` for those worth
    another try: timeouts, rate limits, 5xx). Never put the API key in an error.
    """

    name: str

    async def search(self, query: str, count: int) -> Sequence[SearchResult]:
        """Up to ``count`` results for ``query``, best first."""
        ...
