"""Shared fixtures: a Roost app with a scripted provider and a recording channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.events import RunEvent
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMProvider
from bot.contracts.messages import ChatType, InboundMessage, OutboundMessage
from bot.pluginhost.manager import PluginHost, get_plugin_manager
from plugins.scripted_provider import ScriptedProvider, _turn


class RecordingChannel(Channel):
    """A channel that records what the core sends, and streams when asked."""

    name = "test"

    def __init__(self, *, stream: bool = False) -> None:
        self.sent: list[OutboundMessage] = []
        self.streams: list[list[str | None]] = []
        self.stream = stream
        self.handler: InboundHandler | None = None
        self.typing_count = 0
        self._ids = 0
        self.arrived = asyncio.Event()

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)
        self.arrived.set()

    def open_stream(self, message: InboundMessage) -> Any:
        if not self.stream:
            return None
        record: list[str | None] = []
        self.streams.append(record)
        channel = self

        class _Stream:
            async def push(self, text_so_far: str) -> None:
                record.append(text_so_far)

            async def finish(self, final_text: str | None) -> None:
                record.append(final_text)
                channel.arrived.set()

        return _Stream()

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        self.typing_count += 1
        yield

    async def say(self, text: str, *, sender: str = "u1", name: str = "", chat: str = "",
                  chat_type: ChatType = "direct", mentioned: bool = True) -> None:
        assert self.handler is not None
        self._ids += 1
        await self.handler(InboundMessage(
            channel=self.name, chat_id=chat or sender, chat_type=chat_type, sender_id=sender,
            sender_name=name, text=text, message_id=str(self._ids), mentioned=mentioned,
        ))

    def texts(self) -> list[str]:
        return [m.text for m in self.sent]


class EventLog:
    """A plugin that records every run event."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.waiters: list[tuple[Callable[[RunEvent], bool], asyncio.Future[RunEvent]]] = []

    @hookimpl
    def roost_run_event(self, event: RunEvent) -> None:
        self.events.append(event)
        for check, fut in list(self.waiters):
            if not fut.done() and check(event):
                fut.set_result(event)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    async def wait_for(self, type_: str, limit: float = 5.0) -> RunEvent:
        for event in self.events:
            if event.type == type_:
                return event
        fut: asyncio.Future[RunEvent] = asyncio.get_running_loop().create_future()
        self.waiters.append((lambda e: e.type == type_, fut))
        return await asyncio.wait_for(fut, limit)


def scripted(*turns: dict[str, Any], loop: bool = False) -> ScriptedProvider:
    """A scripted provider from turn mappings as they would appear in a script file."""
    return ScriptedProvider([_turn(t, i, Path("<test>")) for i, t in enumerate(turns)],
                            loop=loop)


AppFactory = Callable[..., Awaitable[tuple[Roost, RecordingChannel, EventLog]]]
"""``make_app(provider_or_None, *plugins, stream=False, **settings)``; ``None`` builds the
provider the configured way, from ``settings`` through the provider plugins."""


@pytest.fixture
async def make_app(tmp_path: Path) -> AsyncIterator[AppFactory]:
    apps: list[Roost] = []

    async def factory(llm: LLMProvider | None, /, *plugins: object, stream: bool = False,
                      host: PluginHost | None = None,
                      **settings: Any) -> tuple[Roost, RecordingChannel, EventLog]:
        settings.setdefault("data_dir", tmp_path / "data")
        settings.setdefault("merge_window_ms", 0)
        # Tests that leave a run hanging end at once; the grace has tests of its own.
        settings.setdefault("shutdown_grace_seconds", 0)
        host = host or get_plugin_manager(load_entry_points=False)
        log = EventLog()
        host.register(log, "test-event-log")
        for i, plugin in enumerate(plugins):
            host.register(plugin, f"test-plugin-{i}")
        app = await Roost.create(Settings(**settings), host=host, provider=llm)
        apps.append(app)
        channel = RecordingChannel(stream=stream)
        await app.add_channel(channel)
        return app, channel, log

    yield factory
    for app in apps:
        with contextlib.suppress(Exception):
            await app.close()


def without_summary(content: str) -> str:
    """A tool result as the tool produced it, without the injected execution summary."""
    return content.split("\n\n<TOOL_EXECUTION_SUMMARY>")[0]


async def settle(app: Roost, limit: float = 5.0) -> None:
    """Wait until the app has nothing running or queued."""
    await asyncio.wait_for(app.dispatcher.drain(), limit)
