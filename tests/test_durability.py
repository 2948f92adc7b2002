"""Durable intake in one process: inbox, journal, outbox, recovery and shutdown drain.

A crash is simulated by closing the database under the running app and
abandoning it, as kill -9 would; a new app on the same data dir is the restart.
(tests/test_crash_recovery.py kills a real ``roost run`` with SIGKILL.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText, ToolCall
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.contracts.tools import Tool, ToolContext
from bot.dispatch.dispatcher import ShuttingDown
from bot.resilience.retry import RetryPolicy
from bot.storage.inbox import INTERRUPTED
from bot.testing.app import ChatChannel, settle
from tests.conftest import CHANNEL, USER, AppFactory


class GatedModel:
    """A provider whose answers the test hands out one by one."""

    name = "gated"

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []
        self.answers: asyncio.Queue[LLMResponse] = asyncio.Queue()
        self.arrived = asyncio.Event()

    def answer(self, text: str = "", *calls: ToolCall) -> None:
        self.answers.put_nowait(LLMResponse(text, tuple(calls)))

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        self.requests.append(request)
        self.arrived.set()
        response = await self.answers.get()
        if on_text is not None and response.text:
            on_text(response.text)
        return response

    async def wait_request(self, count: int) -> LLMRequest:
        while len(self.requests) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)
        return self.requests[count - 1]

    async def aclose(self) -> None:
        return None


class Counter:
    """A plugin with a ``bump`` tool that counts its executions (and can hang)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.hang = False
        self.started = asyncio.Event()

    @hookimpl
    def roost_tools(self, settings: Any, services: Any) -> list[Tool]:
        async def bump(ctx: ToolContext, args: Mapping[str, Any]) -> str:
            self.calls.append(str(args.get("n")))
            self.started.set()
            if self.hang:
                await asyncio.Event().wait()
            return f"bumped {args.get('n')}"

        return [Tool("bump", "Count one.", {"type": "object", "properties": {}}, bump)]


def message(text: str, event_id: str = "", sender: str = "u1") -> InboundMessage:
    return InboundMessage(channel="test", chat_id=sender, chat_type="direct", sender_id=sender,
                          text=text, message_id=event_id or text, event_id=event_id)


async def crash(app: Roost) -> None:
    """What SIGKILL leaves: the database closed under the app, every task abandoned."""
    await app.store.db.close()
    for task in [*app.dispatcher._tasks, *app.dispatcher.redeliveries.tasks]:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.gather(*app.dispatcher._tasks, return_exceptions=True)


async def restart(make_app: AppFactory, model: Any, *plugins: object,
                  **settings: Any) -> tuple[Roost, ChatChannel]:
    app, channel, _ = await make_app(model, *plugins, **settings)
    await app.recover()
    return app, channel


async def inbox_states(app: Roost) -> list[tuple[str, int]]:
    await app.store.writer.close()  # what was queued is committed
    async with app.store.db.execute("SELECT state, attempts FROM inbox ORDER BY id") as cur:
        return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_a_message_is_recorded_before_submit_returns(make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model)
    await app.dispatcher.submit(message("hello", "e1"))
    assert [s for s, _ in await inbox_states(app)] in (["pending"], ["running"])
    model.answer("hi")
    await settle(app)
    assert channel.replies == ["hi"]
    assert await inbox_states(app) == [("done", 1)]


async def test_a_redelivered_event_is_answered_once(make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model)
    await app.dispatcher.submit(message("hello", "e1"))
    await app.dispatcher.submit(message("hello", "e1"))
    model.answer("hi")
    await settle(app)
    model.answer("again")  # would be used by a second run
    await app.dispatcher.submit(message("hello", "e1"))
    await settle(app)
    assert channel.replies == ["hi"]
    assert len(model.requests) == 1


async def test_a_message_in_flight_at_a_crash_is_answered_after_restart(
        make_app: AppFactory) -> None:
    model = GatedModel()
    app, _, _ = await make_app(model)
    await app.dispatcher.submit(message("what is 2+2?", "e1"))
    await model.wait_request(1)
    await crash(app)

    model2 = GatedModel()
    model2.answer("4")
    app2, channel2 = await restart(make_app, model2)
    await settle(app2)
    assert channel2.replies == ["4"]
    assert model2.requests[0].messages[-1].content == "what is 2+2?"
    assert await inbox_states(app2) == [("done", 2)]


