"""The Discord channel: the real discord.py client against the fake Discord server.

The core runs with a scripted provider; the fake records every REST call, so
the tests assert what a Discord user would see.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import discord
import pytest

from bot.app.roost import Roost
from bot.testing.app import EventRecorder, scripted, settle
from bot.testing.discord import (
    BOT_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    GUILD_ID,
    THREAD_ID,
    USER_ID,
    FakeDiscord,
    user_payload,
)
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from plugins.scripted_provider import ScriptedProvider
from tests.conftest import AppFactory

FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)
MESSAGES = r"/channels/\d+/messages$"
MALLORY = user_payload(5001, "mallory")


async def start(make_app: AppFactory, fake: FakeDiscord, provider: ScriptedProvider,
                *plugins: object, delivery: DeliveryPolicy = FAST,
                **settings: Any) -> tuple[Roost, DiscordChannel, EventRecorder]:
    """A Roost app with the real Discord channel connected to ``fake``."""
    app, _, log = await make_app(provider, *plugins, **fake.settings(), **settings)
    channel = DiscordChannel(app.settings, guild_ready_timeout=0.05, delivery=delivery)
    await app.add_channel(channel)
    return app, channel, log


async def replied(app: Roost, fake: FakeDiscord, count: int = 1) -> None:
    """Wait for ``count`` posted messages, then for the app to go idle."""
    await fake.wait_for_call("POST", MESSAGES, count=count)
    await settle(app)


async def test_connects_with_the_message_content_intent_and_syncs_commands(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, channel, _ = await start(make_app, fake_discord, scripted({"reply": "x"}))
    identify = fake_discord.identifies[0]
    assert identify["token"] == fake_discord.token  # no "Bot " prefix on the gateway
    assert identify["intents"] & discord.Intents.message_content.flag
    assert fake_discord.calls_to("GET", "/users/@me")[0].headers["Authorization"] == \
        f"Bot {fake_discord.token}"
    names = [c["name"] for c in fake_discord.commands]
    assert {"help", "stop", "stopall", "new", "reset", "status", "errors"} <= set(names)
    assert len(names) == len(set(names))
    for command in fake_discord.commands:
        assert 1 <= len(command["description"]) <= 100
        assert command["options"] == [{"type": 3, "name": "args", "required": False,
                                       "description": command["options"][0]["description"]}]
    await app.close()
    assert channel.client is not None and channel.client.is_closed()
    assert discord.http.Route.BASE == "https://discord.com/api/v10"


async def test_a_wrong_token_fails_the_start_and_leaves_nothing_behind(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await make_app(scripted({"reply": "x"}),
                               **{**fake_discord.settings(), "discord_bot_token": "wrong"})
    channel = DiscordChannel(app.settings, guild_ready_timeout=0.05)
    with pytest.raises(RuntimeError, match="did not connect"):
        await channel.start(app.dispatcher.submit)
    assert channel.client is not None and channel.client.is_closed()
    assert discord.http.Route.BASE == "https://discord.com/api/v10"
    assert fake_discord.identifies == []


async def test_a_direct_message_gets_a_reply_with_typing_and_no_pings(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "hi @everyone, you said {message}"})
    app, _, _ = await start(make_app, fake_discord, provider)
    await fake_discord.dm("hello there")
    await replied(app, fake_discord)
    [message] = fake_discord.posted(DM_CHANNEL_ID)
    assert message.content == "hi @\u200beveryone, you said hello there"
    assert message.reference is None
    assert message.allowed_mentions is not None and message.allowed_mentions["parse"] == []
    assert fake_discord.calls_to("POST", f"/channels/{DM_CHANNEL_ID}/typing")
    assert [m.content for m in provider.requests[0].messages] == ["hello there"]


async def test_group_messages_need_a_mention_and_replies_reference_the_trigger(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "noted"}, loop=True)
    app, _, _ = await start(make_app, fake_discord, provider)
    await fake_discord.guild_message("just chatting")
    trigger = await fake_discord.guild_message("what was said?", mention=True)
    await replied(app, fake_discord)
    [reply] = fake_discord.posted(CHANNEL_ID)
    assert reply.content == "noted"
    assert reply.reference is not None
    assert int(reply.reference["message_id"]) == trigger
    assert reply.reference["fail_if_not_exists"] is False
    [request] = provider.requests
    asked = request.messages[-1].content
    assert "what was said?" in asked and f"<@{BOT_ID}>" not in asked
    # The un-addressed message was kept and handed over as context (in the note).
    assert "just chatting" in request.note
    assert await app.store.get(f"default:discord:group:{CHANNEL_ID}")


async def test_a_reply_to_the_bot_or_its_role_counts_as_a_mention(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "{message}"}, loop=True))
    await fake_discord.guild_message("first", mention=True)
    await replied(app, fake_discord)
    [bot_message] = fake_discord.posted(CHANNEL_ID)
    await fake_discord.reply_to_bot(bot_message, "and a follow-up")
    await replied(app, fake_discord, 2)
    await fake_discord.role_mention("by role")
    await replied(app, fake_discord, 3)
    texts = fake_discord.visible(CHANNEL_ID)
    assert "and a follow-up" in texts[1] and "by role" in texts[2]
    assert "<@&" not in texts[2]


async def test_messages_from_bots_are_ignored(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "{message}"}, loop=True)
    app, _, _ = await start(make_app, fake_discord, provider)
    await fake_discord.bot_message("hello, fellow bot")
    await fake_discord.dm("a person")
    await replied(app, fake_discord)
    assert fake_discord.visible() == ["a person"]
    assert len(provider.requests) == 1


async def test_a_long_reply_is_split_without_breaking_its_code_block(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    code = "\n".join(f"line_{i} = {i} * 2  # some commentary here" for i in range(130))
    text = "Here is the script:\n\n```python\n" + code + "\n```\n\nThat is all."
    assert len(text) > 2 * 2000
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": text}))
    await fake_discord.dm("write it")
    await replied(app, fake_discord, 3)
    pieces = fake_discord.visible(DM_CHANNEL_ID)
    assert len(pieces) == 3  # the code block spans all three
    for piece in pieces:
        assert len(piece) <= 2000
        assert piece.count("```") % 2 == 0  # every piece renders its block closed
    assert pieces[1].startswith("```python\n")
    for i in range(130):
        assert f"line_{i} = {i} * 2" in "".join(pieces)
    assert pieces[-1].endswith("That is all.")


async def test_streaming_edits_the_draft_at_most_once_a_second(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    text = " ".join(f"word{i}" for i in range(40))
    provider = scripted({"reply": text, "chunk": 12, "chunk_delay": 0.07})
    app, _, _ = await start(make_app, fake_discord, provider)
    await fake_discord.dm("stream please")
    await replied(app, fake_discord)
    [draft] = fake_discord.calls_to("POST", MESSAGES)
    edits = fake_discord.calls_to("PATCH", MESSAGES.replace("$", r"/\d+$"))
    assert edits, "the draft was never edited"
    # Drafts are edited at most once a second; the final text follows at once.
    times = [draft.at] + [e.at for e in edits[:-1]]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times)), times
    assert fake_discord.visible() == [text]  # the final text replaced the draft
    assert len(fake_discord.posted()) == 1


async def test_stop_during_a_slow_run_withdraws_the_draft(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "partial answer that never ends", "chunk": 8,
                         "chunk_delay": 30})
    app, _, log = await start(make_app, fake_discord, provider)
    await fake_discord.dm("think hard")
    await fake_discord.wait_for_call("POST", MESSAGES)  # the first draft
    await fake_discord.dm("/stop")
    await fake_discord.wait_for_call("POST", MESSAGES, count=2)
    await settle(app)
    assert fake_discord.visible() == ["Stopped."]
    assert fake_discord.calls_to("DELETE", MESSAGES.replace("$", r"/\d+$"))
    assert "run.cancelled" in log.types()


async def test_stop_cancels_a_run_still_waiting_for_the_model(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, log = await start(make_app, fake_discord, scripted({"reply": "late", "delay": 30}))
    await fake_discord.dm("think hard")
    await log.wait_for("activity")
    await fake_discord.dm("/stop")
    await replied(app, fake_discord)
    assert fake_discord.visible() == ["Stopped."]
    assert "run.cancelled" in log.types()


async def test_an_admin_only_command_answers_admins_only(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "x"}),
                            admins=[f"discord:{USER_ID}"])
    await fake_discord.dm("/errors", author=MALLORY)
    await replied(app, fake_discord)
    await fake_discord.dm("/errors")
    await replied(app, fake_discord, 2)
    refusal, answer = fake_discord.visible(DM_CHANNEL_ID)
    assert refusal == "/errors is for admins only."
    assert "admins only" not in answer


async def test_a_429_is_waited_out_and_the_reply_delivered_once(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "patience"}))
    fake_discord.fail_next(429, retry_after=0.3, method="POST", path=MESSAGES)
    await fake_discord.dm("hi")
    await replied(app, fake_discord)
    limited, ok = fake_discord.calls_to("POST", MESSAGES)
    assert (limited.status, ok.status) == (429, 200)
    assert ok.at - limited.at >= 0.3
    assert fake_discord.visible() == ["patience"]


async def test_a_server_error_is_retried(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "eventually"}),
                            stream_channels={"discord": False})
    fake_discord.fail_next(503, method="POST", path=MESSAGES)
    await fake_discord.dm("hi")
    await replied(app, fake_discord)
    assert [c.status for c in fake_discord.calls_to("POST", MESSAGES)] == [503, 200]
    assert fake_discord.visible() == ["eventually"]


async def test_a_reply_that_keeps_failing_is_logged_as_failed(
    fake_discord: FakeDiscord, make_app: AppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    app, _, log = await start(make_app, fake_discord, scripted({"reply": "lost"}),
                              stream_channels={"discord": False})
    fake_discord.fail_next(503, count=10, method="POST", path=MESSAGES)
    await fake_discord.dm("hi")
    await log.wait_for("run.completed")
    await settle(app)
    assert [c.status for c in fake_discord.calls_to("POST", MESSAGES)] == [503] * FAST.attempts
    assert fake_discord.visible() == []
    # send() raised, so the core reports the reply as not delivered.
    assert any("failed" in r.getMessage() and r.levelno >= logging.WARNING
               and r.name.startswith("roost.dispatch") for r in caplog.records)


async def test_a_redelivered_message_is_answered_once(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "{message}"}, loop=True)
    app, _, _ = await start(make_app, fake_discord, provider)
    await fake_discord.dm("once", message_id=777_001)
    await fake_discord.dm("once", message_id=777_001)
    await fake_discord.dm("twice")
    await replied(app, fake_discord, 2)
    assert fake_discord.visible() == ["once", "twice"]
    assert len(provider.requests) == 2


async def test_a_malformed_payload_is_skipped_and_the_client_keeps_working(
    fake_discord: FakeDiscord, make_app: AppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "{message}"}, loop=True))
    await fake_discord.malformed()
    await fake_discord.dm("still there?")
    await replied(app, fake_discord)
    assert fake_discord.visible() == ["still there?"]
    assert any("malformed MESSAGE_CREATE" in r.getMessage() for r in caplog.records)
    # A frame that is not even JSON is skipped too: the connection stays up.
    await fake_discord.send_raw("{this is not json")
    await fake_discord.send_raw("[" * 100_000 + "]" * 100_000)
    await fake_discord.dm("and now?")
    await replied(app, fake_discord, 2)
    assert fake_discord.visible() == ["still there?", "and now?"]
    assert len(fake_discord.identifies) == 1 and fake_discord.resumes == 0
    skipped = [r for r in caplog.records if "could not be decoded" in r.getMessage()]
    assert len(skipped) == 2 and not any(r.exc_info for r in skipped)


async def test_no_reply_sends_nothing(fake_discord: FakeDiscord, make_app: AppFactory) -> None:
    provider = scripted({"reply": "NO_REPLY", "chunk": 2, "chunk_delay": 0.01})
    app, _, log = await start(make_app, fake_discord, provider)
    await fake_discord.dm("ignore me")
    await log.wait_for("run.completed")
    await settle(app)
    assert fake_discord.calls_to("POST", MESSAGES) == []
    assert fake_discord.posted() == []


async def test_a_thread_message_is_its_own_session_answered_in_the_thread(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "in thread"}))
    trigger = await fake_discord.thread_message("hello thread", mention=True)
    await replied(app, fake_discord)
    [reply] = fake_discord.posted()
    assert reply.channel_id == THREAD_ID and reply.content == "in thread"
    assert reply.reference is not None and int(reply.reference["message_id"]) == trigger
    session = await app.store.get(f"default:discord:group:{CHANNEL_ID}:{THREAD_ID}")
    assert [m.content for m in session.messages][-1] == "in thread"


async def test_a_slash_command_interaction_is_deferred_routed_and_answered(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "x"}))
    interaction = await fake_discord.interaction("pin", "the sky is blue")
    await fake_discord.wait_for_call("PATCH", "/messages/@original")
    await settle(app)
    assert fake_discord.interaction_deferred(interaction)
    [callback] = fake_discord.calls_to("POST", "/callback$")
    assert callback.body == {"type": 5}
    assert fake_discord.visible(CHANNEL_ID) == ["Pinned as #1."]
    # The same command in a DM, answered the same way; /pins sees the group's pin only there.
    await fake_discord.interaction("whoami", guild=False, channel_id=DM_CHANNEL_ID)
    await fake_discord.wait_for_call("PATCH", "/messages/@original", count=2)
    await settle(app)
    [whoami] = fake_discord.visible(DM_CHANNEL_ID)
    assert f"id {USER_ID}" in whoami and "direct" in whoami
    assert fake_discord.calls_to("POST", MESSAGES) == []  # no stray channel messages


async def test_a_long_interaction_answer_continues_in_followups(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    from bot.contracts.commands import Command, CommandContext
    from bot.contracts.hookspecs import hookimpl

    async def essay(ctx: CommandContext) -> str:
        return "\n\n".join(f"Paragraph {i}: " + "words " * 60 for i in range(12))

    class EssayPlugin:
        @hookimpl
        def roost_commands(self) -> list[Command]:
            return [Command("essay", "a long answer", essay)]

    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "x"}), EssayPlugin())
    assert "essay" in [c["name"] for c in fake_discord.commands]
    await fake_discord.interaction("essay", channel_id=THREAD_ID)
    await fake_discord.wait_for_call("POST", r"/webhooks/\d+/[^/]+$")
    await settle(app)
    pieces = fake_discord.visible(THREAD_ID)
    assert len(pieces) == 3 and all(len(p) <= 2000 for p in pieces)
    assert pieces[0].startswith("Paragraph 0") and "Paragraph 11" in pieces[-1]


async def test_a_plain_slash_command_message_works_in_a_group(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "x"}))
    await fake_discord.guild_message("/whoami")
    await replied(app, fake_discord)
    [answer] = fake_discord.visible(CHANNEL_ID)
    assert f"id {USER_ID}" in answer and str(GUILD_ID) not in answer


async def test_a_server_binding_routes_guild_chats_and_leaves_dms_to_the_default(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await start(make_app, fake_discord, provider, agents={"guild": {}},
                            bindings=[{"agent": "guild", "group_id": str(GUILD_ID)}])
    await fake_discord.guild_message("in the server", mention=True)
    await fake_discord.dm("in private")
    await replied(app, fake_discord, 2)
    assert (await app.store.get(f"guild:discord:group:{CHANNEL_ID}")).messages
    assert (await app.store.get(f"default:discord:direct:{USER_ID}")).messages
    assert not (await app.store.get(f"guild:discord:direct:{USER_ID}")).messages


async def test_a_message_sent_while_roost_was_down_is_answered_after_the_restart(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_discord, scripted({"reply": "{message}"}, loop=True))
    await fake_discord.dm("before")
    await replied(app, fake_discord)
    await app.close()

    fake_discord.missed("while you were away", channel_id=DM_CHANNEL_ID)
    provider = scripted({"reply": "{message}"}, loop=True)
    app, _, _ = await start(make_app, fake_discord, provider)
    await app.recover()  # reads the DM's history after the last recorded message
    await replied(app, fake_discord, 2)
    assert fake_discord.visible(DM_CHANNEL_ID) == ["before", "while you were away"]
    assert len(provider.requests) == 1
