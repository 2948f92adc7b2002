"""Built-in plugin: admin commands to inspect and control plugins from chat.

- ``/plugins``: every plugin with its state (enabled, disabled, error);
- ``/plugin enable NAME`` / ``/plugin disable NAME``: takes effect at once for
  tools, sanitizers, guard patterns, commands, prompt sections and scheduled
  jobs, and is remembered across restarts (channels and providers change only
  after a restart; essential built-ins cannot be disabled);
- ``/plugin info NAME``: hooks, tools, commands and configuration schema;
- ``/plugin install NAME``: only when ``plugins_chat_install`` is on and NAME is
  in ``plugins_install_allowlist``; pip runs in the background and reports in
  this chat; the new plugin loads at the next restart.

Every command here is admin-only.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from typing import TYPE_CHECKING

from bot.config.settings import Settings
from bot.contracts.commands import Command, CommandContext
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.pluginhost.install import (
    describe_change,
    pip_command,
    plugin_entry_points,
    run_streaming,
    valid_name,
)
from bot.pluginhost.manager import ESSENTIAL_PLUGINS, PluginHost, normalize_dist

if TYPE_CHECKING:
    from bot.contracts.runtime import Runtime

log = logging.getLogger("roost.pluginhost.commands")

PROGRESS_INTERVAL = 5.0
"""Seconds between progress messages of one install."""
PROGRESS_PREFIXES = ("Collecting", "Downloading", "Installing collected", "Building")
MAX_SCHEMA_CHARS = 1_500

_installing: weakref.WeakKeyDictionary[Runtime, set[str]] = weakref.WeakKeyDictionary()


def install_command(name: str) -> list[str]:
    """The command ``/plugin install`` runs (tests replace it)."""
    return pip_command("install", [name])


def _state(app: Runtime, name: str) -> str:
    if name in app.plugins.errors:
        state = "error" if name not in app.plugins.disabled else "disabled (error)"
    else:
        state = "disabled" if name in app.plugins.disabled else "enabled"
    return state + (", essential" if name in ESSENTIAL_PLUGINS else "")


async def _plugins(ctx: CommandContext) -> str:
    host = ctx.app.plugins
    lines = ["Plugins:"]
    for name, info in sorted(host.info.items(), key=lambda i: (i[1].builtin, i[0])):
        origin = "built-in" if info.builtin else f"{info.distribution} {info.version}".strip()
        lines.append(f"{name} ({origin}): {_state(ctx.app, name)}")
    for name, error in sorted(host.errors.items()):
        if name not in host.info:
            lines.append(f"{name}: not loaded")
        lines.append(f"  error: {error}")
    return "\n".join(lines)


USAGE = "Usage: /plugin enable|disable|info|install <name>"


async def _plugin(ctx: CommandContext) -> str:
    action, _, name = ctx.args.strip().partition(" ")
    name = name.strip()
    if not name or action not in ("enable", "disable", "info", "install"):
        return USAGE
    if action in ("enable", "disable"):
        return await ctx.app.set_plugin_enabled(name, action == "enable")
    if action == "info":
        return await _info(ctx.app, name)
    return _install(ctx.app, ctx.message, name)


async def _info(app: Runtime, name: str) -> str:
    host = app.plugins
    if not isinstance(host, PluginHost):  # the runtime's plugins are the host itself
        raise TypeError(f"/plugin info needs the plugin host, not {type(host).__name__}")
    if not host.is_loaded(name):
        return f"No plugin named {name!r} is loaded."
    info = host.info.get(name)
    origin = ("built-in" if info is None or info.builtin
              else f"{info.distribution} {info.version}".strip())
    lines = [f"{name} ({origin}): {_state(app, name)}",
             f"Hooks: {', '.join(host.hooks_of(name)) or 'none'}"]
    hooks = host.hooks.only(name)
    tools = await hooks.roost_tools(settings=app.settings, services=app.services)
    lines.append("Tools: " + (", ".join(sorted(t.name for t in tools)) or "none"))
    commands = await hooks.roost_commands(settings=app.settings)
    lines.append("Commands: " + (", ".join(sorted(f"/{c.name}" for c in commands)) or "none"))
    models = await hooks.roost_plugin_config_model()
    if models:
        schema = json.dumps(models[0].model_json_schema(), ensure_ascii=False)
        if len(schema) > MAX_SCHEMA_CHARS:
            schema = schema[:MAX_SCHEMA_CHARS] + "…"
        lines.append(f"Configuration ([plugins.{name}]): {schema}")
    else:
        lines.append("Configuration: none declared")
    if name in host.errors:
        lines.append(f"Error: {host.errors[name]}")
    return "\n".join(lines)


def _install(app: Runtime, message: InboundMessage, name: str) -> str:
    settings = app.settings
    if not settings.plugins_chat_install:
        return ("Installing plugins from chat is off. Set plugins_chat_install = true "
                "(and plugins_install_allowlist), or run `roost plugins install` on the host.")
    if not valid_name(name):
        return f"{name!r} is not a package name."
    allowed = {normalize_dist(n) for n in settings.plugins_install_allowlist}
    base = normalize_dist(name.split("[")[0].split("==")[0])
    if base not in allowed:
        return (f"{name} is not in plugins_install_allowlist"
                + (f" ({', '.join(settings.plugins_install_allowlist)})."
                   if settings.plugins_install_allowlist else " (which is empty)."))
    busy = _installing.setdefault(app, set())
    if base in busy:
        return f"{name} is already being installed."
    busy.add(base)
    app.background(_run_install(app, message, name, base), f"installing plugin {name}")
    return f"Installing {name} in the background; I'll report here."


async def _run_install(app: Runtime, message: InboundMessage, name: str, base: str) -> None:
    async def say(text: str, kind: str = "notice") -> None:
        if message.channel not in app.channels:
            log.info("plugin install %s: %s", name, text)
            return
        await app.deliver(OutboundMessage.reply_to_message(
            message, text, "error" if kind == "error" else "notice"))

    last = 0.0

    async def progress(line: str) -> None:
        nonlocal last
        if line.startswith(PROGRESS_PREFIXES) and time.monotonic() - last >= PROGRESS_INTERVAL:
            last = time.monotonic()
            await say(f"{name}: {line[:200]}")

    try:
        before = plugin_entry_points()
        try:
            code, lines = await run_streaming(install_command(name), progress)
        except OSError as exc:
            await say(f"Installing {name} failed: {exc}", "error")
            return
        if code != 0:
            tail = "\n".join(lines[-5:])
            await say(f"Installing {name} failed (pip exit code {code}):\n{tail}", "error")
            return
        change = describe_change(before, plugin_entry_points())
        log.info("plugin package %s installed from chat; %s", name, change)
        await say(f"Installed {name}: {change}. Restart Roost to load new plugins.")
    finally:
        _installing.get(app, set()).discard(base)


@hookimpl
def roost_commands(settings: Settings) -> list[Command]:
    """/plugins and /plugin, for admins."""
    return [
        Command("plugins", "list plugins and whether they are enabled", _plugins,
                admin_only=True),
        Command("plugin", "enable, disable, describe or install a plugin", _plugin,
                admin_only=True, usage="enable|disable|info|install <name>"),
    ]
