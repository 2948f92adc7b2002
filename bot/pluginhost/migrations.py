"""Running every plugin's ``roost_migrations`` at startup."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

import aiosqlite

from bot.contracts import hookspecs
from bot.contracts.migrations import Migrations
from bot.pluginhost.manager import PluginHost
from bot.storage.plugin_tables import migrate_plugin

log = logging.getLogger("roost.pluginhost.migrations")


async def migrate_plugins(host: PluginHost, db: aiosqlite.Connection,
                          lock: asyncio.Lock) -> bool:
    """Bring every registered plugin's own tables up to date; True when all succeeded.

    Disabled plugins are migrated too: their tables are ready when an admin
    enables them again, and a plugin that takes over data Roost retires gets
    to copy it before it is dropped. A plugin whose migrations fail (or that
    names a schema another plugin already claimed) is disabled for this
    process, with the failure in ``host.errors``; the others run.
    """
    owners: dict[str, str] = {}
    failed: set[str] = set()

    def disable(plugin: str, hook: str, exc: Exception) -> None:
        failed.add(plugin)
        host.errors[plugin] = f"{hook}: {type(exc).__name__}: {exc}"
        host.disabled.add(plugin)
        log.error("plugin %r is disabled: its migrations failed", plugin, exc_info=exc)

    hook = hookspecs.roost_migrations.__name__
    async with aclosing(host.each(hook, {}, failed=disable, disabled_too=True)) as results:
        async for plugin, result in results:
            try:
                for migrations in result if isinstance(result, list | tuple) else [result]:
                    if migrations is None:
                        continue
                    if not isinstance(migrations, Migrations):
                        raise TypeError(f"returned {migrations!r}, not roost.Migrations")
                    owner = owners.setdefault(migrations.name, plugin)
                    if owner != plugin:
                        raise ValueError(f"schema name {migrations.name!r} is already used by "
                                         f"plugin {owner!r}")
                    ran = await migrate_plugin(db, lock, migrations)
                    if ran:
                        log.info("plugin %r: applied %d schema step(s) of %r", plugin, ran,
                                 migrations.name)
            except Exception as exc:
                disable(plugin, hook, exc)
    return not failed
