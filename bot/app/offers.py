"""What plugins offer, collected and checked: providers, judges and named items.

A plugin's wrong or duplicate offer is logged and ignored here, so one bad
plugin never stops the others from loading.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from bot.config.settings import Settings, SetupError
from bot.contracts.judge import Judge
from bot.contracts.providers import ProviderSpec
from bot.contracts.tools import Tool
from bot.pluginhost.manager import Offers, PluginHost

log = logging.getLogger("roost.app.offers")

T = TypeVar("T")


async def provider_specs(settings: Settings, host: PluginHost) -> dict[str, ProviderSpec]:
    """Every provider plugins offer, by name."""
    return {s.name: s for s in await host.hooks.roost_providers(settings=settings)}


async def resolve_provider(settings: Settings, host: PluginHost) -> ProviderSpec:
    """The configured provider's spec, or :class:`SetupError` saying what to set."""
    specs = await provider_specs(settings, host)
    spec = specs.get(settings.provider)
    if spec is None:
        raise SetupError(f"unknown provider {settings.provider!r}; set ROOST_PROVIDER to one "
                         f"of: {', '.join(sorted(specs))}")
    missing = spec.missing(settings)
    if missing:
        raise SetupError(missing)
    return spec


async def collect_judges(host: PluginHost, settings: Settings) -> dict[str, Judge]:
    """The judges plugins offer, by name (``llm`` is the built-in type's and reserved)."""
    judges: dict[str, Judge] = {}
    for plugin, judge in (await host.hooks.roost_judges(settings=settings)).named:
        name = judge.name
        if name == "llm" or name in judges:
            log.error("plugin %s: judge name %r is taken; ignored", plugin, name)
        else:
            judges[name] = judge
    return judges


def apply_tool_groups(tools: dict[str, Tool], groups: dict[str, str]) -> None:
    """A tool's own ``meta["group"]`` (``mcp:github``) replaces its plugin as its group."""
    for name, tool in tools.items():
        group = tool.meta.get("group")
        if isinstance(group, str) and group:
            groups[name] = group


def unique_by_name(offers: Offers[T], plugins: dict[str, str] | None = None) -> dict[str, T]:
    """What a hook offered, by name; a later duplicate name is refused and logged.

    ``plugins``, when given, is filled with item name -> the plugin that offered it.
    """
    items: dict[str, T] = {}
    for plugin, item in offers.named:
        name = str(getattr(item, "name", ""))
        if name in items:
            log.error("%s: duplicate name %r ignored", offers.hook, name)
            continue
        items[name] = item
        if plugins is not None:
            plugins[name] = plugin
    return items
