"""Built-in plugin: the tools of MCP servers (``[mcp.servers.<name>]``) as Roost tools.

The servers are configured in ``roost.toml`` (``roost.McpServerConfig``); this
plugin connects to them with the official ``mcp`` SDK
(:mod:`plugins.mcp.connection`, over :mod:`plugins.mcp.transport`), keeps their tool lists
(:mod:`plugins.mcp.manager`, which also says when each server starts) and
offers their tools through every agent's tool policy as
``<server>__<tool>`` in the group ``mcp:<server>`` (:mod:`plugins.mcp.adapter`).
``/mcp`` shows the servers to admins; ``roost mcp list`` and ``roost mcp test``
check them from the command line (:mod:`plugins.mcp.cli`).

One plugin module serves every Roost app in the process (tests build many), so
each app's :class:`~plugins.mcp.manager.McpManager` is found by its services.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from roost import Command, CommandContext, Runtime, Services, Settings, Tool, hookimpl

if TYPE_CHECKING:
    from plugins.mcp.manager import McpManager

__all__ = ["PLUGIN", "manager_of", "roost_commands", "roost_shutdown", "roost_startup",
           "roost_tools"]

log = logging.getLogger("roost.plugins.mcp")

PLUGIN = "plugins.mcp"
"""This plugin's name in the plugin host."""

# The MCP SDK takes about half a second to import: it is imported (with the modules
# that use it) only once a server is configured, never by a Roost without any.

WATCH_INTERVAL = 0.5
"""Seconds between looks at whether an admin disabled this plugin (its servers then end)."""

_managers: dict[int, McpManager] = {}
_built: dict[int, tuple[int, list[Tool]]] = {}


def manager_of(services: Services) -> McpManager | None:
    """The MCP servers of the app ``services`` belongs to (``None``: none configured)."""
    return _managers.get(id(services))


@hookimpl
def roost_tools(settings: Settings, services: Services) -> list[Tool] | None:
    """The tools of every configured server, from its current (or cached) list."""
    if not settings.mcp.servers:
        return None
    from plugins.mcp.adapter import build_tools
    from plugins.mcp.manager import McpManager

    key = id(services)
    manager = _managers.get(key)
    if manager is None:
        manager = _managers[key] = McpManager(settings)
    elif manager.suspended and manager.runtime is not None:
        manager.start(None)  # enabled again after /plugin disable
    built = _built.get(key)
    if built is None or built[0] != manager.version:
        built = _built[key] = (manager.version, build_tools(manager))
    return built[1]


@hookimpl
async def roost_startup(app: Runtime) -> None:
    """Start eager servers and list unlisted ones in the background; runs wait for
    the first listing of servers never listed before."""
    manager = _managers.get(id(app.services))
    if manager is None:
        return
    manager.start(app)
    if any(s.config.enabled and not s.listed for s in manager.servers.values()):
        app.hold_runs(manager.first_listing(), "listing MCP servers never listed before")
    app.background(_follow_enabled(manager, app), "ending MCP servers disabled or idle")


@hookimpl
async def roost_shutdown(app: Runtime) -> None:
    """End every server process before Roost exits."""
    key = id(app.services)
    manager = _managers.pop(key, None)
    _built.pop(key, None)
    if manager is not None:
        await manager.stop()


async def _follow_enabled(manager: McpManager, app: Runtime) -> None:
    """End the servers when an admin disables this plugin (no hook says so), and
    those left unused for their ``idle_timeout``."""
    while True:
        await asyncio.sleep(WATCH_INTERVAL)
        if PLUGIN in app.plugins.disabled and not manager.suspended:
            manager.suspend()
            log.info("MCP plugin disabled: ending its servers")
            await manager.stop()
        elif not manager.suspended:
            manager.end_idle()


@hookimpl
def roost_commands(settings: Settings) -> list[Command] | None:
    """``/mcp``: the servers, their state and tool counts (admins)."""
    if not settings.mcp.servers:
        return None
    return [Command("mcp", "MCP servers: state and tools; restart one", _mcp_command,
                    admin_only=True, usage="[restart NAME]")]


async def _mcp_command(ctx: CommandContext) -> str:
    manager = manager_of(ctx.app.services)
    if manager is None:
        return "No MCP servers are configured."
    words = ctx.args.split()
    if not words:
        return format_status(manager.status())
    if words[0] != "restart" or len(words) != 2:
        return "Usage: /mcp (the servers) or /mcp restart NAME"
    server = manager.servers.get(words[1])
    if server is None:
        return f"No MCP server named {words[1]!r} (configured: {', '.join(manager.servers)})."
    await server.stop()
    server.start(listing=True)
    return (f"MCP server {server.name} ended; it starts again "
            + ("now." if server.config.startup == "eager" else "when a tool is called "
               "(its tools are listed again in the background)."))


def format_status(rows: list[dict[str, object]]) -> str:
    """One line per server: name, transport, state, tools, and what went wrong."""
    lines = ["MCP servers:"]
    for row in rows:
        extra = " per user" if row["per_user"] else ""
        line = (f"- {row['name']} ({row['transport']}, {row['startup']}{extra}): "
                f"{row['state']}, {row['tools']} tools")
        if row["detail"]:
            line += f" — {row['detail']}"
        lines.append(line)
    return "\n".join(lines)
