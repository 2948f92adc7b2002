"""The Slack channel: the real slack-bolt / slack_sdk against the fake Slack.

The core runs with a scripted provider; the fake signs and delivers events
like Slack and records every Web API call, so the tests assert what a Slack
user would see.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import aiohttp
import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.testing.app import EventRecorder, scripted, settle
from bot.testing.slack import ALICE, BOB, CHANNEL, DM_CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from channels.slack_format import from_slack, split_for_slack, to_mrkdwn
from plugins.scripted_provider import ScriptedProvider
from tests.conftest import AppFactory

FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)
BOSS = "U0BOSS"


async def start(make_app: AppFactory, fake: FakeSlack, provider: ScriptedProvider,
                *plugins: object, socket_mode: bool = False,
                **settings: Any) -> tuple[Roost, SlackChannel, EventRecorder]:
    """A Roost app with the real Slack channel talking to ``fake``."""
    app, _, log = await make_app(provider, *plugins, **fake.settings(socket_mode=socket_mode),
                                 **settings)
    channel = SlackChannel(app.settings, host="127.0.0.1", policy=FAST)
    await app.add_channel(channel)
    if not socket_mode:
        fake.events_url = channel.events_url
    return app, channel, log


async def replied(app: Roost, fake: FakeSlack, count: int = 1) -> None:
    """Wait for ``count`` posted messages, then for the app to go idle."""
    await fake.wait_for("chat.postMessage", count)
    await settle(app)


def last_user_text(provider: ScriptedProvider) -> str:
    return provider.requests[-1].messages[-1].content


# -- conversations ----------------------------------------------------------------------


async def test_a_dm_is_answered_at_the_top_level(fake_slack: FakeSlack,
                                                 make_app: AppFactory) -> None:
    provider = scripted({"reply": "Hi **there** & welcome"})
    app, channel, _ = await start(make_app, fake_slack, provider)
    assert channel.bot_user_id == fake_slack.bot_user_id
    assert fake_slack.sent("auth.test")

    delivery = await fake_slack.post_event(fake_slack.direct_message("hello"))
    assert delivery.status == 200
    await replied(app, fake_slack)

    [message] = fake_slack.visible()
    assert message.channel == DM_CHANNEL and message.thread_ts is None
    assert message.text == "Hi *there* &amp; welcome"
    assert last_user_text(provider) == "hello"
    assert (await app.store.get(f"default:slack:direct:{ALICE}")).messages


async def test_a_channel_message_needs_a_mention_and_is_answered_in_a_thread(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "on it"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)

    await fake_slack.post_event(fake_slack.message("just chatting"))
    await settle(app)
    assert provider.requests == [] and fake_slack.sent("chat.postMessage") == []

    event = fake_slack.message(fake_slack.mention("what's up?"))
    await fake_slack.post_event(event)
    await replied(app, fake_slack)
    [message] = fake_slack.visible()
    assert message.channel == CHANNEL and message.thread_ts == event["ts"]
    assert message.text == "on it"
    text = last_user_text(provider)
    assert "what's up?" in text and "<@" not in text
    # The top-level mention belongs to the channel's session, not a thread's.
    assert (await app.store.get(f"default:slack:group:{CHANNEL}")).messages


async def test_message_and_app_mention_events_of_one_post_are_handled_once(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "once"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    message = fake_slack.message(fake_slack.mention("hello"))
    mention = fake_slack.app_mention(message["text"], ts=message["ts"])
    await fake_slack.post_event(mention)
    await fake_slack.post_event(message)
    await replied(app, fake_slack)
    await settle(app)
    assert len(provider.requests) == 1
    assert len(fake_slack.sent("chat.postMessage")) == 1


async def test_a_reply_in_a_thread_the_bot_is_in_counts_as_addressed(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "reply to {message}"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    top = fake_slack.message(fake_slack.mention("start"))
    await fake_slack.post_event(top)
    await replied(app, fake_slack)

    # No mention, but the bot has posted in this thread.
    follow_up = fake_slack.message("and then?", user=BOB, thread_ts=top["ts"])
    await fake_slack.post_event(follow_up)
    await replied(app, fake_slack, 2)
    second = fake_slack.visible()[1]
    assert second.thread_ts == top["ts"] and "and then?" in second.text
    # A thread started elsewhere is a session of its own.
    thread_session = await app.store.get(f"default:slack:group:{CHANNEL}:{top['ts']}")
    assert [m.role for m in thread_session.messages] == ["user", "assistant"]

    # A thread the bot never joined is not addressed to it.
    other = fake_slack.message("unrelated", thread_ts=fake_slack.next_ts())
    await fake_slack.post_event(other)
    await settle(app)
    assert len(provider.requests) == 2


async def test_bots_and_the_bots_own_messages_are_ignored(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "x"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.bot_message(fake_slack.mention("beep")))
    own = fake_slack.message("my own words", user=fake_slack.bot_user_id,
                             bot_id=fake_slack.bot_id, channel=DM_CHANNEL)
    await fake_slack.post_event(own)
    edited = fake_slack.message(fake_slack.mention("edited"), subtype="message_changed")
    await fake_slack.post_event(edited)
    await settle(app)
    assert provider.requests == []
    assert fake_slack.sent("chat.postMessage") == []


async def test_no_reply_sends_nothing(fake_slack: FakeSlack, make_app: AppFactory) -> None:
    provider = scripted({"reply": "NO_REPLY"})
    app, _, log = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.direct_message("nothing to say?"))
    await log.wait_for("run.completed")
    await settle(app)
    assert [c.method for c in fake_slack.calls if c.method != "auth.test"] == []


# -- long and streamed replies -----------------------------------------------------------


async def test_a_long_reply_is_split_under_4000_chars_with_code_blocks_intact(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    code = "\n".join(f"value_{i} = {i} < {i + 1}" for i in range(300))
    reply = "Intro paragraph.\n\n" + "word " * 800 + "\n\n```python\n" + code + "\n```\n\nDone."
    assert len(reply) > 9_000
    provider = scripted({"reply": reply})
    app, _, _ = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.direct_message("long please"))
    await fake_slack.wait_until(lambda: len(fake_slack.visible()) >= 3
                                and fake_slack.visible()[-1].text.endswith("Done."))
    await settle(app)

    texts = [m.text for m in fake_slack.visible()]
    assert all(len(t) <= 4_000 for t in texts)
    for text in texts:
        assert text.count("```") % 2 == 0, text[:200]  # every piece renders on its own
    joined = "\n".join(texts)
    assert "value_299 = 299 &lt; 300" in joined and "python" not in joined
    code_lines = [line for line in joined.split("\n") if line.startswith("value_")]
    assert len(code_lines) == 300


async def test_streaming_edits_one_draft_at_most_once_a_second(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    words = " ".join(f"w{i}" for i in range(60))
    reply = f"{words} **done**"
    provider = scripted({"reply": reply, "chunk": 10, "chunk_delay": 0.06})
    app, _, _ = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.direct_message("stream it"))
    await fake_slack.wait_until(lambda: bool(fake_slack.visible())
                                and fake_slack.visible()[0].text.endswith("*done*"), limit=10)
    await settle(app)

    assert len(fake_slack.sent("chat.postMessage")) == 1
    [message] = fake_slack.visible()
    assert message.text == f"{words} *done*"
    assert message.edits and len(message.edits[0]) < len(message.text)
    updates = fake_slack.sent("chat.update")
    # Drafts are throttled to one edit a second; the final replacement may follow sooner.
    drafts = [fake_slack.sent("chat.postMessage")[0], *updates[:-1]]
    gaps = [b.at - a.at for a, b in itertools.pairwise(drafts)]
    assert all(gap >= 0.9 for gap in gaps), gaps
    assert len(updates) <= 4


async def test_stop_cancels_a_slow_run(fake_slack: FakeSlack, make_app: AppFactory) -> None:
    provider = scripted({"match": "^think$", "reply": "too late", "delay": 30},
                        {"reply": "unused"})
    app, _, log = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.direct_message("think"))
    await log.wait_for("activity")
    await fake_slack.post_event(fake_slack.direct_message("/stop"))
    await replied(app, fake_slack)
    assert [m.text for m in fake_slack.visible()] == ["Stopped."]
    assert "run.cancelled" in log.types()


async def test_the_slash_command_stops_a_run_in_its_channel(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "too late", "delay": 30})
    app, _, log = await start(make_app, fake_slack, provider)
    await fake_slack.post_event(fake_slack.message(fake_slack.mention("think hard")))
    await log.wait_for("activity")
    result = await fake_slack.slash_command("stop", user=BOB)
    assert result.status == 200 and result.elapsed < 3
    [response] = await fake_slack.wait_for_responses()
    await settle(app)
    assert response.url == result.response_url
    assert response.body == {"text": "Stopped.", "response_type": "ephemeral"}
    assert "run.cancelled" in log.types() and fake_slack.visible() == []


# -- commands ----------------------------------------------------------------------------


async def test_admin_only_commands_as_plain_text(fake_slack: FakeSlack,
                                                 make_app: AppFactory) -> None:
    app, _, _ = await start(make_app, fake_slack, scripted({"reply": "x"}),
                            admins=[f"slack:{BOSS}"])
    await fake_slack.post_event(fake_slack.message("/errors", user=ALICE, channel="D0A"))
    await replied(app, fake_slack)
    await fake_slack.post_event(fake_slack.message("/errors", user=BOSS, channel="D0B"))
    await replied(app, fake_slack, 2)
    by_channel = {m.channel: m.text for m in fake_slack.visible()}
    assert by_channel == {"D0A": "/errors is for admins only.",
                          "D0B": "No tool errors stored."}


async def test_admin_only_commands_via_the_slash_command(fake_slack: FakeSlack,
                                                         make_app: AppFactory) -> None:
    provider = scripted({"reply": "x"})
    app, _, _ = await start(make_app, fake_slack, provider, admins=[f"slack:{BOSS}"])
    denied = await fake_slack.slash_command("errors", user=ALICE)
    allowed = await fake_slack.slash_command("errors", user=BOSS, user_name="boss")
    for result in (denied, allowed):
        assert result.status == 200 and result.elapsed < 3
    responses = await fake_slack.wait_for_responses(2)
    await settle(app)
    by_url = {r.url: r.body["text"] for r in responses}
    assert by_url == {denied.response_url: "/errors is for admins only.",
                      allowed.response_url: "No tool errors stored."}
    assert provider.requests == [] and fake_slack.sent("chat.postMessage") == []


async def test_a_bare_slash_command_is_help_and_nonsense_gets_usage(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_slack, scripted({"reply": "x"}))
    await fake_slack.slash_command("", channel=DM_CHANNEL)
    await fake_slack.slash_command("what's the weather?")
    responses = await fake_slack.wait_for_responses(2)
    await settle(app)
    usage, help_text = sorted((r.body["text"] for r in responses),
                              key=lambda t: not t.startswith("Usage"))
    assert "/stop" in help_text  # the help text lists the commands
    # Slack shows the entities as "<" and ">", in code too.
    assert usage.startswith("Usage: `/roost &lt;command&gt; [args]`")


async def test_register_commands_logs_the_manifest_once(
    fake_slack: FakeSlack, make_app: AppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="roost.channels.slack"):
        app, channel, _ = await start(make_app, fake_slack, scripted({"reply": "x"}))
        await channel.register_commands(list(app.commands.values()))
    manifests = [r for r in caplog.records if "slash_commands:" in r.getMessage()]
    assert len(manifests) == 1 and manifests[0].levelno == logging.DEBUG
    assert "/roost" in manifests[0].getMessage() and "errors" in manifests[0].getMessage()


# -- delivery errors ---------------------------------------------------------------------


async def test_a_429_is_retried_after_retry_after_and_delivered_once(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_slack, scripted({"reply": "patient"}),
                            stream_channels={"slack": False})
    fake_slack.fail("chat.postMessage", 429, retry_after=1)
    await fake_slack.post_event(fake_slack.direct_message("hi"))
    await replied(app, fake_slack)
    first, second = fake_slack.calls_of("chat.postMessage")
    assert first.status == 429 and second.ok
    assert second.at - first.at >= 0.95
    assert [m.text for m in fake_slack.visible()] == ["patient"]


async def test_a_5xx_is_retried_with_backoff(fake_slack: FakeSlack,
                                             make_app: AppFactory) -> None:
    app, _, _ = await start(make_app, fake_slack, scripted({"reply": "eventually"}))
    fake_slack.fail("chat.postMessage", 503, times=2)
    await fake_slack.post_event(fake_slack.direct_message("hi"))
    await replied(app, fake_slack)
    assert [c.status for c in fake_slack.calls_of("chat.postMessage")] == [503, 503, 200]
    assert [m.text for m in fake_slack.visible()] == ["eventually"]


async def test_a_command_reply_honours_a_429_from_the_response_url(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, _, _ = await start(make_app, fake_slack, scripted({"reply": "x"}))
    fake_slack.fail("response_url", 429, retry_after=1)
    await fake_slack.slash_command("stop")
    [response] = await fake_slack.wait_for_responses(limit=5)
    await settle(app)
    assert response.body["text"] == "Nothing is running."


# -- the Events API endpoint -------------------------------------------------------------


async def test_url_verification_echoes_the_challenge(fake_slack: FakeSlack,
                                                     make_app: AppFactory) -> None:
    await start(make_app, fake_slack, scripted({"reply": "x"}))
    delivery = await fake_slack.url_verification("abc123")
    assert delivery.status == 200 and delivery.json() == {"challenge": "abc123"}


async def test_a_redelivered_event_is_answered_once(fake_slack: FakeSlack,
                                                    make_app: AppFactory) -> None:
    provider = scripted({"reply": "only once"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    event = fake_slack.direct_message("hello")
    first = await fake_slack.post_event(event)
    await replied(app, fake_slack)
    again = await fake_slack.post_event(event, event_id=first.event_id, retry_num=1)
    assert again.status == 200
    await settle(app)
    assert len(provider.requests) == 1
    assert len(fake_slack.sent("chat.postMessage")) == 1


async def test_a_forged_signature_gets_401_and_nothing_runs(fake_slack: FakeSlack,
                                                            make_app: AppFactory) -> None:
    provider = scripted({"reply": "x"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    forged = await fake_slack.post_event(fake_slack.direct_message("let me in"), forge=True)
    slash = await fake_slack.slash_command("errors", user=BOSS, forge=True)
    junk = await fake_slack.post_body("not even json", forge=True)
    stale = await fake_slack.post_body('{"type": "event_callback"}', timestamp=1)
    assert (forged.status, slash.status, junk.status, stale.status) == (401, 401, 401, 401)
    await settle(app)
    assert provider.requests == [] and fake_slack.responses == []
    assert [c.method for c in fake_slack.calls] == ["auth.test"]  # start()'s own check


async def test_malformed_payloads_are_acked_and_skipped(fake_slack: FakeSlack,
                                                        make_app: AppFactory) -> None:
    provider = scripted({"reply": "still here"})
    app, _, _ = await start(make_app, fake_slack, provider)
    not_text = fake_slack.direct_message("x")
    not_text["text"] = ["not", "text"]
    bad = [
        await fake_slack.post_body("not json"),
        await fake_slack.post_body("[1, 2]"),
        await fake_slack.post_event("garbage"),
        await fake_slack.post_event({"type": "message", "text": "no channel"}),
        await fake_slack.post_event(not_text),
        await fake_slack.post_event({"type": "reaction_added", "reaction": "+1"}),
    ]
    assert [d.status for d in bad] == [200] * len(bad)
    await fake_slack.post_event(fake_slack.direct_message("are you ok?"))
    await replied(app, fake_slack)
    assert [m.text for m in fake_slack.visible()] == ["still here"]
    assert len(provider.requests) == 1


async def test_stop_closes_the_endpoint(fake_slack: FakeSlack, make_app: AppFactory) -> None:
    _, channel, _ = await start(make_app, fake_slack, scripted({"reply": "x"}))
    await channel.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await fake_slack.url_verification()


async def test_a_refused_bot_token_fails_start(fake_slack: FakeSlack) -> None:
    settings = Settings(**{**fake_slack.settings(), "slack_bot_token": "xoxb-wrong"})

    async def handler(message: object) -> None:
        raise AssertionError("nothing should arrive")

    with pytest.raises(RuntimeError, match="invalid_auth"):
        await SlackChannel(settings).start(handler)


# -- Socket Mode -------------------------------------------------------------------------


async def test_socket_mode_acks_events_and_answers(fake_slack: FakeSlack,
                                                   make_app: AppFactory) -> None:
    provider = scripted({"reply": "over the socket"}, loop=True)
    app, channel, _ = await start(make_app, fake_slack, provider, socket_mode=True)
    assert channel.port is None  # nothing listens over HTTP
    assert fake_slack.sent("apps.connections.open")[0].token == fake_slack.app_token
    await fake_slack.wait_for_socket()

    event = fake_slack.direct_message("hi via socket")
    envelope_id = await fake_slack.socket_event(event, event_id="EvSOCK1")
    ack = await fake_slack.wait_for_ack(envelope_id)
    assert ack == {"envelope_id": envelope_id}
    await replied(app, fake_slack)
    assert [m.text for m in fake_slack.visible()] == ["over the socket"]

    # A redelivery is acked too, and skipped.
    again = await fake_slack.socket_event(event, event_id="EvSOCK1", retry_attempt=1)
    await fake_slack.wait_for_ack(again)
    malformed = await fake_slack.socket_send({"type": "events_api", "payload": {
        "type": "event_callback", "event": "garbage"}})
    await fake_slack.wait_for_ack(malformed)
    envelope_id, response_url = await fake_slack.socket_slash_command("whoami")
    await fake_slack.wait_for_ack(envelope_id)
    [response] = await fake_slack.wait_for_responses()
    await settle(app)
    assert response.url == response_url and f"id {ALICE}" in response.body["text"]
    assert len(provider.requests) == 1


# -- text conversion -----------------------------------------------------------------------


def test_markdown_becomes_mrkdwn() -> None:
    assert to_mrkdwn("**bold** and *it* and _it_ and ~~no~~") == \
        "*bold* and _it_ and _it_ and ~no~"
    assert to_mrkdwn("# Title\n## **Sub**") == "*Title*\n*Sub*"
    assert to_mrkdwn("see [docs](https://x.y/a?b=1&c=2) & <https://z.z>") == \
        "see <https://x.y/a?b=1&amp;c=2|docs> &amp; <https://z.z>"
    assert to_mrkdwn("a <@U1> <!channel> > b") == "a &lt;@U1&gt; &lt;!channel&gt; &gt; b"
    assert to_mrkdwn("- one\n* two\n> quote") == "• one\n• two\n> quote"
    assert to_mrkdwn("```python\nif a < b: **x**\n```\n`c<d` **e**") == \
        "```\nif a &lt; b: **x**\n```\n`c&lt;d` *e*"


def test_slack_text_becomes_plain_text() -> None:
    assert from_slack("<@U0BOT>: hi &lt;b&gt; &amp;lt;", "U0BOT") == ("hi <b> &lt;", True)
    assert from_slack("ask <@U0BOT> now", "U0BOT") == ("ask now", True)
    assert from_slack("<@U9|bob> in <#C1|general>: <https://a.b|site> <https://c.d>",
                      "U0BOT") == ("@bob in #general: site (https://a.b) https://c.d", False)


def test_split_for_slack_keeps_pieces_under_the_limit_after_escaping() -> None:
    pieces = split_for_slack("a & b " * 1_000, 1_000)
    assert all(len(p) <= 1_000 for p in pieces)
    assert "".join(pieces).count("&amp;") == 1_000


async def test_a_workspace_binding_sends_the_whole_slack_workspace_to_its_agent(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "support here"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider, agents={"support": {}},
                            bindings=[{"agent": "support", "group_id": fake_slack.team_id}])
    await fake_slack.post_event(fake_slack.message(fake_slack.mention("help")))
    await fake_slack.post_event(fake_slack.direct_message("and in private"))
    await replied(app, fake_slack, 2)
    assert (await app.store.get(f"support:slack:group:{CHANNEL}")).messages
    assert (await app.store.get(f"support:slack:direct:{ALICE}")).messages
    assert not (await app.store.get(f"default:slack:direct:{ALICE}")).messages


# -- restarts ------------------------------------------------------------------------------


async def test_an_event_slack_delivers_again_after_a_restart_is_answered_once(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    first_provider = scripted({"reply": "answered"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, first_provider)
    event = fake_slack.direct_message("hello")
    delivery = await fake_slack.post_event(event)
    await replied(app, fake_slack)
    await app.close()

    # Slack retries an event whose answer it did not see; the new process's
    # inbox already has it.
    provider = scripted({"reply": "twice?"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    await app.recover()
    again = await fake_slack.post_event(event, event_id=delivery.event_id, retry_num=1)
    assert again.status == 200
    await settle(app)
    assert provider.requests == []
    assert [m.text for m in fake_slack.visible()] == ["answered"]
