"""The web plugin's settings: its ``[plugins."plugins.web"]`` table."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from roost import Settings

PLUGIN_NAME = "plugins.web"


class WebConfig(BaseModel):
    """``[plugins."plugins.web"]``: web_fetch, and web_search when a backend is configured."""

    model_config = ConfigDict(extra="forbid")

    allow_private: list[str] = Field(default_factory=list)
    """CIDRs web_fetch may reach although they are loopback, private, link-local or
    otherwise not public (self-hosted sites), e.g. ``["10.0.0.0/8"]`` (comma-separated
    in the env); empty: public addresses only."""
    fetch_max_bytes: int = Field(5_000_000, ge=1)
    """A response body larger than this is refused (the download stops there)."""
    fetch_timeout: float = Field(20.0, gt=0)
    """Seconds for one fetch, redirects and download included (also each search request)."""
    max_redirects: int = Field(5, ge=0)
    """Redirects web_fetch follows, each checked like the first URL."""
    search_backend: str | None = None
    """The search backend web_search uses (``searxng``, ``brave``, ``tavily`` or a
    plugin's); unset: the first configured one. None configured: no web_search."""
    searxng_url: str | None = None
    """A SearXNG instance with the JSON format enabled, e.g. ``http://searx.lan:8080``."""
    brave_api_key: SecretStr | None = None
    """``BRAVE_API_KEY``: the Brave Search API as web_search's backend."""
    brave_api_base: str = "https://api.search.brave.com"
    """The Brave Search API's address."""
    tavily_api_key: SecretStr | None = None
    """``TAVILY_API_KEY``: Tavily as web_search's backend."""
    tavily_api_base: str = "https://api.tavily.com"
    """The Tavily API's address."""

    @field_validator("allow_private", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("allow_private")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not a CIDR such as 10.0.0.0/8") from None
        return value


def web_config(settings: Settings) -> WebConfig:
    """The web table of ``settings`` (defaults where it is absent); raises on a bad value."""
    return WebConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
