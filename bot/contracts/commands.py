"""Slash commands: the plugin contract (parsed by :func:`bot.contracts.messages.parse_command`)."""

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
