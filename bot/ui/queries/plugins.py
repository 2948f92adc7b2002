"""The plugins page: plugins with their hooks and state, MCP servers with their state,
tools and last error; enabling or disabling a plugin, and testing an MCP server.

Enabling and disabling is :meth:`bot.app.roost.Roost.set_plugin_enabled`, what
``/plugin enable|disable`` calls: persisted in the database, applied at once and
on every replica. The MCP servers' state is the MCP plugin's own status (what
``/mcp`` shows) and "test" is what ``roost mcp test NAME`` runs: the server is
started apart, its tools listed, and ended; errors are masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.config.masking import mask_text
from bot.pluginhost.manager import ESSENTIAL_PLUGINS

if TYPE_CHECKING:
    from bot.app.roost import Roost


@dataclass(frozen=True, slots=True)
class PluginRow:
    """A plugin: where it came from, whether it is enabled, its hooks, its last error."""

    name: str
    origin: str
    enabled: bool
    essential: bool
    hooks: list[str]
    error: str


@dataclass(frozen=True, slots=True)
class McpRow:
    """An MCP server as the MCP plugin sees it now."""

    name: str
    transport: str
    startup: str
    per_user: bool
    state: str
    tools: list[str]
    detail: str
    """What went wrong last (masked), or what it waits for."""


@dataclass(frozen=True, slots=True)
class PluginsPage:
    """Every plugin loaded (and those that failed to load), and every MCP server."""

    plugins: list[PluginRow]
    servers: list[McpRow]


def plugins_page(app: Roost) -> PluginsPage:
    """The plugins and MCP servers of the running app."""
    host = app.host
    found: list[PluginRow] = []
    for name, info in sorted(host.info.items(), key=lambda i: (i[1].builtin, i[0])):
        origin = "built-in" if info.builtin else f"{info.distribution} {info.version}".strip()
        found.append(PluginRow(name, origin, name not in host.disabled,
                               name in ESSENTIAL_PLUGINS, host.hooks_of(name),
                               mask_text(host.errors.get(name, ""))))
    for name, error in sorted(host.errors.items()):
        if name not in host.info:
            found.append(PluginRow(name, "not loaded", False, False, [], mask_text(error)))
    return PluginsPage(found, mcp_servers(app))


def mcp_servers(app: Roost) -> list[McpRow]:
    """The configured MCP servers with the running plugin's view of them."""
    servers = app.settings.mcp.servers
    if not servers:
        return []
    from plugins.mcp import manager_of
    from plugins.mcp.naming import tool_names

    manager = manager_of(app.services)
    status: dict[str, dict[str, Any]] = {}
    tools: dict[str, list[str]] = {}
    if manager is not None:
        status = {str(row["name"]): row for row in manager.status()}
        for name, server in manager.servers.items():
            tools[name] = sorted(tool_names(name, [t.name for t in server.tools]))
    rows: list[McpRow] = []
    for name, config in sorted(servers.items()):
        row = status.get(name)
        if row is None:
            state = "disabled" if not config.enabled or "plugins.mcp" in app.host.disabled \
                else "not started"
            rows.append(McpRow(name, config.kind, config.startup, config.per_user, state, [],
                               ""))
            continue
        rows.append(McpRow(name, str(row["transport"]), str(row["startup"]),
                           bool(row["per_user"]), str(row["state"]), tools.get(name, []),
                           mask_text(str(row["detail"] or ""))))
    return rows


async def set_enabled(app: Roost, name: str, enabled: bool) -> str:
    """Enable or disable plugin ``name`` now and persist it; what happened, in a line."""
    return await app.set_plugin_enabled(name, enabled)


async def test_mcp(app: Roost, name: str) -> tuple[bool, str]:
    """What ``roost mcp test NAME`` does: whether the server answered, and the report."""
    from plugins.mcp.cli import test_server

    code, text = await test_server(app.settings, name)
    return code == 0, mask_text(text)