async def test_recovered_messages_run_in_order_per_session(make_app: AppFactory) -> None:
    model = GatedModel()
    app, _, _ = await make_app(model)
    for i in range(3):
        await app.dispatcher.submit(message(f"m{i}", f"e{i}"))
    await model.wait_request(1)
    await crash(app)

    model2 = GatedModel()
    for i in range(3):
        model2.answer(f"a{i}")
    app2, channel2 = await restart(make_app, model2)
    await settle(app2)
    assert channel2.replies == ["a0", "a1", "a2"]
    # Each run saw the earlier turns in its history.
    assert [m.content for m in model2.requests[2].messages] == ["m0", "a0", "m1", "a1", "m2"]


async def test_a_finished_tool_call_is_not_executed_again_after_a_crash(
        make_app: AppFactory) -> None:
    counter = Counter()
    model = GatedModel()
    app, _, _ = await make_app(model, counter)
    await app.dispatcher.submit(message("bump it", "e1"))
    model.answer("", ToolCall("call_1", "bump", {"n": 1}))
    await model.wait_request(2)  # the tool ran and its result went back to the model
    await crash(app)

    model2 = GatedModel()
    model2.answer("bumped once")
    app2, channel2 = await restart(make_app, model2, counter)
    await settle(app2)
    assert counter.calls == ["1"]
    assert channel2.replies == ["bumped once"]
    replayed = model2.requests[0].messages
    assert [m.role for m in replayed] == ["user", "assistant", "tool"]
    assert replayed[1].tool_calls[0].id == "call_1"
    assert replayed[2].content.startswith("bumped 1")
    history = (await app2.store.get("default:test:direct:u1")).messages
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]


async def test_a_tool_call_cut_off_by_a_crash_is_reported_not_repeated(
        make_app: AppFactory) -> None:
    counter = Counter()
    counter.hang = True
    model = GatedModel()
    app, _, _ = await make_app(model, counter)
    await app.dispatcher.submit(message("bump it", "e1"))
    model.answer("", ToolCall("call_1", "bump", {"n": 1}))
    await asyncio.wait_for(counter.started.wait(), 5)
    await crash(app)

    counter.hang = False
    model2 = GatedModel()
    model2.answer("I could not confirm it")
    app2, channel2 = await restart(make_app, model2, counter)
    await settle(app2)
    assert counter.calls == ["1"]
    tool_result = model2.requests[0].messages[-1]
    assert tool_result.role == "tool" and INTERRUPTED in tool_result.content
    assert channel2.replies == ["I could not confirm it"]


async def test_a_message_interrupted_three_times_is_given_up_with_a_notice(
        make_app: AppFactory) -> None:
    model = GatedModel()
    app, _, _ = await make_app(model)
    await app.dispatcher.submit(message("poison", "e1"))
    await model.wait_request(1)
    await crash(app)
    for _ in range(2):
        model = GatedModel()
        app, _ = await restart(make_app, model)
        await model.wait_request(1)
        await crash(app)

    model = GatedModel()
    app, channel = await restart(make_app, model)
    await settle(app)
    assert model.requests == []
    assert len(channel.sent) == 1 and "gave up" in channel.sent[0].text
    assert await inbox_states(app) == [("given_up", 3)]


async def test_sigterm_lets_runs_finish_within_the_grace_period(make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model, shutdown_grace_seconds=5)
    await app.dispatcher.submit(message("hello", "e1"))
    await model.wait_request(1)
    closing = asyncio.ensure_future(app.dispatcher.close(5))
    await asyncio.sleep(0)
    with pytest.raises(ShuttingDown):
        await app.dispatcher.submit(message("late", "e2"))
    model.answer("hi")
    await closing
    assert channel.replies == ["hi"]
    assert await inbox_states(app) == [("done", 1)]


