"""Building the plugin manager and calling hooks safely from async code.

pluggy calls implementations synchronously and stops at the first exception;
Roost needs async implementations awaited and a failing plugin skipped, so
hooks are called through :meth:`PluginHost.call` instead of ``pm.hook.X()``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from bot import hookspecs

log = logging.getLogger("roost.plugins")

BUILTIN_PLUGINS: tuple[str, ...] = (
    "plugins.core_commands",
    "plugins.file_tools",
    "plugins.sql_tool",
    "plugins.error_tools",
    "plugins.prompt_sections",
    "plugins.guard_patterns",
    "plugins.providers",
    "plugins.channels",
    "plugins.sanitizers",
    "plugins.memory",
    "plugins.heartbeat",
    "plugins.cron",
)
"""Modules of the built-in plugins, registered like external ones."""

ENTRY_POINT_GROUP = "roost"


@dataclass(slots=True)
class PluginInfo:
    """Where a registered plugin came from."""

    name: str
    distribution: str = ""
    version: str = ""
    builtin: bool = False


@dataclass
class PluginHost:
    """The plugin manager plus what Roost knows about each plugin.

    ``errors`` maps a plugin name to its latest failure (import, validation or
    a hook that raised); ``disabled`` names plugins whose hooks are skipped.
    """

    pm: pluggy.PluginManager
    info: dict[str, PluginInfo] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)

    def register(self, plugin: object, name: str, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` under ``name`` (tests and embedders use this too)."""
        self.pm.register(plugin, name=name)
        self.info[name] = info or PluginInfo(name=name)

    def implementations(self, hook: str) -> list[pluggy.HookImpl]:
        """Enabled implementations of ``hook`` in pluggy's call order."""
        caller: pluggy.HookCaller = getattr(self.pm.hook, hook)
        return [i for i in reversed(caller.get_hookimpls()) if i.plugin_name not in self.disabled]

    async def call(self, hook: str, **kwargs: Any) -> list[Any]:
        """Call every enabled implementation of ``hook``, awaiting async ones.

        Returns the non-``None`` results in call order. An implementation that
        raises is logged with its plugin's name and skipped.
        """
        results: list[Any] = []
        for impl in self.implementations(hook):
            try:
                result = impl.function(*[kwargs[a] for a in impl.argnames])
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                self._failed(impl.plugin_name, hook, exc)
                continue
            if result is not None:
                results.append(result)
        return results

    async def collect(self, hook: str, **kwargs: Any) -> list[Any]:
        """Call ``hook`` and flatten results that are lists into one list."""
        items: list[Any] = []
        for result in await self.call(hook, **kwargs):
            if isinstance(result, list | tuple):
                items.extend(result)
            else:
                items.append(result)
        return items

    def _failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        self.errors[plugin] = f"{hook}: {type(exc).__name__}: {exc}"
        log.error("plugin %r raised in %s; skipped for this call", plugin, hook, exc_info=exc)


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def get_plugin_manager(
    *, load_entry_points: bool = True, env: Mapping[str, str] | None = None
) -> PluginHost:
    """Build the plugin host: specs, built-ins, then the ``roost`` entry points.

    Nothing happens at import time; every call builds a fresh manager, which
    keeps tests independent. ``ROOST_DISABLE_PLUGIN_AUTOLOAD=1`` skips external
    plugins. A plugin that fails to import or to validate is recorded in
    ``errors`` and left out; the others load.
    """
    env = os.environ if env is None else env
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm)
    for modname in BUILTIN_PLUGINS:
        module = importlib.import_module(modname)
        host.register(module, modname, PluginInfo(modname, "roost", _version("roost"), True))
    if load_entry_points and env.get("ROOST_DISABLE_PLUGIN_AUTOLOAD", "") not in ("1", "true"):
        for ep in _entry_points():
            dist = ep.dist.name if ep.dist else ""
            try:
                plugin = ep.load()
                host.register(plugin, ep.name, PluginInfo(ep.name, dist, _version(dist)))
            except Exception as exc:
                host.errors[ep.name] = f"load failed: {type(exc).__name__}: {exc}"
                log.error("plugin %r from %r failed to load", ep.name, dist, exc_info=exc)
    _check(host)
    return host


def _check(host: PluginHost) -> None:
    """Unregister plugins that implement hooks no spec defines.

    ``pm.register`` already validated implementations of known hooks (a bad
    one raised inside the entry-point loop above); this catches typos such as
    ``roost_tool`` that would otherwise be silently ignored.
    """
    while True:
        try:
            host.pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = host.pm.get_name(exc.plugin) or repr(exc.plugin)
            host.errors[name] = f"invalid: {exc}"
            log.error("plugin %r was not loaded: %s", name, exc)
            host.pm.unregister(exc.plugin)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist) if dist else ""
    except importlib.metadata.PackageNotFoundError:
        return ""
