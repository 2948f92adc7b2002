"""Built-in channels. Each adapter module is imported only when its channel starts."""

from __future__ import annotations

from bot.channel import Channel, ChannelSpec
from bot.config import Settings
from bot.hookspecs import hookimpl


def _console(settings: Settings) -> Channel:
    from channels.console import ConsoleChannel

    return ConsoleChannel()


@hookimpl
def roost_channels(settings: Settings) -> list[ChannelSpec]:
    """The console channel (``roost chat``, or ``roost run`` with ``ROOST_CONSOLE=1``)."""
    return [ChannelSpec("console", lambda s: s.console, _console)]
