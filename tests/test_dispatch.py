"""Queues, merging, cancellation and commands, driven through a channel."""

from __future__ import annotations

import asyncio

from bot.contracts.commands import Command, CommandContext
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import parse_command
from bot.engine.requests import RunOptions
from bot.testing.app import scripted, settle
from tests.conftest import AppFactory
from tests.test_runs import GateTools

BLOCK = {"steps": [{"tool_calls": [{"name": "block", "arguments": {"tag": "x"}}]},
                   {"reply": "unblocked"}]}


async def test_stop_cancels_a_run_blocked_in_a_slow_tool_and_persists_nothing(
    make_app: AppFactory,
) -> None:
    gate = GateTools()
    app, channel, log = await make_app(scripted(BLOCK), gate)
    await channel.say("work")
    await asyncio.wait_for(gate.started.wait(), 5)
    await channel.say("/stop")
    await settle(app)
    assert gate.cancelled == 1
    assert channel.replies == ["Stopped."]
    assert "run.cancelled" in log.types() and "run.completed" not in log.types()
    session = await app.store.get("default:test:direct:u1")
    assert session.messages == []


async def test_stop_cancels_a_slow_llm_stream(make_app: AppFactory) -> None:
    provider = scripted({"reply": "too late", "delay": 30})
    app, channel, log = await make_app(provider)
    await channel.say("think hard")
    await log.wait_for("activity")
    await channel.say("/stop")
    await settle(app)
    assert channel.replies == ["Stopped."]
    assert "run.cancelled" in log.types()
    assert (await app.store.get("default:test:direct:u1")).messages == []


async def test_stop_with_nothing_running_says_so(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "x"}))
    await channel.say("/stop")
    await settle(app)
    assert channel.replies == ["Nothing is running."]


async def test_direct_chat_runs_one_at_a_time_and_queues_the_rest(make_app: AppFactory) -> None:
    gate = GateTools()
    provider = scripted(BLOCK, {"reply": "second"})
    app, channel, _ = await make_app(provider, gate)
    await channel.say("first")
    await asyncio.wait_for(gate.started.wait(), 5)
    await channel.say("second")  # queued by the time say() returns
    assert app.dispatcher.running_count("default:test:direct:u1") == 1
    assert app.dispatcher.queue_length("default:test:direct:u1") == 1
    gate.release.set()
    await settle(app)
    assert channel.replies == ["unblocked", "second"]


async def test_full_queue_drops_the_oldest_message_with_a_notice(make_app: AppFactory) -> None:
    gate = GateTools()
    provider = scripted({"match": "^first$", **BLOCK}, {"reply": "{message}"}, loop=True)
    app, channel, _ = await make_app(provider, gate, queue_cap=2)
    await channel.say("first")
    await asyncio.wait_for(gate.started.wait(), 5)
    for text in ("q1", "q2", "q3"):
        await channel.say(text)
    await channel.wait_for_message(lambda m: m.kind == "notice")
    notices = [m for m in channel.sent if m.kind == "notice"]
    assert len(notices) == 1 and "dropped" in notices[0].text
    assert notices[0].reply_to is None and notices[0].chat_id == "u1"
    gate.release.set()
    await settle(app)
    replies = [m.text for m in channel.sent if m.kind == "reply"]
    assert replies == ["unblocked", "q2", "q3"]


async def test_stopall_cancels_every_group_run_and_drops_the_queue(make_app: AppFactory) -> None:
    gate = GateTools()
    app, channel, log = await make_app(scripted(BLOCK, loop=True), gate, group_max_concurrent=2)
    for who in ("a", "b", "c"):
        await channel.say(f"hi from {who}", sender=who, group="g")
    await gate.wait_entered(2)  # both running runs are inside the tool
    key = "default:test:group:g"
    assert app.dispatcher.running_count(key) == 2
    assert app.dispatcher.queue_length(key) == 1
    await channel.say("/stopall", sender="a", group="g")
    await settle(app)
    assert channel.replies == ["Stopped 2 run(s) and dropped 1 queued message(s)."]
    assert gate.cancelled == 2
    assert log.types().count("run.cancelled") == 2


async def test_group_runs_concurrently_up_to_the_limit(make_app: AppFactory) -> None:
    gate = GateTools(parties=3)
    barrier = {"steps": [{"tool_calls": [{"name": "barrier", "arguments": {"tag": "x"}}]},
                         {"reply": "through"}]}
    app, channel, _ = await make_app(scripted(barrier, loop=True), gate)
    for who in ("a", "b", "c"):
        await channel.say("go", sender=who, group="g")
    await settle(app)  # three runs meet at a 3-party barrier: only possible concurrently
    assert channel.replies == ["through"] * 3


async def test_rapid_messages_from_one_sender_merge_into_one_run(make_app: AppFactory) -> None:
    provider = scripted({"reply": "got: {message}", "delay": 0.3}, loop=True)
    app, channel, log = await make_app(provider, merge_window_ms=60_000)
    await channel.say("part one")
    await log.wait_for("run.started")
    await channel.say("part two")
    await settle(app)
    assert channel.replies == ["got: part one\npart two"]
    assert log.types().count("run.cancelled") == 1
    session = await app.store.get("default:test:direct:u1")
    assert [m.content for m in session.messages] == ["part one\npart two",
                                                      "got: part one\npart two"]


async def test_a_lone_message_is_not_delayed_by_the_merge_window(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "quick"}), merge_window_ms=60_000)
    await channel.say("alone")
    await settle(app, limit=5)  # a 60 s window would blow this timeout if it delayed runs
    assert channel.replies == ["quick"]


