"""A Roost app for plugin tests: a scripted model and a chat you can talk into.

The ``roost_app`` pytest fixture (see :mod:`bot.testing.pytest_plugin`) is the
usual way in; :func:`build_app` is the same thing without pytest::

    async def test_my_tool(roost_app):
        chat = await roost_app(
            [{"steps": [{"tool_calls": [{"name": "shout", "arguments": {"text": "hi"}}]},
                        {"reply": "done"}]}],
            my_plugin,
        )
        await chat.say("shout hi")
        await chat.settle()
        assert chat.replies == ["done"]
        assert chat.tool_results() == ["HI"]

Turns are the mappings of a scripted-provider script (``plugins/demo_script.yaml``
shows the format): ``{"reply": "..."}``, ``{"match": "regex", "reply": "..."}``
or ``{"steps": [{"text": ..., "tool_calls": [...]}, {"reply": ...}]}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.events import RunEvent
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMRequest
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.pluginhost.manager import PluginHost, get_plugin_manager
from plugins.scripted_provider import ScriptedProvider, _turn

__all__ = ["ChatChannel", "EventRecorder", "build_app", "scripted_provider"]


def scripted_provider(turns: Iterable[Mapping[str, Any]], *, loop: bool = False
                      ) -> ScriptedProvider:
    """A scripted provider from turn mappings as they would appear in a script file.

    It records every request it answers in ``provider.requests`` (system prompt,
    messages, the tools offered), so tests can look at what the model was shown.
    """
    return ScriptedProvider([_turn(dict(t), i, Path("<test>")) for i, t in enumerate(turns)],
                            loop=loop)


class EventRecorder:
    """A plugin that keeps every :class:`bot.contracts.events.RunEvent` of the app's runs."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []

    @hookimpl
    def roost_run_event(self, event: RunEvent) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        """The event types in the order they arrived."""
        return [e.type for e in self.events]


class ChatChannel(Channel):
    """A console-like channel: ``say`` sends a user message, ``replies`` holds the answers.

    Everything Roost delivers is kept in ``sent`` (:class:`bot.contracts.messages.OutboundMessage`,
    including notices and errors); ``replies`` is the text of each, in order.
    """

    def __init__(self, name: str = "console") -> None:
        self.name = name
        self.sent: list[OutboundMessage] = []
        self.app: Roost | None = None
        self.provider: ScriptedProvider | None = None
        self.recorder = EventRecorder()
        self._handler: InboundHandler | None = None
        self._ids = 0

    async def start(self, handler: InboundHandler) -> None:
        self._handler = handler

    async def stop(self) -> None:
        self._handler = None

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    @property
    def replies(self) -> list[str]:
        """The text of every message Roost sent, oldest first."""
        return [m.text for m in self.sent]

    @property
    def requests(self) -> list[LLMRequest]:
        """Every request the scripted model answered (empty with another provider)."""
        return list(self.provider.requests) if self.provider is not None else []

    @property
    def events(self) -> list[RunEvent]:
        """Every run event so far."""
        return self.recorder.events

    async def say(self, text: str, *, sender: str = "user", name: str = "",
                  group: str | None = None, mentioned: bool = True,
                  thread: str | None = None) -> None:
        """Send ``text`` as ``sender``: a direct chat, or the group chat ``group`` if given.

        Returns once Roost has accepted the message; call :meth:`settle` to wait
        for the answer.
        """
        if self._handler is None:
            raise RuntimeError("the chat channel is not started; build it with roost_app")
        self._ids += 1
        await self._handler(InboundMessage(
            channel=self.name, chat_id=group if group is not None else sender,
            chat_type="group" if group is not None else "direct", sender_id=sender,
            sender_name=name, text=text, message_id=str(self._ids), mentioned=mentioned,
            thread_id=thread,
        ))

    async def ask(self, text: str, **kwargs: Any) -> list[str]:
        """:meth:`say`, :meth:`settle`, and return the replies that arrived meanwhile."""
        before = len(self.sent)
        await self.say(text, **kwargs)
        await self.settle()
        return self.replies[before:]

    async def settle(self, limit: float = 5.0) -> None:
        """Wait (at most ``limit`` seconds) until nothing is running or queued."""
        if self.app is None:
            raise RuntimeError("the chat channel is not attached to an app")
        await asyncio.wait_for(self.app.dispatcher.drain(), limit)

    def tool_results(self, name: str | None = None) -> list[str]:
        """What each tool call returned (its first 500 characters), oldest first.

        ``name`` keeps only the results of that tool.
        """
        return [str(e.payload.get("result", "")) for e in self.events
                if e.type == "tool.result" and name in (None, e.payload.get("name"))]

    @property
    def system_prompt(self) -> str:
        """The system prompt of the latest model call (``""`` before the first)."""
        return self.provider.requests[-1].system if self.provider and self.provider.requests \
            else ""


async def build_app(turns: Iterable[Mapping[str, Any]] = (), /, *plugins: object,
                    data_dir: Path, loop: bool = False, entry_points: bool = False,
                    host: PluginHost | None = None, channel: str = "console",
                    clock: Callable[[], datetime] | None = None,
                    **settings: Any) -> ChatChannel:
    """Build a Roost app with the built-in plugins, ``plugins``, a scripted model and a chat.

    A plugin is registered under its module name (``__name__``) or
    ``test-plugin-<n>``; pass ``("name", plugin)`` to choose the name, which is
    also the key of its configuration in ``plugins={"name": {...}}``.

    ``entry_points=True`` also loads installed plugins (the ``roost`` entry-point
    group), as ``roost run`` does. ``clock`` freezes the scheduler's time; then
    ``chat.app.services.scheduler.run_due(moment)`` fires the jobs due by then.
    Other keyword arguments are :class:`bot.config.settings.Settings` fields. Close the
    app with ``await chat.app.close()`` (the fixture does it for you).
    """
    settings.setdefault("data_dir", data_dir)
    settings.setdefault("merge_window_ms", 0)
    # A test that leaves a run hanging should not wait out the shutdown grace.
    settings.setdefault("shutdown_grace_seconds", 0)
    host = host or get_plugin_manager(load_entry_points=entry_points)
    chat = ChatChannel(channel)
    host.register(chat.recorder, f"test-events-{id(chat)}")
    for i, plugin in enumerate(plugins):
        if isinstance(plugin, tuple):
            name, plugin = plugin
        else:
            name = getattr(plugin, "__name__", None) or f"test-plugin-{i}"
        host.register(plugin, name)
    chat.provider = scripted_provider(turns, loop=loop)
    chat.app = await Roost.create(Settings(**settings), host=host, provider=chat.provider,
                                  scheduler_clock=clock)
    await chat.app.add_channel(chat)
    return chat


@contextlib.asynccontextmanager
async def app_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Yield a :func:`build_app` bound to ``tmp_path``; close every app built on exit."""
    chats: list[ChatChannel] = []
    count = 0

    async def factory(turns: Sequence[Mapping[str, Any]] = (), /, *plugins: object,
                      **kwargs: Any) -> ChatChannel:
        nonlocal count
        count += 1
        kwargs.setdefault("data_dir", tmp_path / f"roost-{count}")
        chat = await build_app(turns, *plugins, **kwargs)
        chats.append(chat)
        return chat

    try:
        yield factory
    finally:
        for chat in chats:
            if chat.app is not None:
                with contextlib.suppress(Exception):
                    await chat.app.close()
