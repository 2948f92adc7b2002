"""Sending a message through its running channel, outside any run's reply."""

from __future__ import annotations

from collections.abc import Mapping

from bot.contracts.channel import Channel
from bot.contracts.messages import OutboundMessage


class ChannelSender:
    """Sends a message through its running channel at once (``ToolContext.send``)."""

    def __init__(self, channels: Mapping[str, Channel]) -> None:
        self.channels = channels

    async def __call__(self, message: OutboundMessage) -> str | None:
        """Raises :class:`LookupError` when the channel is not running, and whatever the
        channel's ``send`` raises."""
        channel = self.channels.get(message.channel)
        if channel is None:
            raise LookupError(f"the {message.channel} channel is not running")
        return await channel.send(message)
