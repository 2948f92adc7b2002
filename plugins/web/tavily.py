"""Tavily: a search API for agents, ``POST /search`` with a bearer key."""

from __future__ import annotations

from plugins.web._backend import plain, request_json
from roost import SearchResult

__all__ = ["TavilyBackend"]

MAX_COUNT = 20
"""Tavily's largest ``max_results``."""


class TavilyBackend:
    """Searches through Tavily (``tavily_api_key``; ``tavily_api_base`` for tests)."""

    name = "tavily"

    def __init__(self, api_key: str, *, base_url: str = "https://api.tavily.com",
                 timeout: float = 20.0) -> None:
        self._key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:  # never the key
        return f"TavilyBackend(base_url={self.base_url!r})"

    async def search(self, query: str, count: int) -> list[SearchResult]:
        """A basic-depth search; ``content`` is Tavily's extract of each page."""
        data = await request_json(
            "Tavily", "POST", f"{self.base_url}/search", limit=self.timeout,
            key_setting="tavily_api_key",
            json={"query": query, "max_results": min(count, MAX_COUNT),
                  "search_depth": "basic", "include_answer": False},
            headers={"Authorization": f"Bearer {self._key}"})
        results = data.get("results")
        found = [SearchResult(plain(r.get("title") or r["url"], 200), str(r["url"]),
                              plain(r.get("content")))
                 for r in results if isinstance(r, dict) and isinstance(r.get("url"), str)] \
            if isinstance(results, list) else []
        return found[:count]
