"""What the built-in search backends share: one JSON request, its failures as ToolErrors."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plugins.web._http import USER_AGENT, status_error, transport_error
from roost import ToolError, client_tls

if TYPE_CHECKING:
    import httpx

__all__ = ["plain", "request_json"]

_TAGS = re.compile(r"<[^>]+>")


async def request_json(name: str, method: str, url: str, *, limit: float,
                       key_setting: str | None = None, params: Mapping[str, Any] | None = None,
                       json: Mapping[str, Any] | None = None,
                       headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JSON object ``name``'s API answers; raises :class:`ToolError` on any failure.

    401 and 403 say the key was refused (naming ``key_setting``, never the key);
    other error answers carry the API's own explanation when it gives one.
    """
    import httpx  # here, not at start: most installations never search

    sent = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    try:
        async with httpx.AsyncClient(timeout=limit, verify=client_tls()) as client:
            response = await client.request(method, url, params=params, json=json,
                                            headers=sent)
    except httpx.HTTPError as exc:
        raise transport_error(f"the {name} request", exc, limit) from None
    if response.status_code in (401, 403) and key_setting is not None:
        raise ToolError(f"{name} refused the API key (HTTP {response.status_code}); "
                        f"an admin must check the {key_setting} setting", code="AUTH",
                        details={"status": response.status_code})
    if response.status_code >= 400:
        error = status_error(name, response)
        explanation = _explanation(response)
        if explanation:
            error = ToolError(f"{error}: {explanation}", code=error.code,
                              retryable=error.retryable, details=error.details)
        raise error
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ToolError(f"{name} answered something that is not a JSON object",
                        code="BAD_RESPONSE", retryable=True)
    return data


def plain(text: object, limit: int = 300) -> str:
    """``text`` without HTML tags or entities, on one line, at most ``limit`` characters."""
    flat = " ".join(html.unescape(_TAGS.sub("", str(text or ""))).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _explanation(response: httpx.Response) -> str:
    """The API's own words about an error (Brave's ``error.detail``, Tavily's
    ``detail.error``, FastAPI's ``detail``), at most 200 characters."""
    try:
        data = response.json()
    except ValueError:
        return ""
    found: object = None
    if isinstance(data, dict):
        error, detail = data.get("error"), data.get("detail")
        if isinstance(error, dict):
            found = error.get("detail") or error.get("message")
        elif isinstance(detail, dict):
            found = detail.get("error") or detail.get("message")
        else:
            found = detail or error or data.get("message")
    return plain(found, 200) if isinstance(found, str) else ""
