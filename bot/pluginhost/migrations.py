"""Running every plugin's ``roost_migrations`` at startup."""

from __future__ import annotations

import asyncio
import inspect
import logging

import aiosqlite
import pluggy

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
    caller: pluggy.HookCaller = host.pm.hook.roost_migrations
    owners: dict[str, str] = {}
    ok = True
    for impl in reversed(caller.get_hookimpls()):
        plugin = impl.plugin_name
        try:
            result = impl.function()
            if inspect.isawaitable(result):
                result = await result
            items = result if isinstance(result, list | tuple) else [result]
            for migrations in items:
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
            ok = False
            host.errors[plugin] = f"roost_migrations: {type(exc).__name__}: {exc}"
            host.disabled.add(plugin)
            log.error("plugin %r is disabled: its migrations failed", plugin, exc_info=exc)
    return ok