async def test_runs_cut_by_shutdown_run_after_restart_uncounted(make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model)
    await app.dispatcher.submit(message("one", "e1"))
    await app.dispatcher.submit(message("two", "e2", sender="u2"))
    await model.wait_request(2)
    await app.close()  # the test apps' shutdown_grace_seconds is 0: nothing may finish
    assert channel.replies == []

    model2 = GatedModel()
    model2.answer("a")
    model2.answer("b")
    app2, channel2 = await restart(make_app, model2)
    await settle(app2)
    assert sorted(channel2.replies) == ["a", "b"]
    assert await inbox_states(app2) == [("done", 1), ("done", 1)]


class FlakyChannel(ChatChannel):
    """Refuses the first ``failures`` sends, as a platform in an outage would."""

    def __init__(self, failures: int) -> None:
        super().__init__(CHANNEL, sender=USER)
        self.failures = failures

    async def send(self, message: OutboundMessage) -> str | None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("platform down")
        await super().send(message)
        return str(len(self.sent))


async def test_a_reply_the_platform_refused_is_sent_after_restart(make_app: AppFactory) -> None:
    model = GatedModel()
    app, _, _ = await make_app(model)
    flaky = FlakyChannel(failures=10)
    await app.add_channel(flaky)
    await app.dispatcher.submit(InboundMessage(
        channel="test", chat_id="u1", chat_type="direct", sender_id="u1", text="hello",
        event_id="e1"))
    model.answer("hi")
    await settle(app)
    assert flaky.sent == []
    async with app.store.db.execute("SELECT state FROM outbox") as cur:
        assert [r[0] for r in await cur.fetchall()] == ["pending"]
    await crash(app)

    app2, channel2 = await restart(make_app, GatedModel())
    await channel2.wait_for_message()
    assert channel2.replies == ["hi"]
    await app2.store.writer.close()
    async with app2.store.db.execute("SELECT state, platform_id FROM outbox") as cur:
        assert await cur.fetchall() == [("delivered", None)]


class HeldChannel(ChatChannel):
    """Holds each send until released, noting whether a held send was cancelled."""

    def __init__(self) -> None:
        super().__init__(CHANNEL, sender=USER)
        self.sending = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def send(self, message: OutboundMessage) -> str | None:
        self.sending.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        await super().send(message)
        return "p1"


async def pending_reply(make_app: AppFactory) -> None:
    """Leave one committed reply in the outbox, as a platform outage and a crash do."""
    model = GatedModel()
    app, _, _ = await make_app(model)
    await app.add_channel(FlakyChannel(failures=10))
    await app.dispatcher.submit(InboundMessage(
        channel="test", chat_id="u1", chat_type="direct", sender_id="u1", text="hello",
        event_id="e1"))
    model.answer("hi")
    await settle(app)
    await crash(app)


async def test_a_shutdown_lets_a_reply_being_sent_again_finish(make_app: AppFactory) -> None:
    await pending_reply(make_app)
    app, _, _ = await make_app(GatedModel(), shutdown_grace_seconds=30)
    held = HeldChannel()
    await app.add_channel(held)
    await app.recover()
    async with asyncio.timeout(10):  # a hang guard
        await held.sending.wait()  # the platform call of the recovered reply is under way
        closing = asyncio.ensure_future(app.close())  # SIGTERM, the reply on its way
        while not app.dispatcher.lanes.closed:  # noqa: ASYNC110  (no event covers it)
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        held.release.set()  # the platform answers within the grace period
        await closing
    assert (held.cancelled, held.replies) == (False, ["hi"])
    again, channel = await restart(make_app, GatedModel())
    async with again.store.db.execute("SELECT state, platform_id FROM outbox") as cur:
        assert await cur.fetchall() == [("delivered", "p1")]
    assert channel.sent == []  # not sent twice


