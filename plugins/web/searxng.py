"""SearXNG: a self-hosted metasearch engine, through its JSON API (``GET /search?format=json``).

The instance must allow the JSON format (``search.formats: [html, json]`` in its
``settings.yml``); otherwise it answers 403, which the error says.
"""

from __future__ import annotations

from plugins.web._backend import plain, request_json
from roost import SearchResult, ToolError

__all__ = ["SearxngBackend"]


class SearxngBackend:
    """Searches one SearXNG instance at ``base_url`` (``searxng_url``)."""

    name = "searxng"

    def __init__(self, base_url: str, *, timeout: float = 20.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    async def search(self, query: str, count: int) -> list[SearchResult]:
        """The first ``count`` results of the instance's first page."""
        try:
            data = await request_json("SearXNG", "GET", f"{self.base_url}/search",
                                      limit=self.timeout,
                                      params={"q": query, "format": "json", "pageno": 1})
        except ToolError as exc:
            if exc.code == "HTTP_403":
                raise ToolError("SearXNG refused the JSON API (HTTP 403): an admin must add "
                                "json to search.formats in its settings.yml",
                                code="HTTP_403") from None
            raise
        results = data.get("results")
        found = [SearchResult(plain(r.get("title") or r["url"], 200), str(r["url"]),
                              plain(r.get("content")))
                 for r in results if isinstance(r, dict) and isinstance(r.get("url"), str)] \
            if isinstance(results, list) else []
        return found[:count]
