"""Slash commands: the plugin contract and the parser."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bot.contracts.messages import InboundMessage

if TYPE_CHECKING:
    from bot.contracts.runtime import Runtime


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a command handler receives; ``app`` is the running service's
    :class:`~bot.contracts.runtime.Runtime`."""

    app: Runtime
    message: InboundMessage
    name: str
    args: str
    is_admin: bool
    session_key: str
    agent: str = "default"
    """The agent that serves this chat (its sessions are ``session_key``)."""


CommandHandler = Callable[[CommandContext], Awaitable["str | None"]]


@dataclass(frozen=True, slots=True)
class Command:
    """A slash command. ``handler`` returns the reply text (``None`` for none)."""

    name: str
    description: str
    handler: CommandHandler
    admin_only: bool = False
    aliases: tuple[str, ...] = field(default=())
    usage: str = ""


def parse_command(text: str, bot_username: str = "") -> tuple[str, str] | None:
    """Split ``/name[@bot] args`` into ``(name, args)``; ``None`` if not a command.

    A ``@botname`` suffix addressed to another bot means the command is not
    ours, which matters in groups with several bots.
    """
    stripped = text.strip()
    if not stripped.startswith("/") or stripped[1:2].isspace():
        return None
    parts = stripped[1:].split(maxsplit=1)
    if not parts:
        return None
    name, _, target = parts[0].partition("@")
    if target and bot_username and target.lower() != bot_username.lower():
        return None
    name = name.lower()
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        return None
    return name, parts[1].strip() if len(parts) > 1 else ""
