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
import io
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.channel import Capabilities, Channel, InboundHandler
from bot.contracts.events import RunEvent
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMProvider, LLMRequest
from bot.contracts.messages import (
    ButtonPress,
    ButtonRows,
    InboundEvent,
    InboundMessage,
    OutboundMessage,
)
from bot.pluginhost.manager import PluginHost, get_plugin_manager
from bot.testing.fresh_db import seed_database
from plugins.scripted_provider import ScriptedProvider, _turn

__all__ = ["ChatChannel", "EventRecorder", "build_app", "closing_apps", "create_app", "scripted",
           "scripted_provider", "settle", "without_summary"]


def scripted_provider(turns: Iterable[Mapping[str, Any]], *, loop: bool = False
                      ) -> ScriptedProvider:
    """A scripted provider from turn mappings as they would appear in a script file.

    It records every request it answers in ``provider.requests`` (system prompt,
    messages, the tools offered), so tests can look at what the model was shown.
    """
    return ScriptedProvider([_turn(dict(t), i, Path("<test>")) for i, t in enumerate(turns)],
                            loop=loop)


def scripted(*turns: Mapping[str, Any], loop: bool = False) -> ScriptedProvider:
    """:func:`scripted_provider` with the turns as arguments: ``scripted({"reply": "hi"})``."""
    return scripted_provider(turns, loop=loop)


def without_summary(content: str) -> str:
    """A tool result as the tool produced it, without the injected execution summary."""
    return content.split("\n\n<TOOL_EXECUTION_SUMMARY>")[0]


async def settle(app: Roost, limit: float = 5.0) -> None:
    """Wait (at most ``limit`` seconds) until ``app`` has nothing running or queued."""
    await asyncio.wait_for(app.dispatcher.drain(), limit)


