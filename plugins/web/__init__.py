"""Built-in plugin: the web tools, ``web_fetch`` and ``web_search``.

* ``web_fetch {url, max_chars?}`` (:mod:`plugins.web.fetch`) is always offered; it
  reaches public addresses only, unless ``allow_private`` allows a range
  (:mod:`plugins.web.ssrf`).
* ``web_search {query, count?}`` (:mod:`plugins.web.search`) is offered when a
  search backend is configured. The built-ins, through ``roost_search_backends``
  like any plugin's: SearXNG (``searxng_url``), Brave (``brave_api_key``) and
  Tavily (``tavily_api_key``). ``search_backend`` picks one by name; unset,
  the first configured (in that order) is used. All are keys of the plugin's
  ``[plugins."plugins.web"]`` table (:mod:`plugins.web.config`).
"""

from __future__ import annotations

from plugins.web.brave import BraveBackend
from plugins.web.config import WebConfig, web_config
from plugins.web.fetch import WebFetcher, default_max_chars, web_fetch_tool
from plugins.web.search import choose_backend, web_search_tool
from plugins.web.searxng import SearxngBackend
from plugins.web.tavily import TavilyBackend
from roost import SearchBackend, Services, Settings, Tool, hookimpl

__all__ = ["roost_plugin_config_model", "roost_search_backends", "roost_tools"]


@hookimpl
def roost_plugin_config_model() -> type[WebConfig]:
    """The ``[plugins."plugins.web"]`` table."""
    return WebConfig


@hookimpl
def roost_search_backends(settings: Settings) -> list[SearchBackend]:
    """The built-in backends whose URL or key is set."""
    config = web_config(settings)
    timeout = config.fetch_timeout
    backends: list[SearchBackend] = []
    if config.searxng_url:
        backends.append(SearxngBackend(config.searxng_url, timeout=timeout))
    if config.brave_api_key is not None and config.brave_api_key.get_secret_value():
        backends.append(BraveBackend(config.brave_api_key.get_secret_value(),
                                     base_url=config.brave_api_base, timeout=timeout))
    if config.tavily_api_key is not None and config.tavily_api_key.get_secret_value():
        backends.append(TavilyBackend(config.tavily_api_key.get_secret_value(),
                                      base_url=config.tavily_api_base, timeout=timeout))
    return backends


@hookimpl
def roost_tools(settings: Settings, services: Services) -> list[Tool]:
    """``web_fetch``, and ``web_search`` over the chosen backend when there is one."""
    tools = [web_fetch_tool(WebFetcher.from_settings(settings),
                            default_chars=default_max_chars(settings))]
    config = web_config(settings)
    backend = choose_backend(config.search_backend, services.search_backends)
    if backend is not None:
        tools.append(web_search_tool(backend, timeout=config.fetch_timeout))
    return tools
