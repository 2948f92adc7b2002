"""Slack under hostile input: bad signatures, malformed envelopes, shutdown, redeliveries.

The real slack-bolt / slack_sdk run against the fake Slack. Whatever arrives,
the adapter answers the way Slack expects (401 for a bad signature, 200 for
a payload it drops, 503 while shutting down), logs one line for it, never a
traceback, and the next ordinary message is answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.messages import OutboundMessage
from bot.testing.app import scripted, settle
from bot.testing.inbox import RecordingInbox as Inbox
from bot.testing.slack import CHANNEL, DM_CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from tests.conftest import AppFactory
from tests.test_slack import replied, start

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
ROOST_LOGGERS = ("roost", "bot.", "channels.", "plugins.")


class RoostLog(logging.Handler):
    """The records of Roost's own loggers, in order, with a way to wait for one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(ROOST_LOGGERS):
            self.records.append(record)
            self._loop.call_soon_threadsafe(self._changed.set)

    def mark(self) -> int:
        return len(self.records)

    def since(self, mark: int, level: int = logging.WARNING) -> list[logging.LogRecord]:
        return [r for r in self.records[mark:] if r.levelno >= level]

    def tracebacks(self, mark: int = 0) -> list[str]:
        """Records since ``mark`` that carry a traceback, with its last lines."""
        return [f"{r.name}: {r.getMessage()}"
                + (f" <- {logging.Formatter().formatException(r.exc_info)[-600:]}"
                   if r.exc_info else "")
                for r in self.records[mark:]
                if r.exc_info or r.stack_info or "Traceback" in r.getMessage()]

    async def wait_for(self, predicate: Callable[[logging.LogRecord], bool],
                       mark: int = 0, limit: float = 5.0) -> logging.LogRecord:
        async with asyncio.timeout(limit):
            while True:
                for record in self.records[mark:]:
                    if predicate(record):
                        return record
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture(name="roost_log")
async def roost_log_fixture() -> AsyncIterator[RoostLog]:
    """Records of Roost's own loggers during the test (``roost`` at debug level)."""
    handler = RoostLog()
    root, roost = logging.getLogger(), logging.getLogger("roost")
    level = roost.level
    roost.setLevel(logging.DEBUG)
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        roost.setLevel(level)


async def bare_channel(fake: FakeSlack, handler: Inbox, *,
                       socket_mode: bool = False) -> SlackChannel:
    channel = SlackChannel(Settings(**fake.settings(socket_mode=socket_mode)),
                           host="127.0.0.1", policy=FAST)
    await channel.start(handler)
    if socket_mode:
        await fake.wait_for_socket()
    else:
        fake.events_url = channel.events_url
    return channel


# -- the signature check ---------------------------------------------------------------------


@pytest.mark.parametrize("timestamp", [
    "abc", "1.5", "1e9", "", " ", "9" * 5_000, "-1", "１７６３９０００００", "0x10",
], ids=["letters", "fraction", "exponent", "empty", "blank", "huge", "negative",
        "fullwidth-digits", "hex"])
async def test_a_malformed_timestamp_signed_as_given_gets_401_not_a_500(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog, timestamp: str,
) -> None:
    provider = scripted({"reply": "fine"})
    app, _, _ = await start(make_app, fake_slack, provider)
    body = json.dumps(fake_slack.envelope(fake_slack.direct_message("sneaky")))
    delivery = await fake_slack.post_body(body, timestamp=timestamp)
    assert delivery.status == 401
    assert provider.requests == []
    assert roost_log.tracebacks() == []
    await fake_slack.post_event(fake_slack.direct_message("hello"))
    await replied(app, fake_slack)
    assert [m.text for m in fake_slack.visible()] == ["fine"]


@pytest.mark.parametrize("signature", [
    "", "v0=", "v0=é", "v0=" + "é" * 64, "v0=" + "g" * 64, "v1=" + "0" * 64, "garbage",
], ids=["empty", "no-digest", "non-ascii", "non-ascii-digest", "not-hex", "other-version",
        "garbage"])
