"""Brave Search API: ``GET /res/v1/web/search`` with the ``X-Subscription-Token`` header."""

from __future__ import annotations

from plugins.web._backend import plain, request_json
from roost import SearchResult

__all__ = ["BraveBackend"]

MAX_COUNT = 20
"""Brave returns at most 20 web results per request."""


class BraveBackend:
    """Searches the web through Brave (``brave_api_key``; ``brave_api_base`` for tests)."""

    name = "brave"

    def __init__(self, api_key: str, *, base_url: str = "https://api.search.brave.com",
                 timeout: float = 20.0) -> None:
        self._key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:  # never the key
        return f"BraveBackend(base_url={self.base_url!r})"

    async def search(self, query: str, count: int) -> list[SearchResult]:
        """Brave's web results (its ``description`` marks matches with HTML; removed)."""
        data = await request_json(
            "Brave Search", "GET", f"{self.base_url}/res/v1/web/search", limit=self.timeout,
            key_setting="brave_api_key", params={"q": query, "count": min(count, MAX_COUNT)},
            headers={"X-Subscription-Token": self._key})
        web = data.get("web")
        results = web.get("results") if isinstance(web, dict) else None
        found = [SearchResult(plain(r.get("title") or r["url"], 200), str(r["url"]),
                              plain(r.get("description")))
                 for r in results if isinstance(r, dict) and isinstance(r.get("url"), str)] \
            if isinstance(results, list) else []
        return found[:count]
