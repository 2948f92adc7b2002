"""Built-in channels, offered as the ``channels.builtin`` plugin; each adapter module is
imported only when its channel starts.

That keeps an unconfigured platform's SDK out of memory and out of start time.
"""

from __future__ import annotations

from roost import Channel, ChannelSpec, Settings, hookimpl


def _console(settings: Settings) -> Channel:
    from channels.console import ConsoleChannel

    return ConsoleChannel()


def _telegram(settings: Settings) -> Channel:
    from channels.telegram import TelegramChannel

    return TelegramChannel(settings)


def _discord(settings: Settings) -> Channel:
    from channels.discord import DiscordChannel

    return DiscordChannel(settings)


def _slack(settings: Settings) -> Channel:
    from channels.slack import SlackChannel

    return SlackChannel(settings)


@hookimpl
def roost_channels(settings: Settings) -> list[ChannelSpec]:
    """Console (``ROOST_CONSOLE=1``), Telegram, Discord and Slack when their tokens are set."""
    return [
        ChannelSpec("console", lambda s: s.console, _console),
        ChannelSpec("telegram", lambda s: s.telegram_bot_token is not None, _telegram),
        ChannelSpec("discord", lambda s: s.discord_bot_token is not None, _discord),
        # The bot token alone counts: the channel then names the second credential it
        # needs, rather than `roost run` saying no channel is configured.
        ChannelSpec("slack", lambda s: s.slack_bot_token is not None, _slack),
    ]