async def test_a_malformed_signature_gets_401_not_a_500(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog, signature: str,
) -> None:
    provider = scripted({"reply": "x"})
    await start(make_app, fake_slack, provider)
    body = json.dumps(fake_slack.envelope(fake_slack.direct_message("let me in")))
    mark = roost_log.mark()
    delivery = await fake_slack.post_body(body, signature=signature)
    assert delivery.status == 401
    assert [r.getMessage() for r in roost_log.since(mark)] == \
        ["Slack: refused a request with a bad signature from 127.0.0.1"]
    assert roost_log.tracebacks() == [] and provider.requests == []


# -- envelopes Roost does not take -----------------------------------------------------------


def _form(**fields: Any) -> str:
    return urllib.parse.urlencode({k: json.dumps(v) if isinstance(v, dict | list) else v
                                   for k, v in fields.items()})


UNHANDLED: dict[str, tuple[str, str]] = {
    "block-actions": (_form(payload={"type": "block_actions", "user": {"id": "U1"},
                                     "actions": [{"action_id": "a", "block_id": "b"}]}),
                      "application/x-www-form-urlencoded"),
    "block-actions-without-actions": (_form(payload={"type": "block_actions", "user": "U1",
                                                     "actions": []}),
                                      "application/x-www-form-urlencoded"),
    "block-actions-not-a-list": (json.dumps({"type": "block_actions", "user": {"id": "U1"},
                                             "actions": 5}), "application/json"),
    "view-not-an-object": (json.dumps({"type": "view_submission", "view": 5}),
                           "application/json"),
    "shortcut": (_form(payload={"type": "shortcut", "callback_id": "c", "trigger_id": "t",
                                "user": {"id": "U1"}, "team": {"id": "T1"}}),
                 "application/x-www-form-urlencoded"),
    "app-rate-limited": (json.dumps({"type": "app_rate_limited", "team_id": "T1",
                                     "minute_rate_limited": 1518467820, "api_app_id": "A1"}),
                         "application/json"),
    "no-type": (json.dumps({"token": "t", "foo": 1}), "application/json"),
    "numeric-type": (json.dumps({"type": 5}), "application/json"),
    "form-without-command": ("a=b&c=d", "application/x-www-form-urlencoded"),
}


@pytest.mark.parametrize("name", list(UNHANDLED))
async def test_a_request_roost_does_not_handle_is_acked_with_200_and_one_warning(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog, name: str,
) -> None:
    provider = scripted({"reply": "still here"})
    app, _, _ = await start(make_app, fake_slack, provider)
    body, content_type = UNHANDLED[name]
    mark = roost_log.mark()
    delivery = await fake_slack.post_body(body, content_type=content_type)
    assert delivery.status == 200  # a 404 or a 500 would make Slack retry it
    assert len(roost_log.since(mark)) == 1, [r.getMessage() for r in roost_log.since(mark)]
    assert roost_log.tracebacks() == []
    await fake_slack.post_event(fake_slack.direct_message("are you ok?"))
    await replied(app, fake_slack)
    assert [m.text for m in fake_slack.visible()] == ["still here"]


async def test_a_slash_command_with_a_response_url_that_is_no_url_is_dropped(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog,
) -> None:
    provider = scripted({"reply": "x"})
    app, _, _ = await start(make_app, fake_slack, provider)
    form = _form(command="/roost", text="help", channel_id=CHANNEL, user_id="U0ALICE",
                 response_url="javascript:alert(1)", trigger_id="t.1")
    mark = roost_log.mark()
    delivery = await fake_slack.post_body(form, content_type="application/x-www-form-urlencoded")
    await settle(app)
    assert delivery.status == 200
    assert [r.getMessage() for r in roost_log.since(mark)] == \
        ["Slack: malformed slash command skipped: response_url is not an http(s) URL"]
    assert fake_slack.responses == []


