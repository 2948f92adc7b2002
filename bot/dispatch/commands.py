"""Running one slash command: lookup, the admin check, the handler, its reply text."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bot.config.settings import Settings
from bot.contracts.commands import Command, CommandContext
from bot.contracts.messages import InboundMessage
from bot.contracts.runtime import Runtime
from bot.storage.sessions import agent_of

log = logging.getLogger("roost.dispatch.commands")


async def run_command(message: InboundMessage, name: str, args: str,
                      commands: Mapping[str, Command], settings: Settings, runtime: Runtime,
                      session_key: str) -> str | None:
    """The reply to ``/name args`` from ``message``'s sender (``None``: no reply).

    Unknown commands and non-admins get a one-line answer; a handler that
    raises is logged and answered with what went wrong.
    """
    command = commands.get(name)
    is_admin = settings.is_admin(message.channel, message.sender_id)
    if command is None:
        return f"I don't know /{name}. Send /help to see the commands."
    if command.admin_only and not is_admin:
        log.warning("non-admin %s:%s tried /%s", message.channel, message.sender_id, name)
        return f"/{command.name} is for admins only."
    ctx = CommandContext(runtime, message, command.name, args, is_admin, session_key,
                         agent_of(session_key))
    try:
        return await command.handler(ctx)
    except Exception as exc:
        log.exception("command /%s failed", name)
        return f"/{command.name} failed: {exc}"
