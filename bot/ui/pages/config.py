"""``/ui/config``: the effective configuration, masked as ``roost config show`` prints it,
and where each value came from (environment, ``.env``, ``roost.toml`` or the default)."""

from __future__ import annotations

from aiohttp import web

from bot.app.config_view import config_lines
from bot.config.origins import origins
from bot.observability.redact import redact
from bot.ui.kit import NavEntry, UiRequest, UiRoute


async def config(req: UiRequest) -> web.StreamResponse:
    """One row per top-level setting: its masked line and its origin."""
    settings = req.app.settings
    where = origins(settings)
    rows = [(key, redact(line), where.get(key, "default"))
            for key, line in config_lines(settings, req.app.host)]
    return req.render("config.html", rows=rows, config_file=settings.config_file)


ROUTES = [UiRoute("GET", "/ui/config", config)]
NAV = NavEntry(label="Config", path="/ui/config", order=90)