class EventRecorder:
    """A plugin that keeps every :class:`bot.contracts.events.RunEvent` of the app's runs."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self._waiters: list[tuple[Callable[[RunEvent], bool], asyncio.Future[RunEvent]]] = []

    @hookimpl
    def roost_run_event(self, event: RunEvent) -> None:
        self.events.append(event)
        for check, waiter in self._waiters:
            if not waiter.done() and check(event):
                waiter.set_result(event)
        self._waiters = [(c, w) for c, w in self._waiters if not w.done()]

    def types(self) -> list[str]:
        """The event types in the order they arrived."""
        return [e.type for e in self.events]

    async def wait_for(self, what: str | Callable[[RunEvent], bool],
                       limit: float = 5.0) -> RunEvent:
        """The first event of type ``what`` (or for which ``what(event)`` is true).

        An event that already came is returned at once; otherwise this waits for
        one, at most ``limit`` seconds.
        """
        check = what if callable(what) else (lambda e: e.type == what)
        for event in self.events:
            if check(event):
                return event
        waiter: asyncio.Future[RunEvent] = asyncio.get_running_loop().create_future()
        self._waiters.append((check, waiter))
        return await asyncio.wait_for(waiter, limit)


class _RecordedStream:
    """A reply stream that keeps every text pushed, then the final text, in ``record``."""

    message_id: str | None = None  # never a platform draft to replace

    def __init__(self, chat: ChatChannel, record: list[str | None]) -> None:
        self._chat = chat
        self._record = record

    async def push(self, text_so_far: str) -> None:
        self._record.append(text_so_far)

    async def finish(self, final_text: str | None) -> None:
        self._record.append(final_text)
        self._chat.arrived.set()


class ChatChannel(Channel):
    """A console-like channel: ``say`` sends a user message, ``replies`` holds the answers.

    Everything Roost delivers is kept in ``sent`` (:class:`bot.contracts.messages.OutboundMessage`,
    including notices and errors); ``replies`` is the text of each, in order.
    ``sender`` is who speaks when :meth:`say` is not told otherwise. With
    ``stream=True`` replies are streamed: each stream's pushed texts and its
    final text (``None`` for nothing shown) are a list in ``streams``.
    ``arrived`` is set whenever a message was sent or a stream finished (clear it
    before waiting); ``typing_count`` counts the typing indicators shown.
    """

    capabilities = Capabilities(buttons=True, edit=True)

    def __init__(self, name: str = "console", *, sender: str = "user",
                 stream: bool = False) -> None:
        self.name = name
        self.sender = sender
        self.stream = stream
        self.sent: list[OutboundMessage] = []
        """Everything sent; one with buttons has its position (from 1) as its id."""
        self.edits: list[tuple[str, str, ButtonRows]] = []
        self.answers: list[tuple[ButtonPress, str | None]] = []
        self.streams: list[list[str | None]] = []
        self.typing_count = 0
        self.arrived = asyncio.Event()
        self.app: Roost | None = None
        self.provider: ScriptedProvider | None = None
        self.recorder = EventRecorder()
        self._handler: InboundHandler | None = None
        self._ids = 0

    async def attach(self, app: Roost, recorder: EventRecorder | None = None) -> None:
        """Join ``app`` as one of its channels; ``recorder`` is the app's event recorder."""
        self.app = app
        if recorder is not None:
            self.recorder = recorder
        if isinstance(app.provider, ScriptedProvider):
            self.provider = app.provider
        await app.add_channel(self)

    async def start(self, handler: InboundHandler) -> None:
        self._handler = handler

    async def stop(self) -> None:
        self._handler = None

    async def send(self, message: OutboundMessage) -> str | None:
        self.sent.append(message)
        self.arrived.set()
        # A message with buttons can be edited later, so it gets an id: its position.
        return str(len(self.sent)) if message.buttons else None

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """Record the edit in ``edits`` as ``(message_id, text, buttons)``."""
        self.edits.append((message_id, text, buttons))
        self.arrived.set()
        return True

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """Record the answer in ``answers`` as ``(press, note)``."""
        self.answers.append((press, note))
        self.arrived.set()

    async def wait_for_message(self, check: Callable[[OutboundMessage], bool] | None = None,
                               limit: float = 5.0) -> OutboundMessage:
        """The first message sent (for which ``check`` holds), waiting at most ``limit`` s."""
        async with asyncio.timeout(limit):
            while True:
                self.arrived.clear()
                found = next((m for m in self.sent if check is None or check(m)), None)
                if found is not None:
                    return found
                await self.arrived.wait()

    def open_stream(self, message: InboundMessage) -> _RecordedStream | None:
        if not self.stream:
            return None
        record: list[str | None] = []
        self.streams.append(record)
        return _RecordedStream(self, record)

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        self.typing_count += 1
        yield

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

    async def say(self, text: str, *, sender: str | None = None, name: str = "",
                  group: str | None = None, mentioned: bool = True,
                  thread: str | None = None) -> None:
        """Send ``text`` as ``sender``: a direct chat, or the group chat ``group`` if given.

        Returns once Roost has accepted the message; call :meth:`settle` to wait
        for the answer.
        """
        if self._handler is None:
            raise RuntimeError("the chat channel is not started; build it with roost_app")
        sender = sender if sender is not None else self.sender
        self._ids += 1
        await self._handler(InboundMessage(
            channel=self.name, chat_id=group if group is not None else sender,
            chat_type="group" if group is not None else "direct", sender_id=sender,
            sender_name=name, text=text, message_id=str(self._ids), mentioned=mentioned,
            thread_id=thread,
        ))

    async def hand_in(self, event: InboundEvent) -> None:
        """Hand ``event`` to Roost as a channel would (a press, an edit, a reaction...)."""
        if self._handler is None:
            raise RuntimeError("the chat channel is not started; build it with roost_app")
        await self._handler(event)

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
        await settle(self.app, limit)

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