async def test_a_shutdown_does_not_wait_for_a_reply_due_again_later(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bot.dispatch.delivery.REDELIVERY", RetryPolicy.fixed(3600, 3600))
    model = GatedModel()
    app, _, _ = await make_app(model, shutdown_grace_seconds=30)
    await app.add_channel(FlakyChannel(failures=1))
    await app.dispatcher.submit(InboundMessage(
        channel="test", chat_id="u1", chat_type="direct", sender_id="u1", text="hello",
        event_id="e1"))
    model.answer("hi")
    await settle(app)  # refused once: the next attempt is due in an hour
    assert app.dispatcher.redeliveries.tasks
    async with asyncio.timeout(10):  # a hang guard: the hour is not waited for
        await app.close()
    _, channel = await restart(make_app, GatedModel())
    await channel.wait_for_message()
    assert channel.replies == ["hi"]  # kept in the outbox, sent after the next start


async def test_a_reply_refused_once_is_retried_in_the_same_process(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bot.dispatch.delivery.REDELIVERY", RetryPolicy.fixed(0.01, 0.01))
    model = GatedModel()
    app, _, _ = await make_app(model)
    flaky = FlakyChannel(failures=1)
    await app.add_channel(flaky)
    await app.dispatcher.submit(InboundMessage(
        channel="test", chat_id="u1", chat_type="direct", sender_id="u1", text="hello",
        event_id="e1"))
    model.answer("hi")
    await settle(app)
    await flaky.wait_for_message()
    assert flaky.replies == ["hi"]


async def test_commands_are_recorded_and_not_run_twice(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(GatedModel())
    await app.dispatcher.submit(message("/help", "c1"))
    await app.dispatcher.submit(message("/help", "c1"))
    await settle(app)
    assert len(channel.sent) == 1
    assert await inbox_states(app) == [("done", 0)]


async def test_store_survives_cancellation_at_every_await_of_session_creation(
        make_app: AppFactory, tmp_path: Path) -> None:
    app, _, _ = await make_app(GatedModel())
    store = app.store
    # Cancel loads of new sessions after 0, 1, 2 ... event-loop steps.
    for steps in range(30):
        task = asyncio.ensure_future(store.get(f"default:test:direct:new{steps}"))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    sessions = await asyncio.gather(*(store.get(f"default:test:direct:x{i}")
                                      for i in range(300)))
    assert len({s.id for s in sessions}) == 300
    assert not store.db.in_transaction


async def test_a_failing_statement_rolls_back_and_releases_the_connection(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(GatedModel())

    async def broken(db: Any) -> None:
        await db.execute("INSERT INTO plugin_state VALUES ('x', 1, 0)")
        await db.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(Exception, match="no_such_table"):
        await app.store.writer.write(broken)
    assert not app.store.db.in_transaction
    async with app.store.db.execute("SELECT COUNT(*) FROM plugin_state WHERE name = 'x'") as c:
        assert (await c.fetchone()) == (0,)
    session = await app.store.get("default:test:direct:after")
    assert session.id > 0


async def test_a_merge_cancelling_a_loading_run_loses_neither_message(
        make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model, merge_window_ms=5000)
    first = asyncio.ensure_future(app.dispatcher.submit(message("first", "e1")))
    second = asyncio.ensure_future(app.dispatcher.submit(message("second", "e2")))
    await asyncio.gather(first, second)
    model.answer("both")
    await settle(app)
    assert channel.replies == ["both"]
    assert model.requests[-1].messages[-1].content == "first\nsecond"
    assert [state for state, _ in await inbox_states(app)] == ["done", "done"]


async def test_hundreds_of_first_messages_at_once_are_all_answered(
        make_app: AppFactory) -> None:
    from bot.testing.app import scripted

    app, channel, _ = await make_app(scripted({"reply": "welcome"}, loop=True))
    await asyncio.gather(*(app.dispatcher.submit(message("hi", f"n{i}", sender=f"new{i}"))
                           for i in range(300)))
    await asyncio.wait_for(app.dispatcher.drain(), 30)
    assert len(channel.sent) == 300
    states = await inbox_states(app)
    assert len(states) == 300 and {s for s, _ in states} == {"done"}
    assert not app.store.db.in_transaction


async def test_a_follow_up_arriving_while_a_run_commits_gets_a_run_of_its_own(
        make_app: AppFactory) -> None:
    model = GatedModel()
    app, channel, log = await make_app(model, merge_window_ms=60_000)
    await app.dispatcher.submit(message("first", "e1"))
    model.answer("answer one")
    # Wait for the commit to begin, then send the follow-up inside the merge window.
    await log.wait_for(lambda e: e.payload.get("phase") == "committing")
    await app.dispatcher.submit(message("second", "e2"))
    model.answer("answer two")
    await settle(app)
    assert channel.replies == ["answer one", "answer two"]
    history = (await app.store.get("default:test:direct:u1")).messages
    assert [m.content for m in history] == ["first", "answer one", "second", "answer two"]


async def test_a_message_arriving_before_recovery_is_not_run_twice(
        make_app: AppFactory) -> None:
    model = GatedModel()
    app, _, _ = await make_app(model)
    await app.dispatcher.submit(message("old", "e1"))
    await model.wait_request(1)
    await crash(app)

    model2 = GatedModel()
    app2, channel2, _ = await make_app(model2)
    # The channel is already receiving when recovery starts.
    await app2.dispatcher.submit(message("new", "e2", sender="u2"))
    await model2.wait_request(1)
    await app2.recover()
    model2.answer("for new")
    model2.answer("for old")
    await settle(app2)
    assert sorted(channel2.replies) == ["for new", "for old"]
    assert len(model2.requests) == 2


async def test_a_run_cancelled_by_a_merge_during_the_session_load_does_not_take_the_merged_run_with_it(  # noqa: E501
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    model = GatedModel()
    app, channel, _ = await make_app(model, merge_window_ms=60_000)
    store = app.store
    loading = asyncio.Event()
    release = asyncio.Event()
    original = store._load_or_create

    async def slow_load(key: str, *row: Any) -> Any:
        loading.set()
        await release.wait()
        return await original(key, *row)

    monkeypatch.setattr(store, "_load_or_create", slow_load)
    await app.dispatcher.submit(message("first", "e1"))
    await asyncio.wait_for(loading.wait(), 5)
    # The follow-up merges: the first run is cancelled while it waits for the load.
    await app.dispatcher.submit(message("second", "e2"))
    release.set()
    model.answer("both")
    await settle(app)
    assert channel.replies == ["both"]
    assert model.requests[-1].messages[-1].content == "first\nsecond"


async def test_a_run_keeps_the_plugin_state_it_started_with(make_app: AppFactory) -> None:
    from bot.contracts.llm import Sanitizer

    class Masker:
        @hookimpl
        def roost_output_sanitizers(self) -> list[Sanitizer]:
            return [Sanitizer("mask", lambda text: text.replace("secret", "[x]"))]

    model = GatedModel()
    app, channel, _ = await make_app(model, Masker())
    await app.dispatcher.submit(message("one", "e1"))
    await model.wait_request(1)
    # Disabled while the run is in flight: the run finishes with what it started with.
    await app.set_plugin_enabled("test-plugin-0", False)
    model.answer("a secret")
    await settle(app)
    await app.dispatcher.submit(message("two", "e2"))
    model.answer("a secret")
    await settle(app)
    assert channel.replies == ["a [x]", "a secret"]


async def test_catch_up_cursors_name_the_newest_message_per_chat_and_thread(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(GatedModel())
    rows = [("c1", None, "900"), ("c1", None, "1000"), ("c1", "t7", "1100"),
            ("c1", None, "950"), ("c2", None, "5"), ("c3", "t9", "12")]
    for i, (chat, thread, event) in enumerate(rows):
        await app.inbox.add(InboundMessage(channel="discord", chat_id=chat, chat_type="group",
                                           sender_id="u", text=f"m{i}", thread_id=thread,
                                           event_id=event), f"k{i}")
    await app.inbox.add(InboundMessage(channel="telegram", chat_id="c1", chat_type="direct",
                                       sender_id="u", text="x", event_id="99999"), "kt")
    cursors = await app.inbox.cursors("discord", 0, limit=10)
    assert cursors == {"c1": "1000", "c1:t7": "1100", "c2": "5", "c3:t9": "12"}
    assert set(await app.inbox.cursors("discord", 0, limit=1)) == {"c3:t9"}


def test_entries_one_run_merged_stay_together_when_other_chats_lie_between() -> None:
    from bot.storage.inbox import InboxEntry, grouped

    def entry(i: int, session: str, run: str | None) -> InboxEntry:
        return InboxEntry(i, message(f"m{i}"), "message", session, "running", 1, run)

    groups = grouped([entry(1, "a", "r1"), entry(2, "b", "r2"), entry(3, "a", "r1"),
                      entry(4, "a", None), entry(5, "b", "r3")])
    assert [[e.id for e in g] for g in groups] == [[1, 3], [2], [4], [5]]