# -- Socket Mode -----------------------------------------------------------------------------


async def test_socket_frames_that_are_no_envelopes_cost_a_warning_and_bad_envelopes_are_acked(
    fake_slack: FakeSlack, roost_log: RoostLog,
) -> None:
    inbox = Inbox()
    channel = await bare_channel(fake_slack, inbox, socket_mode=True)
    try:
        mark = roost_log.mark()
        for frame in ("{this is not json", "[" * 100_000 + "]" * 100_000, "[1, 2]", '"text"'):
            await fake_slack.socket_send(frame)
        bad_payload = await fake_slack.socket_send(
            {"type": "events_api", "payload": 5, "accepts_response_payload": False})
        bad_retry = await fake_slack.socket_send(
            {"type": "events_api", "retry_attempt": {"n": 1},
             "payload": fake_slack.envelope(fake_slack.direct_message("x"))})
        no_type = await fake_slack.socket_send({"payload": {}})
        interactive = await fake_slack.socket_send({"type": "interactive", "payload": {
            "type": "block_actions", "user": "U1", "actions": []}})
        for envelope_id in (bad_payload, bad_retry, no_type, interactive):
            assert await fake_slack.wait_for_ack(envelope_id) == {"envelope_id": envelope_id}
        good = await fake_slack.socket_event(fake_slack.direct_message("hello"))
        await fake_slack.wait_for_ack(good)
        assert [m.text for m in inbox.messages] == ["hello"]
        assert len(roost_log.since(mark)) == 8, [r.getMessage() for r in roost_log.since(mark)]
        assert roost_log.tracebacks() == []
    finally:
        await channel.stop()


# -- stop_intake -----------------------------------------------------------------------------


async def test_after_stop_intake_the_events_endpoint_answers_503_and_replies_still_go_out(
    fake_slack: FakeSlack,
) -> None:
    inbox = Inbox()
    channel = await bare_channel(fake_slack, inbox)
    try:
        await channel.stop_intake()
        delivery = await fake_slack.post_event(fake_slack.direct_message("too late"))
        assert delivery.status == 503  # Slack delivers it again, after the restart
        assert inbox.messages == []
        ts = await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL,
                                                text="a reply in flight"))
        assert [(m.ts, m.text) for m in fake_slack.visible()] == [(ts, "a reply in flight")]
    finally:
        await channel.stop()


async def test_after_stop_intake_socket_envelopes_are_left_unacked(
    fake_slack: FakeSlack, roost_log: RoostLog,
) -> None:
    inbox = Inbox()
    channel = await bare_channel(fake_slack, inbox, socket_mode=True)
    try:
        await channel.stop_intake()
        mark = roost_log.mark()
        envelope_id = await fake_slack.socket_event(fake_slack.direct_message("too late"))
        await roost_log.wait_for(lambda r: "left unacked at shutdown" in r.getMessage(), mark)
        assert envelope_id not in fake_slack.acks and inbox.messages == []
        await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="bye"))
        assert [m.text for m in fake_slack.visible()] == ["bye"]
    finally:
        await channel.stop()


# -- delivery_id -----------------------------------------------------------------------------


@pytest.mark.parametrize("thread", [False, True], ids=["top-level", "in-a-thread"])
async def test_a_reply_redelivered_after_a_restart_is_not_posted_twice(
    fake_slack: FakeSlack, thread: bool,
) -> None:
    reply = OutboundMessage(channel="slack", chat_id=CHANNEL, chat_type="group",
                            text=("word " * 1_000).strip(), delivery_id="roost-41",
                            thread_id=fake_slack.next_ts() if thread else None)
    first = await bare_channel(fake_slack, Inbox())
    try:
        posted = await first.send(reply)
    finally:
        await first.stop()
    assert len(fake_slack.visible()) == 2  # 5,000 characters are two messages

    # A new process: the core did not record the delivery and sends it again.
    second = await bare_channel(fake_slack, Inbox())
    try:
        # As the core marks it: an earlier attempt may have reached Slack.
        again = await second.send(dataclasses.replace(reply, redelivery=True))
    finally:
        await second.stop()
    assert again == posted
    assert len(fake_slack.sent("chat.postMessage")) == 2
    assert len(fake_slack.visible()) == 2


