"""The Telegram channel: the real aiogram against the fake Bot API, the core behind it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import pytest

import channels
from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.channel import sending_mark
from bot.contracts.commands import Command, CommandContext
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMProvider
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.app import EventRecorder, closing_apps, create_app, scripted, settle
from bot.testing.telegram import BOB, Call, FakeTelegram, parse_html, user
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.chunking import split_message
from channels.delivery import DeliveryPolicy, Limits
from channels.telegram import TelegramChannel
from channels.telegram.sender import MAX_TEXT, split_for_telegram, to_html, utf16_len
from plugins.scripted_provider import ScriptedProvider

GROUP = -1001234567890
FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)

TgFactory = Callable[..., Awaitable[tuple[Roost, TelegramChannel, EventRecorder]]]


@pytest.fixture(name="make_tg")
async def make_tg(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[TgFactory]:
    """``make_tg(provider, *plugins, channel_kwargs..., **settings)``: an app on Telegram."""
    async with closing_apps() as apps:

        async def factory(llm: LLMProvider, /, *plugins: object,
                          channel: dict[str, Any] | None = None,
                          **settings: Any) -> tuple[Roost, TelegramChannel, EventRecorder]:
            settings.setdefault("stream_replies", False)
            settings.setdefault("telegram_bot_token", fake_telegram.token)
            settings.setdefault("telegram_api_base", fake_telegram.base_url)
            app, log = await create_app(llm, *plugins, data_dir=tmp_path / "data", **settings)
            apps.append(app)
            # No proactive budget (3 calls per 3 s in a chat): these tests are not about
            # it and would wait it out; 429 windows still hold. test_telegram_delivery
            # and test_channel_helpers test the budget.
            # Drafts at the first push (not after 1 s or 400 chars): these tests are about
            # drafts; test_telegram_delivery tests when the first one is shown.
            options: dict[str, Any] = {"polling_timeout": 1, "policy": FAST,
                                       "limits": Limits(), "draft_after": 0, **(channel or {})}
            tg = TelegramChannel(app.settings, **options)
            await app.add_channel(tg)
            return app, tg, log

        yield factory


async def answered(fake: FakeTelegram, app: Roost, update: dict[str, Any]) -> None:
    """Wait until the bot took ``update`` and every run it started is over."""
    await fake.wait_confirmed(update["update_id"])
    await settle(app)


def last_user_text(provider: ScriptedProvider) -> str:
    return str(provider.requests[-1].messages[-1].content)


# -- direct chats, groups, mentions -------------------------------------------------


async def test_direct_message_gets_an_html_reply(make_tg: TgFactory,
                                                 fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "Hi **there**, {message}!"})
    app, _, _ = await make_tg(provider)
    update = fake_telegram.private_message("hello")
    [call] = await fake_telegram.wait_for("sendMessage")
    assert call.params == {"chat_id": 42, "text": "Hi <b>there</b>, hello!",
                           "parse_mode": "HTML"}  # no reply_parameters in a DM
    await answered(fake_telegram, app, update)
    assert fake_telegram.sent("sendChatAction")[0].params["action"] == "typing"
    assert (await app.store.get("default:telegram:direct:42")).messages[0].content == "hello"


PLAIN_PATH = {"channels/delivery.py", "channels/telegram/channel.py",
              "channels/telegram/client.py", "channels/telegram/inbound.py",
              "channels/telegram/outcomes.py", "channels/telegram/receiving.py",
              "channels/telegram/sender.py"}
"""The channel modules a plain direct message and its one-message reply run."""
REPO = Path(channels.__file__).resolve().parent.parent


async def test_a_plain_direct_message_runs_only_the_channel_modules_it_needs(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    # What a plain text and a short reply do not need (attachments, files, the cutter,
    # drafts, malformed updates) is skipped by a cheap check, not called to do nothing.
    app, _, _ = await make_tg(scripted({"reply": "Hi, {message}!"}, loop=True))
    await answered(fake_telegram, app, fake_telegram.private_message("warm up"))
    root = REPO
    ran: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(f"{root}/channels/"):
            ran.add(str(Path(frame.f_code.co_filename).relative_to(root)))

    previous = sys.getprofile()
    sys.setprofile(profile)  # this thread: the event loop's (not the validators' builder)
    try:
        update = fake_telegram.private_message("hello")
        await fake_telegram.wait_for("sendMessage", 2)
        await answered(fake_telegram, app, update)
    finally:
        sys.setprofile(previous)
    assert fake_telegram.visible(42)[-1] == "Hi, hello!"
    assert ran <= PLAIN_PATH, sorted(ran - PLAIN_PATH)
    assert {"channels/telegram/inbound.py", "channels/telegram/sender.py"} <= ran


async def test_html_is_escaped(make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "<script>alert('x')</script> & `a<b` **<i>**"})
    await make_tg(provider)
    fake_telegram.private_message("inject")
    [call] = await fake_telegram.wait_for("sendMessage")
    assert call.params["text"] == ("&lt;script&gt;alert('x')&lt;/script&gt; &amp; "
                                   "<code>a&lt;b</code> <b>&lt;i&gt;</b>")
    assert call.result["text"] == "<script>alert('x')</script> & a<b <i>"


async def test_group_message_without_mention_is_context_not_a_run(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "answer"}, loop=True)
    app, _, _ = await make_tg(provider)
    quiet = fake_telegram.group_message("the build is red again", sender=BOB)
    await answered(fake_telegram, app, quiet)
    assert fake_telegram.sent_texts() == [] and provider.requests == []
    asked = fake_telegram.mention("why is that?")
    [call] = await fake_telegram.wait_for("sendMessage")
    assert call.params["chat_id"] == GROUP
    assert call.params["reply_parameters"]["message_id"] == asked["message"]["message_id"]
    await answered(fake_telegram, app, asked)
    request = provider.requests[-1]
    assert last_user_text(provider) == "[Alice (id 42)]: why is that?"  # @test_bot stripped
    assert "the build is red again" in request.note  # the chatter, read after the history


async def test_reply_to_the_bot_counts_as_a_mention(make_tg: TgFactory,
                                                    fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "first"}, {"reply": "second"})
    app, _, _ = await make_tg(provider)
    fake_telegram.mention("start")
    await fake_telegram.wait_for("sendMessage")
    follow_up = fake_telegram.reply_to_bot("and then?")
    await fake_telegram.wait_for("sendMessage", 2)
    await answered(fake_telegram, app, follow_up)
    assert fake_telegram.sent_texts() == ["first", "second"]
    # A reply to someone else is not addressed to the bot.
    other = fake_telegram.group_message("me too", reply_to=follow_up["message"])
    await answered(fake_telegram, app, other)
    assert len(fake_telegram.sent_texts()) == 2


async def test_commands_for_another_bot_are_not_ours(make_tg: TgFactory,
                                                     fake_telegram: FakeTelegram) -> None:
    app, _, _ = await make_tg(scripted({"reply": "x"}))
    theirs = fake_telegram.command("/whoami@other_bot", group=True)
    await answered(fake_telegram, app, theirs)
    assert fake_telegram.sent_texts() == []
    ours = fake_telegram.command("/whoami@Test_Bot", group=True)
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, ours)
    assert "id 42" in call.params["text"] and "group" in call.params["text"]


async def test_start_button_shows_the_help(make_tg: TgFactory,
                                           fake_telegram: FakeTelegram) -> None:
    app, _, _ = await make_tg(scripted({"reply": "x"}))
    update = fake_telegram.command("/start", "deep-link-payload")
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert "/help" in call.params["text"] and "/stop" in call.params["text"]


async def test_messages_from_bots_are_ignored(make_tg: TgFactory,
                                              fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "x"})
    app, _, _ = await make_tg(provider)
    robot = user(999, "Robot", "robot_bot", is_bot=True)
    update = fake_telegram.private_message("beep", sender=robot)
    itself = fake_telegram.mention("echo", sender=fake_telegram.bot_user)
    await answered(fake_telegram, app, update)
    await answered(fake_telegram, app, itself)
    assert provider.requests == [] and fake_telegram.sent_texts() == []


async def test_forum_topics_are_sessions_and_replies_stay_in_the_topic(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "in {message}"}, loop=True)
    app, _, _ = await make_tg(provider)
    first = fake_telegram.topic_message("topic seven", thread_id=7)
    [call] = await fake_telegram.wait_for("sendMessage")
    assert call.params["message_thread_id"] == 7
    assert call.params["reply_parameters"]["message_id"] == first["message"]["message_id"]
    second = fake_telegram.topic_message("topic eight", thread_id=8)
    calls = await fake_telegram.wait_for("sendMessage", 2)
    assert calls[1].params["message_thread_id"] == 8
    await answered(fake_telegram, app, second)
    seven = await app.store.get(f"default:telegram:group:{GROUP}:7")
    eight = await app.store.get(f"default:telegram:group:{GROUP}:8")
    assert [m.content for m in seven.messages] == ["topic seven",
                                                   "in [Alice (id 42)]: topic seven"]
    assert len(eight.messages) == 2
    # The topic's creation message is not "a reply to the bot", even if the bot made it.
    assert first["message"]["reply_to_message"]["forum_topic_created"]


# -- long replies, streaming, silence -------------------------------------------------


def long_reply() -> str:
    prose = " ".join(f"word{i}" for i in range(700))  # about 5,500 characters
    code = "\n".join(f"line_{i} = {i} < {i + 1} and x & y" for i in range(150))
    return f"Intro **bold**\n\n{prose}\n\n```python\n{code}\n```\n\nThe end."


async def test_a_long_reply_is_split_without_breaking_code_blocks(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    text = long_reply()
    assert len(text) > 2 * MAX_TEXT
    app, _, _ = await make_tg(scripted({"reply": text}))
    asked = fake_telegram.mention("write a lot")
    await fake_telegram.wait_for("sendMessage", 3)
    await answered(fake_telegram, app, asked)
    calls = fake_telegram.sent()
    assert len(calls) >= 3 and all(c.status == 200 for c in fake_telegram.calls_of("sendMessage"))
    for call in calls:
        visible = parse_html(call.params["text"])  # valid HTML, every piece on its own
        assert utf16_len(visible) <= MAX_TEXT
        assert call.params["text"].count("<pre>") == call.params["text"].count("</pre>")
    # Only the first piece threads to the question.
    assert "reply_parameters" in calls[0].params
    assert all("reply_parameters" not in c.params for c in calls[1:])
    shown = "\n".join(c.result["text"] for c in calls)
    for i in range(150):
        assert f"line_{i} = {i} < {i + 1} and x & y" in shown
    assert shown.count("word699") == 1 and shown.endswith("The end.")
    blocks = [c for c in calls if "<pre>" in c.params["text"]]
    assert len(blocks) >= 2  # the block was cut, and reopened with its language
    assert all('class="language-python"' in c.params["text"] for c in blocks)


async def test_streaming_edits_are_throttled_and_end_with_the_final_text(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    words = " ".join(f"w{i}" for i in range(60)) + " **done**"
    provider = scripted({"reply": words, "chunk": 8, "chunk_delay": 0.02})
    app, _, _ = await make_tg(provider, stream_replies=True, channel={"edit_interval": 0.25})
    update = fake_telegram.private_message("stream please")
    await answered(fake_telegram, app, update)
    [draft] = fake_telegram.sent()
    edits = fake_telegram.sent("editMessageText")
    assert len(edits) >= 2
    assert all(e.params["message_id"] == draft.result["message_id"] for e in edits)
    gaps = [b.at - a.at for a, b in zip([draft, *edits], edits, strict=False)]
    assert all(gap >= 0.2 for gap in gaps[:-1]), gaps  # the last one is the final reply
    assert edits[-1].params["text"] == to_html(words)
    assert edits[-1].params["parse_mode"] == "HTML"
    assert fake_telegram.messages[(42, draft.result["message_id"])]["text"].endswith("done")
    # ~1.5 s of streaming at one edit per 0.25 s: far fewer edits than chunks.
    assert len(edits) <= 1.6 / 0.25 + 2


async def test_streamed_reply_longer_than_a_message_continues_in_new_messages(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    text = long_reply()
    provider = scripted({"reply": text, "chunk": 2000})
    app, _, _ = await make_tg(provider, stream_replies=True, channel={"edit_interval": 0.05})
    update = fake_telegram.private_message("long stream")
    await answered(fake_telegram, app, update)
    sent = fake_telegram.sent()
    final_edit = fake_telegram.sent("editMessageText")[-1]
    pieces = split_for_telegram(text)
    assert final_edit.params["text"] == to_html(pieces[0])
    assert [c.params["text"] for c in sent[1:]] == [to_html(p) for p in pieces[1:]]


async def test_no_reply_sends_nothing_even_when_streaming(make_tg: TgFactory,
                                                          fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "NO_REPLY", "chunk": 2, "chunk_delay": 0.01})
    app, _, _ = await make_tg(provider, stream_replies=True, group_policy="all")
    update = fake_telegram.group_message("chatter nobody asked about")
    await answered(fake_telegram, app, update)
    assert len(provider.requests) == 1
    assert fake_telegram.sent() == [] and fake_telegram.calls_of("deleteMessage") == []


async def test_a_withdrawn_stream_deletes_its_draft(make_tg: TgFactory,
                                                    fake_telegram: FakeTelegram) -> None:
    _, tg, _ = await make_tg(scripted({"reply": "x"}), stream_replies=True)
    message = InboundMessage(channel="telegram", chat_id="42", chat_type="direct",
                             sender_id="42", text="hi", message_id="1")
    stream = tg.open_stream(message)
    assert stream is not None
    await stream.push("Let me think")
    [draft] = await fake_telegram.wait_for("sendMessage")
    await stream.finish(None)
    [deleted] = fake_telegram.sent("deleteMessage")
    assert deleted.params["message_id"] == draft.result["message_id"]
    assert fake_telegram.messages == {}


async def test_a_draft_deleted_meanwhile_gets_the_final_reply_as_a_new_message(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    _, tg, _ = await make_tg(scripted({"reply": "x"}), stream_replies=True)
    message = InboundMessage(channel="telegram", chat_id=str(GROUP), chat_type="group",
                             sender_id="42", text="hi", message_id="77")
    stream = tg.open_stream(message)
    assert stream is not None
    await stream.push("Working on it")
    [draft] = await fake_telegram.wait_for("sendMessage")
    assert draft.params["reply_parameters"]["message_id"] == 77
    del fake_telegram.messages[(GROUP, draft.result["message_id"])]  # someone deleted it
    await stream.finish("Done: **42**")
    [edit] = fake_telegram.calls_of("editMessageText")
    assert edit.status == 400
    final = fake_telegram.sent()[-1]
    assert final.params["text"] == "Done: <b>42</b>"
    assert final.params["reply_parameters"]["message_id"] == 77


async def test_stop_during_a_slow_streaming_run_removes_the_draft(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "partial answer that goes on and on", "chunk": 8,
                         "chunk_delay": 0.5})
    app, _, log = await make_tg(provider, stream_replies=True, channel={"edit_interval": 0.05})
    fake_telegram.private_message("think slowly")
    [draft] = await fake_telegram.wait_for("sendMessage")
    stop = fake_telegram.command("/stop")
    await answered(fake_telegram, app, stop)
    assert "run.cancelled" in log.types()
    assert fake_telegram.sent_texts() == ["partial", "Stopped."]
    assert (42, draft.result["message_id"]) in fake_telegram.deleted


async def test_stop_cancels_a_slow_run(make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "too late", "delay": 30})
    app, _, log = await make_tg(provider)
    fake_telegram.private_message("think hard")
    await log.wait_for("activity")
    stop = fake_telegram.command("/stop")
    await answered(fake_telegram, app, stop)
    assert fake_telegram.sent_texts() == ["Stopped."]
    assert (await app.store.get("default:telegram:direct:42")).messages == []


async def test_typing_is_refreshed_while_the_run_lasts(make_tg: TgFactory,
                                                       fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "slow", "delay": 0.45})
    app, _, _ = await make_tg(provider, channel={"typing_interval": 0.1})
    update = fake_telegram.topic_message("take your time", thread_id=5)
    await answered(fake_telegram, app, update)
    typing = fake_telegram.sent("sendChatAction")
    assert len(typing) >= 2  # shown, then refreshed while the 0.45 s run lasted
    assert all(c.params["message_thread_id"] == 5 for c in typing)
    # The run's end cancels the refresher and waits for it: nothing more can follow.
    assert len(fake_telegram.sent("sendChatAction")) == len(typing)


# -- commands -------------------------------------------------------------------------


async def test_admin_commands_are_for_admins(make_tg: TgFactory,
                                             fake_telegram: FakeTelegram) -> None:
    app, _, _ = await make_tg(scripted({"reply": "x"}), admins=["telegram:42"])
    fake_telegram.command("/errors")
    await fake_telegram.wait_for("sendMessage")
    bob = fake_telegram.command("/errors", sender=BOB)
    await fake_telegram.wait_for("sendMessage", 2)
    await answered(fake_telegram, app, bob)
    assert fake_telegram.sent_texts(42) == ["No tool errors stored."]
    assert fake_telegram.sent_texts(43) == ["/errors is for admins only."]


async def test_commands_are_registered_with_admin_ones_only_for_admins(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    async def noop(ctx: CommandContext) -> str:
        return "ok"

    class Extra:
        @hookimpl
        def roost_commands(self) -> list[Command]:
            return [Command("Not-Valid", "skipped: Telegram refuses the name", noop),
                    Command("deploy_now", "ship it", noop, admin_only=True)]

    await make_tg(scripted({"reply": "x"}), Extra(), admins=["telegram:42", "slack:U1"])
    public = {c["command"] for c in fake_telegram.commands["default"]}
    admin = {c["command"] for c in fake_telegram.commands["chat:42"]}
    assert {"help", "stop", "new", "status"} <= public
    assert "errors" not in public and "deploy_now" not in public
    assert {"errors", "deploy_now"} <= admin and public <= admin
    assert not any("not" in name.lower() for name in public | admin)
    assert set(fake_telegram.commands) == {"default", "chat:42"}


# -- delivery failures ------------------------------------------------------------------


async def test_429_retry_after_is_honoured_and_the_reply_sent_once(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail("sendMessage", 429, retry_after=1)
    app, _, _ = await make_tg(scripted({"reply": "patient"}))
    update = fake_telegram.private_message("hi")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    limited, delivered = fake_telegram.calls_of("sendMessage")
    assert limited.status == 429 and delivered.status == 200
    assert delivered.at - limited.at >= 0.95
    assert fake_telegram.sent_texts() == ["patient"]


async def test_a_reply_is_marked_sending_at_its_call_and_unmarked_when_refused(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    # With replicas the outbox marks a reply as possibly shown: only once the adapter's
    # own waits are over, and taken back when Telegram certainly refused the call.
    _, tg, _ = await make_tg(scripted({"reply": "unused"}))
    fake_telegram.fail("sendMessage", 429, retry_after=1)
    marks: list[tuple[bool, float]] = []

    class Mark:
        async def record(self, on: bool, note: str | None = None) -> None:
            marks.append((on, time.perf_counter()))

    with sending_mark(Mark()):
        await tg.send(OutboundMessage(channel="telegram", chat_id="42", text="patient"))
    limited, delivered = fake_telegram.calls_of("sendMessage")
    assert [on for on, _ in marks] == [True, False, True]
    (_, first), (_, back), (_, again) = marks
    assert first <= limited.at <= back  # marked for the refused call only
    assert again - limited.at >= 0.95  # marked again after the 429 window, not during it
    assert again <= delivered.at
    assert fake_telegram.sent_texts() == ["patient"]


async def test_a_reply_whose_first_piece_was_shown_stays_marked_when_a_later_one_fails(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    _, tg, _ = await make_tg(scripted({"reply": "unused"}))
    marks: list[bool] = []

    class Mark:
        async def record(self, on: bool, note: str | None = None) -> None:
            marks.append(on)

    pieces = 0

    def refuse_the_second(call: Call) -> None:
        nonlocal pieces
        if call.method == "sendMessage":
            pieces += 1
            if pieces == 2:
                fake_telegram.fail("sendMessage", 403)

    fake_telegram.on_call = refuse_the_second
    with sending_mark(Mark()), pytest.raises(Exception, match="blocked"):
        await tg.send(OutboundMessage(channel="telegram", chat_id="42",
                                      text="x" * (MAX_TEXT + 10)))
    assert [c.status for c in fake_telegram.calls_of("sendMessage")] == [200, 403]
    assert marks == [True]  # the first piece may be on screen: at most once holds


async def test_server_errors_are_retried_then_delivered_once(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail("sendMessage", 502, times=2)
    app, _, _ = await make_tg(scripted({"reply": "eventually"}))
    update = fake_telegram.private_message("hi")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert [c.status for c in fake_telegram.calls_of("sendMessage")] == [502, 502, 200]
    assert fake_telegram.sent_texts() == ["eventually"]


async def test_a_reply_that_keeps_failing_is_logged_and_the_session_survives(
        make_tg: TgFactory, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_telegram.fail("sendMessage", 500, times=FAST.attempts)
    provider = scripted({"reply": "lost"}, {"reply": "found"})
    app, _, _ = await make_tg(provider)
    first = fake_telegram.private_message("one")
    await answered(fake_telegram, app, first)
    assert fake_telegram.sent_texts() == []
    assert "delivering run" in caplog.text
    second = fake_telegram.private_message("two")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, second)
    assert fake_telegram.sent_texts() == ["found"]
    session = await app.store.get("default:telegram:direct:42")
    assert [m.content for m in session.messages] == ["one", "lost", "two", "found"]


async def test_html_refused_by_telegram_is_resent_as_plain_text(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail("sendMessage", 400)  # "can't parse entities"
    app, _, _ = await make_tg(scripted({"reply": "**bold** claim"}))
    update = fake_telegram.private_message("hi")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    refused, plain = fake_telegram.calls_of("sendMessage")
    assert refused.status == 400 and refused.params["parse_mode"] == "HTML"
    assert plain.status == 200 and "parse_mode" not in plain.params
    assert plain.params["text"] == "**bold** claim"


# -- redelivery and garbage ---------------------------------------------------------------


async def test_a_redelivered_update_is_answered_once(make_tg: TgFactory,
                                                     fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "once"}, loop=True)
    app, tg, _ = await make_tg(provider)
    update = fake_telegram.private_message("hello")
    await answered(fake_telegram, app, update)
    fake_telegram.redeliver(update)
    later = fake_telegram.private_message("/whoami")
    await answered(fake_telegram, app, later)
    await tg.feed_raw(update)  # and once more, as a webhook retry would
    await settle(app)
    assert len(provider.requests) == 1
    assert fake_telegram.sent_texts()[0] == "once" and len(fake_telegram.sent_texts()) == 2


async def test_malformed_updates_are_skipped_and_polling_goes_on(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "still here"})
    app, tg, _ = await make_tg(provider)
    fake_telegram.push_raw({"update_id": 500, "message": {"text": "no chat, no id"}})
    fake_telegram.push_raw("not an update")
    fake_telegram.push_raw({"update_id": "x"})
    fake_telegram.push_raw({"update_id": 501, "edited_message": {"garbage": True}})
    fake_telegram.push_raw({"update_id": 502, "future_kind": {"x": 1}})  # unexpected type
    garbage: Any
    for garbage in (None, [], {"update_id": 10_000, "message": []}, {"message": {}}):
        await tg.feed_raw(garbage)
    update = fake_telegram.private_message("are you alive?")
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert call.params["text"] == "still here"
    assert fake_telegram.pending_updates == 0  # the garbage was confirmed, not re-served


# -- webhook mode and shutdown --------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_webhook_mode_checks_the_secret_and_answers(make_tg: TgFactory,
                                                          fake_telegram: FakeTelegram) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram/hook"
    app, _, _ = await make_tg(scripted({"reply": "via webhook"}), telegram_webhook_url=url,
                               telegram_webhook_port=port, telegram_webhook_secret="s3cret")
    assert fake_telegram.webhook is not None and fake_telegram.webhook.secret == "s3cret"
    assert fake_telegram.calls_of("getUpdates") == []
    async with aiohttp.ClientSession() as client:
        forged = {"update_id": 1, "message": {"message_id": 1, "date": 0, "text": "x",
                                              "chat": {"id": 42, "type": "private"},
                                              "from": {"id": 42, "is_bot": False,
                                                       "first_name": "Mallory"}}}
        async with client.post(url, json=forged) as resp:
            assert resp.status == 401
        async with client.post(url, data=b"{not json", headers={
                "X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
            assert resp.status == 200
    update = fake_telegram.private_message("hi over https")
    [call] = await fake_telegram.wait_for("sendMessage")
    await settle(app)
    assert call.params["text"] == "via webhook"
    assert (update["update_id"], 200) in fake_telegram.webhook_attempts


async def test_close_stops_polling_and_the_session(make_tg: TgFactory,
                                                   fake_telegram: FakeTelegram) -> None:
    app, tg, _ = await make_tg(scripted({"reply": "x"}), channel={"polling_timeout": 3600})
    await fake_telegram.wait_for("getUpdates", ok=False)
    # The hour-long poll is cut short (waiting it out would hit this liveness guard).
    await asyncio.wait_for(app.close(), 60)
    assert tg.bot is not None
    client = getattr(tg.bot.session, "_session", None)  # aiogram's aiohttp ClientSession
    assert client is None or client.closed
    assert tg.polling is not None and tg.polling.done()  # no poll can follow


async def test_a_bad_token_fails_at_start(tmp_path: Path, fake_telegram: FakeTelegram) -> None:
    settings = Settings(data_dir=tmp_path, telegram_bot_token="999:WRONG",
                        telegram_api_base=fake_telegram.base_url)
    channel = TelegramChannel(settings, policy=FAST)

    async def nothing(message: InboundMessage) -> None:
        return None

    with pytest.raises(Exception, match="Unauthorized"):
        await channel.start(nothing)


# -- translation and rendering, without the network ----------------------------------------


async def test_mentions_are_found_and_stripped_by_utf16_offsets(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    _, tg, _ = await make_tg(scripted({"reply": "x"}))
    assert tg.bot is not None
    text = "😀 hey @test_bot, look 👀 @someone_else"
    entities = [{"type": "mention", "offset": 7, "length": 9},
                {"type": "mention", "offset": 26, "length": 13}]
    from aiogram.types import Message

    raw = {"message_id": 5, "date": 0, "text": text, "entities": entities,
           "chat": {"id": GROUP, "type": "supergroup", "title": "G"},
           "from": {"id": 42, "is_bot": False, "first_name": "Alice"}}
    inbound = tg.translate(Message.model_validate(raw))
    assert inbound is not None and inbound.mentioned
    assert inbound.text == "😀 hey , look 👀 @someone_else"
    raw["entities"] = [entities[1]]
    plain = tg.translate(Message.model_validate(raw))
    assert plain is not None and not plain.mentioned and plain.text == text


def test_markdown_renders_to_valid_telegram_html() -> None:
    cases = {
        "**b** *i* _i_ ~~s~~ `c`": "<b>b</b> <i>i</i> <i>i</i> <s>s</s> <c>c</c>",
        "snake_case_name and 2 * 3 * 4": "snake_case_name and 2 * 3 * 4",
        "[docs](https://example.com/a?b=1&c=2)":
            '<a href="https://example.com/a?b=1&amp;c=2">docs</a>',
        "[x](javascript:alert(1))": "[x](javascript:alert(1))",
        "# Title": "<b>Title</b>",
        "```py\nif a < b:\n```": '<pre><code class="language-py">if a &lt; b:</code></pre>',
        "```\nunclosed & open": "<pre>unclosed &amp; open</pre>",
        "**unclosed <tag>": "**unclosed &lt;tag&gt;",
    }
    for source, expected in cases.items():
        html = to_html(source).replace("<code>", "<c>").replace("</code>", "</c>") \
            if "`c`" in source else to_html(source)
        assert html == expected, source
        parse_html(to_html(source))


def test_split_counts_utf16_units() -> None:
    text = "😀 " * 3000  # 6,000 characters, 9,000 UTF-16 units
    pieces = split_for_telegram(text)
    assert all(utf16_len(p) <= MAX_TEXT for p in pieces)
    assert "".join(pieces).replace(" ", "") == "😀" * 3000


@pytest.mark.parametrize("text", [
    "hi", "\n\nhi there\n\n", "\n \n", "", "😀" * (MAX_TEXT // 2), "😀" * (MAX_TEXT // 2 + 1),
    "a" * MAX_TEXT, "\n" + "a" * MAX_TEXT + "\n", "a" * (MAX_TEXT + 1), "```py\nx = 1\n```"])
def test_a_reply_that_fits_is_the_piece_the_cutter_would_give(text: str) -> None:
    # Text within the limit is not cut at all; it must come out as cutting would give it.
    cut = [p for piece in split_message(text, MAX_TEXT)
           for p in ([piece] if utf16_len(piece) <= MAX_TEXT else split_for_telegram(piece))]
    assert split_for_telegram(text) == cut
    assert all(utf16_len(p) <= MAX_TEXT for p in cut)


@pytest.mark.slow
def test_every_aiogram_model_still_builds_when_types_are_lazy() -> None:
    """channels.telegram_lazy defers aiogram's type building; every model must still build."""
    code = (
        "import channels.telegram_lazy as lazy\n"
        "assert lazy.LAZY, 'aiogram was built eagerly'\n"
        "import pydantic, aiogram.types as types, aiogram.methods as methods\n"
        "count = 0\n"
        "for module in (types, methods):\n"
        "    for name in module.__all__:\n"
        "        obj = getattr(module, name)\n"
        "        if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):\n"
        "            obj.model_rebuild(raise_errors=True)\n"
        "            count += 1\n"
        "assert count > 500, count\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


async def test_a_short_streamed_reply_is_a_typing_status_and_one_send_message(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "Sure, **done**.", "chunk": 3})
    app, _, _ = await make_tg(provider, stream_replies=True,
                              channel={"draft_after": 60.0})  # the default rule, never timed out
    update = fake_telegram.private_message("do it")
    await answered(fake_telegram, app, update)
    methods = [c.method for c in fake_telegram.calls
               if c.method not in ("getMe", "deleteWebhook", "setMyCommands", "getUpdates")]
    # The typing status may give way to the reply (it is never queued ahead of one).
    assert methods in (["sendChatAction", "sendMessage"], ["sendMessage"])
    assert fake_telegram.visible(42) == ["Sure, done."]