async def test_no_merge_once_the_run_has_shown_output(make_app: AppFactory) -> None:
    gate = GateTools()
    provider = scripted(
        {"steps": [{"text": "working", "tool_calls": [{"name": "block", "arguments": {}}]},
                   {"reply": "first done"}]},
        {"reply": "second done"},
    )
    app, channel, log = await make_app(provider, gate, merge_window_ms=60_000)
    await channel.say("one")
    await asyncio.wait_for(gate.started.wait(), 5)
    await channel.say("two")  # merged or queued by the time say() returns
    gate.release.set()
    await settle(app)
    assert channel.replies == ["first done", "second done"]
    assert "run.cancelled" not in log.types()


async def test_messages_from_different_senders_in_a_group_do_not_merge(
    make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "{message}", "delay": 0.1}, loop=True)
    app, channel, _ = await make_app(provider, merge_window_ms=60_000)
    await channel.say("from a", sender="a", group="g")
    await channel.say("from b", sender="b", group="g")
    await settle(app)
    assert sorted(channel.replies) == ["[a (id a)]: from a", "[b (id b)]: from b"]


async def test_unknown_command_gets_help_not_a_run(make_app: AppFactory) -> None:
    provider = scripted({"reply": "never"})
    app, channel, _ = await make_app(provider)
    await channel.say("/frobnicate now")
    await settle(app)
    assert channel.replies == ["I don't know /frobnicate. Send /help to see the commands."]
    assert provider.requests == []


async def test_admin_only_commands_refuse_everyone_else(make_app: AppFactory) -> None:
    ran: list[str] = []

    async def secret(ctx: CommandContext) -> str:
        ran.append(ctx.message.sender_id)
        return f"secret for {ctx.message.sender_id}"

    class AdminPlugin:
        @hookimpl
        def roost_commands(self) -> list[Command]:
            return [Command("secret", "admins only", secret, admin_only=True)]

    app, channel, _ = await make_app(scripted({"reply": "x"}), AdminPlugin(),
                                     admins=["test:boss"])
    await channel.say("/secret", sender="mallory")
    await channel.say("/secret", sender="boss")
    await settle(app)
    assert channel.replies == ["/secret is for admins only.", "secret for boss"]
    assert ran == ["boss"]


async def test_new_starts_a_fresh_session_and_help_lists_commands(make_app: AppFactory) -> None:
    provider = scripted({"reply": "{message}"}, loop=True)
    app, channel, _ = await make_app(provider)
    await channel.say("remember me")
    await settle(app)
    await channel.say("/reset")
    await settle(app)
    await channel.say("who?")
    await settle(app)
    assert [m.content for m in provider.requests[-1].messages] == ["who?"]
    await channel.say("/help")
    await settle(app)
    help_text = channel.replies[-1]
    for name in ("/help", "/stop", "/stopall", "/new /reset", "/status", "/whoami"):
        assert name in help_text


async def test_status_and_whoami_describe_the_session(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "hello"}), admins=["test:u1"])
    await channel.say("hi")
    await settle(app)
    await channel.say("/status")
    await settle(app)
    await channel.say("/whoami")
    await settle(app)
    status, whoami = channel.replies[-2:]
    assert "default:test:direct:u1 (2 messages)" in status
    assert "via scripted" in status and "queued: 0" in status
    assert "id u1" in whoami and "Admin: yes" in whoami


def test_command_parsing_handles_bot_suffixes_and_rejects_non_commands() -> None:
    assert parse_command("/stop") == ("stop", "")
    assert parse_command("/Status  extra words ") == ("status", "extra words")
    assert parse_command("/help@roost_bot", "roost_bot") == ("help", "")
    assert parse_command("/help@other_bot", "roost_bot") is None
    assert parse_command("/ nothing") is None
    assert parse_command("not /a command") is None
    assert parse_command("/path/to/file") is None


async def test_every_run_leaves_a_trace_record_with_its_outcome(make_app: AppFactory) -> None:
    gate = GateTools()
    provider = scripted({"match": "^block$", **BLOCK}, {"reply": "fine"}, loop=True)
    app, channel, log = await make_app(provider, gate)
    await channel.say("hello")
    await settle(app)
    await channel.say("block")
    await asyncio.wait_for(gate.started.wait(), 5)
    await channel.say("/stop")
    await settle(app)
    runs = await app.store.runs("default:test:direct:u1")
    assert [(r.status, r.error) for r in runs] == [("cancelled", "stop"), ("completed", "")]
    assert runs[1].iterations == 1 and runs[1].output_tokens > 0
    cancelled = [e for e in log.events if e.type == "run.cancelled"]
    assert cancelled[0].payload["reason"] == "stop"


async def test_scheduled_runs_wait_their_turn_and_report_their_result(
    make_app: AppFactory,
) -> None:
    from bot.contracts.messages import InboundMessage

    gate = GateTools()
    provider = scripted({"match": "^chat$", **BLOCK}, {"reply": "reminder: {message}"},
                        loop=True)
    app, channel, log = await make_app(provider, gate, merge_window_ms=60_000)
    await channel.say("chat")
    await asyncio.wait_for(gate.started.wait(), 5)
    job = InboundMessage("test", "u1", "direct", "u1", "drink water")
    done = app.dispatcher.run_scheduled(job, RunOptions(mode="minimal", kind="cron"))  # queued
    assert not done.done() and app.dispatcher.queue_length("default:test:direct:u1") == 1
    gate.release.set()
    result = await asyncio.wait_for(done, 5)
    assert result.reply == "reminder: drink water"
    assert channel.replies == ["unblocked", "reminder: drink water"]
    started = [e for e in log.events if e.type == "run.started"]
    assert started[-1].payload["kind"] == "cron"
    assert "run.cancelled" not in log.types()  # never merged with the chat message
