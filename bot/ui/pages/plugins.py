"""``/ui/plugins``: plugins with their hooks and state, MCP servers with their state,
tools and last error. Admins enable or disable a plugin (as ``/plugin``: persisted, at
once, on every replica) and test an MCP server (what ``roost mcp test`` does)."""

from __future__ import annotations

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.opsweb import field
from bot.ui.queries import plugins as queries


async def plugins(req: UiRequest, *, notice: str = "", error: str = "", test: str = "",
                  status: int = 200) -> web.StreamResponse:
    """Every plugin and MCP server; ``notice``/``test``: what an action just did."""
    response = req.render("plugins.html", page=queries.plugins_page(req.app), notice=notice,
                          error=error, test=test)
    response.set_status(status)
    return response


async def _set(req: UiRequest, enabled: bool) -> web.StreamResponse:
    name = field(await req.form(), "name")
    if name is None:
        return await plugins(req, error="say which plugin", status=400)
    text = await queries.set_enabled(req.app, name, enabled)
    await req.audit("enable plugin" if enabled else "disable plugin", name, text)
    return await plugins(req, notice=text)


async def enable(req: UiRequest) -> web.StreamResponse:
    """Enable the plugin in the form."""
    return await _set(req, True)


async def disable(req: UiRequest) -> web.StreamResponse:
    """Disable the plugin in the form."""
    return await _set(req, False)


async def mcp_test(req: UiRequest) -> web.StreamResponse:
    """Start the MCP server in the form apart, list its tools, end it; show the report."""
    name = field(await req.form(), "name")
    if name is None or name not in req.app.settings.mcp.servers:
        return await plugins(req, error="no such MCP server", status=404)
    ok, text = await queries.test_mcp(req.app, name)
    await req.audit("test mcp server", name, "ok" if ok else "failed")
    return await plugins(req, test=text, error="" if ok else f"{name} failed its test")


ROUTES = [
    UiRoute("GET", "/ui/plugins", plugins),
    UiRoute("POST", "/ui/plugins/enable", enable, role="admin"),
    UiRoute("POST", "/ui/plugins/disable", disable, role="admin"),
    UiRoute("POST", "/ui/plugins/mcp-test", mcp_test, role="admin"),
]
NAV = NavEntry(label="Plugins", path="/ui/plugins", order=80)