async def create_app(provider: LLMProvider | None, /, *plugins: object, data_dir: Path,
                     entry_points: bool = False, host: PluginHost | None = None,
                     clock: Callable[[], datetime] | None = None,
                     **settings: Any) -> tuple[Roost, EventRecorder]:
    """A Roost app with the built-in plugins, ``plugins`` and an :class:`EventRecorder`; no channel.

    A new SQLite database starts as a copy of one migrated once per process
    (:mod:`bot.testing.fresh_db`).

    ``provider`` answers its runs; ``None`` builds the configured one from
    ``settings`` through the provider plugins, as ``roost run`` does. The other
    arguments are :func:`build_app`'s. Close the app with ``await app.close()``.
    """
    settings.setdefault("data_dir", data_dir)
    settings.setdefault("merge_window_ms", 0)
    # Test chats talk as made-up users: DMs are open here, although Roost's own default
    # is "pairing" (tests of pairing pass dm_policy="pairing").
    settings.setdefault("dm_policy", "open")
    # A test that leaves a run hanging should not wait out the shutdown grace.
    settings.setdefault("shutdown_grace_seconds", 0)
    host = host or get_plugin_manager(load_entry_points=entry_points)
    recorder = EventRecorder()
    host.register(recorder, f"test-events-{id(recorder)}")
    for i, plugin in enumerate(plugins):
        if isinstance(plugin, tuple):
            name, plugin = plugin
        else:
            name = getattr(plugin, "__name__", None) or f"test-plugin-{i}"
        host.register(plugin, name)
    config = Settings(**settings)
    await seed_database(config)
    app = await Roost.create(config, host=host, provider=provider, scheduler_clock=clock)
    return app, recorder


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
    app, recorder = await create_app(scripted_provider(turns, loop=loop), *plugins,
                                     data_dir=data_dir, entry_points=entry_points, host=host,
                                     clock=clock, **settings)
    chat = ChatChannel(channel)
    await chat.attach(app, recorder)
    return chat


@contextlib.asynccontextmanager
async def closing_apps() -> AsyncIterator[list[Roost]]:
    """Yield a list to put apps in; on exit every app in it is closed (errors ignored).

    For fixtures: a test that already closed its app, or left it broken on
    purpose, still ends cleanly.
    """
    apps: list[Roost] = []
    try:
        yield apps
    finally:
        for app in apps:
            try:
                async with asyncio.timeout(CLOSE_BOUND):
                    with contextlib.suppress(Exception):
                        await app.close()
            except TimeoutError:
                raise AssertionError(
                    f"app.close() did not finish within {CLOSE_BOUND:g} s; what was still "
                    f"waiting:\n{pending_stacks()}") from None


CLOSE_BOUND = 60.0
"""Seconds a test app may take to close before the fixture fails, naming what hangs."""


def pending_stacks() -> str:
    """The stack of every task still pending on the running loop, for a hang's report."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            print(f"--- {task.get_name()}: {task.get_coro()!r}", file=out)
            task.print_stack(limit=12, file=out)
    return out.getvalue()


@contextlib.asynccontextmanager
async def app_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Yield a :func:`build_app` bound to ``tmp_path``; close every app built on exit."""
    count = 0
    async with closing_apps() as apps:

        async def factory(turns: Sequence[Mapping[str, Any]] = (), /, *plugins: object,
                          **kwargs: Any) -> ChatChannel:
            nonlocal count
            count += 1
            kwargs.setdefault("data_dir", tmp_path / f"roost-{count}")
            chat = await build_app(turns, *plugins, **kwargs)
            assert chat.app is not None
            apps.append(chat.app)
            return chat

        yield factory


@contextlib.asynccontextmanager
async def replica_chats(database_url: str, root: Path,
                        provider: Callable[[], LLMProvider], /, *plugins: object,
                        count: int = 2, **settings: Any
                        ) -> AsyncIterator[tuple[list[Roost], list[ChatChannel]]]:
    """``count`` apps on one PostgreSQL database (replicas), each with ``plugins``, a
    model from ``provider()`` and a :class:`ChatChannel` of its own, claiming work;
    closed on exit. Each keeps its data under ``root / <a, b, ...>``."""
    async with closing_apps() as apps:
        chats: list[ChatChannel] = []
        for n in range(count):
            app, recorder = await create_app(provider(), *plugins,
                                             data_dir=root / chr(ord("a") + n),
                                             database_url=database_url, **settings)
            apps.append(app)
            chat = ChatChannel()
            await chat.attach(app, recorder)
            chats.append(chat)
            await app.recover()  # starts claiming
        yield apps, chats