async def test_a_redelivery_posts_only_the_pieces_that_did_not_go_out(
    fake_slack: FakeSlack,
) -> None:
    text = ("word " * 1_000).strip()
    first = await bare_channel(fake_slack, Inbox())
    try:
        # The earlier process got the first piece out, then stopped.
        await first.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL,
                                         text=text[:3_000], delivery_id="roost-42"))
    finally:
        await first.stop()
    [earlier] = fake_slack.visible()

    second = await bare_channel(fake_slack, Inbox())
    try:
        last = await second.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL,
                                                  text=text, delivery_id="roost-42",
                                                  redelivery=True))
    finally:
        await second.stop()
    assert [m.ts for m in fake_slack.visible()] == [earlier.ts, last]
    assert fake_slack.visible()[1].metadata == {
        "event_type": "roost_reply", "event_payload": {"nonce": "roost-42#1"}}


# -- ids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("channel", "D0\ud83d"), ("user", "U0\udc00"), ("ts", "1763900000.\ud83d"),
    ("thread_ts", "abc"), ("channel", "D" * 1_000_000), ("user", "u0-lowercase"),
    ("ts", "1.5e9"),
], ids=["channel-surrogate", "user-surrogate", "ts-surrogate", "thread-ts-text",
        "megabyte-channel", "user-lowercase", "ts-exponent"])
async def test_an_event_whose_ids_are_not_slacks_is_dropped_with_one_warning(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog, key: str, value: str,
) -> None:
    provider = scripted({"reply": "fine"}, loop=True)
    app, _, _ = await start(make_app, fake_slack, provider)
    event = fake_slack.direct_message("hostile ids")
    event[key] = value
    mark = roost_log.mark()
    delivery = await fake_slack.post_body(json.dumps(fake_slack.envelope(event)))
    assert delivery.status in (200, 413)
    await fake_slack.post_event(fake_slack.message("hello", channel="D0NEXT"))
    await replied(app, fake_slack)
    assert [(m.channel, m.text) for m in fake_slack.visible()] == [("D0NEXT", "fine")]
    assert len(roost_log.since(mark)) <= 1 and roost_log.tracebacks() == []
    assert len(provider.requests) == 1


async def test_a_file_whose_name_has_a_lone_surrogate_is_recorded_and_answered(
    fake_slack: FakeSlack, make_app: AppFactory, roost_log: RoostLog,
) -> None:
    provider = scripted({"reply": "got it"})
    app, _, _ = await start(make_app, fake_slack, provider)
    # On the fake, so fetching it (and failing on the mangled URL) stays on 127.0.0.1.
    shared = fake_slack.file(b"%PDF-1.4", "report.pdf", "application/pdf")
    event = fake_slack.direct_message("see attached", subtype="file_share", files=[
        {"id": "F1", "name": "report \ud83d.pdf", "mimetype": "application/pdf\udc00",
         "url_private": shared["url_private"] + "\ud83d", "size": 10}])
    delivery = await fake_slack.post_event(event)
    assert delivery.status == 200
    await replied(app, fake_slack)
    await settle(app)
    assert "got it" in [m.text for m in fake_slack.visible()]
    assert roost_log.tracebacks() == []


async def test_a_first_delivery_does_not_read_the_history(fake_slack: FakeSlack) -> None:
    channel = await bare_channel(fake_slack, Inbox())
    try:
        await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="hi",
                                           delivery_id="roost-50"))
    finally:
        await channel.stop()
    assert len(fake_slack.sent("chat.postMessage")) == 1
    assert fake_slack.sent("conversations.history") == []
