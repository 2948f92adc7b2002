"""Fuzz: real-shaped Slack payloads and their mutations, through slack-bolt into a running Roost.

The corpus holds payloads as Slack sends them (the Events API reference and
bolt's own tests): a DM, an ``app_mention``, a reply in a thread, a file
share, an edit (``message_changed``), another bot's post, the URL check, a
slash command's form body and a ``block_actions`` payload. Hypothesis mutates
them (wrong types, missing fields, megabyte strings, null bytes, lone
surrogates, nesting far past any decoder's depth, huge and negative numbers,
unknown fields) and the fake Slack delivers them, signed, over the Events API
or as Socket Mode envelopes. After every batch an ordinary DM in a new
conversation must be answered, and Roost's own loggers must have logged no
traceback and at most one warning line per bad payload.
"""

from __future__ import annotations

import copy
import itertools
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.testing.app import scripted
from bot.testing.fuzz import HOSTILE_VALUES, Mutation, Mutator, as_json
from bot.testing.slack import ALICE, BOB, BOT_USER_ID, CHANNEL, DM_CHANNEL, TEAM_ID, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.slack import SlackChannel
from tests.conftest import AppFactory
from tests.test_slack import start
from tests.test_slack_hostile import (
    RoostLog,
    roost_log_fixture,  # noqa: F401  (the fixture)
)

MUTATOR = Mutator(HOSTILE_VALUES)
"""The mutations (shared with the Discord fuzz test)."""
mutations = MUTATOR.strategy(max_node=400)


def as_form(fields: dict[str, Any]) -> str:
    """A form body; values that are no text are sent as their JSON (Slack's ``payload``)."""
    return urllib.parse.urlencode(
        {key: value if isinstance(value, str) else as_json(value)
         for key, value in fields.items()}, errors="surrogatepass")


# -- the corpus --------------------------------------------------------------------------------

TS = "1763900000.000100"


def _rich_text(text: str) -> list[dict[str, Any]]:
    return [{"type": "rich_text", "block_id": "Bf3Z", "elements": [
        {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}]}]


def _envelope(event: dict[str, Any]) -> dict[str, Any]:
    return {"token": "legacy-verification-token", "team_id": TEAM_ID, "api_app_id": "A0APP",
            "event": event, "type": "event_callback", "event_id": "Ev0FUZZ",
            "event_time": 1763900000, "event_context": "4-eyJldCI6Im1lc3NhZ2UifQ",
            "authorizations": [{"enterprise_id": None, "team_id": TEAM_ID,
                                "user_id": BOT_USER_ID, "is_bot": True,
                                "is_enterprise_install": False}],
            "is_ext_shared_channel": False}


def _message(text: str, **fields: Any) -> dict[str, Any]:
    return {"type": "message", "channel": DM_CHANNEL, "user": ALICE, "text": text, "ts": TS,
            "event_ts": TS, "channel_type": "im", "team": TEAM_ID, "client_msg_id":
            "5d3a6a6e-5b5e-4b57-9d3c-2f1a6d9c1e11", "blocks": _rich_text(text), **fields}


CORPUS: dict[str, tuple[str, dict[str, Any]]] = {
    "direct message": ("event", _envelope(_message("hello there"))),
    "app_mention": ("event", _envelope({
        "type": "app_mention", "channel": CHANNEL, "user": ALICE, "ts": TS, "event_ts": TS,
        "text": f"<@{BOT_USER_ID}> what's up? :smile:", "team": TEAM_ID,
        "blocks": _rich_text("what's up?")})),
    "message in a thread": ("event", _envelope(_message(
        "and then?", channel=CHANNEL, channel_type="channel", user=BOB,
        thread_ts="1763899999.000100", parent_user_id=BOT_USER_ID))),
    "file_share": ("event", _envelope(_message(
        "what is this?", subtype="file_share", upload=False, display_as_bot=False,
        files=[{"id": "F0FILE", "created": 1763900000, "name": "report.pdf",
                "title": "report.pdf", "mimetype": "application/pdf", "filetype": "pdf",
                "user": ALICE, "size": 52_000, "mode": "hosted", "is_external": False,
                "url_private": "https://files.slack.com/files-pri/T0TEAM-F0FILE/report.pdf",
                "permalink": "https://fake.slack.com/files/U0ALICE/F0FILE/report.pdf"}]))),
    "message_changed": ("event", _envelope({
        "type": "message", "subtype": "message_changed", "channel": DM_CHANNEL,
        "channel_type": "im", "hidden": True, "ts": "1763900001.000200",
        "event_ts": "1763900001.000200",
        "message": {"type": "message", "user": ALICE, "text": "hello (edited)", "ts": TS,
                    "edited": {"user": ALICE, "ts": "1763900001.000000"}},
        "previous_message": {"type": "message", "user": ALICE, "text": "hello", "ts": TS}})),
    "bot_message": ("event", _envelope({
        "type": "message", "subtype": "bot_message", "channel": CHANNEL,
        "channel_type": "channel", "bot_id": "B0OTHER", "username": "otherbot",
        "text": f"<@{BOT_USER_ID}> beep", "ts": TS, "event_ts": TS,
        "bot_profile": {"id": "B0OTHER", "name": "otherbot", "app_id": "A0OTHER"}})),
    "url_verification": ("json", {
        "token": "legacy-verification-token",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification"}),
    "slash command": ("form", {
        "token": "legacy-verification-token", "team_id": TEAM_ID, "team_domain": "fake",
        "channel_id": CHANNEL, "channel_name": "general", "user_id": ALICE,
        "user_name": "alice", "command": "/roost", "text": "help", "api_app_id": "A0APP",
        "is_enterprise_install": "false", "response_url": "",  # the fake's, filled in
        "trigger_id": "13345224609.738474920.8088930838d88f008e0"}),
    "block_actions": ("form", {"payload": {
        "type": "block_actions", "user": {"id": ALICE, "username": "alice", "team_id": TEAM_ID},
        "api_app_id": "A0APP", "token": "legacy-verification-token",
        "container": {"type": "message", "message_ts": TS, "channel_id": CHANNEL},
        "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "team": {"id": TEAM_ID, "domain": "fake"}, "channel": {"id": CHANNEL, "name": "general"},
        "response_url": "https://hooks.slack.com/actions/T0TEAM/1/abc",
        "actions": [{"action_id": "approve", "block_id": "b1", "type": "button",
                     "value": "yes", "action_ts": "1763900002.000300",
                     "text": {"type": "plain_text", "text": "Approve"}}]}}),
}

bad_payloads = st.tuples(st.sampled_from(sorted(CORPUS)), st.lists(mutations, max_size=3))
EXAMPLES = 100
BATCH = 8
"""Up to eight bad payloads between two ordinary messages (Hypothesis draws 4.5 on average):
about 450 mutated payloads per run, each batch still followed by an ordinary message."""


@dataclass
class Fuzzed:
    """The Roost every example talks to, and where fresh ids come from."""

    fake: FakeSlack
    channel: SlackChannel
    socket_mode: bool
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))


@pytest.fixture(name="fuzzed", params=["events-api", "socket-mode"])
async def fuzzed_fixture(request: pytest.FixtureRequest, fake_slack: FakeSlack,
                         make_app: AppFactory) -> Fuzzed:
    """One app for every example: what must survive is the process that saw them all."""
    socket_mode = request.param == "socket-mode"
    _, channel, _ = await start(make_app, fake_slack, scripted({"reply": "ok"}, loop=True),
                                socket_mode=socket_mode, stream_channels={"slack": False})
    if socket_mode:
        await fake_slack.wait_for_socket()
    return Fuzzed(fake_slack, channel, socket_mode)


def _fresh(fuzzed: Fuzzed, name: str) -> tuple[str, dict[str, Any]]:
    """A copy of a corpus payload with its own ids, so no example is a redelivery."""
    kind, payload = CORPUS[name]
    payload = copy.deepcopy(payload)
    n = next(fuzzed.numbers)
    if kind == "event":
        payload["event_id"] = f"Ev0FUZZ{n}"
        payload["event"]["ts"] = fuzzed.fake.next_ts()
        for file in payload["event"].get("files", []):
            # Served by the fake: a run fetches its files, and tests stay off the network.
            served = fuzzed.fake.file(b"%PDF-1.4 fuzz", file["name"], file["mimetype"])
            file["url_private"] = served["url_private"]
    elif "command" in payload:
        payload["response_url"] = f"{fuzzed.fake.url}/response/fuzz-{n}"
        payload["trigger_id"] = f"trigger.fuzz.{n}"
    return kind, payload


async def _deliver(fuzzed: Fuzzed, kind: str, payload: Any) -> None:
    fake = fuzzed.fake
    if fuzzed.socket_mode:
        envelope_type = {"event": "events_api", "json": "events_api", "form":
                         "slash_commands"}[kind]
        if isinstance(payload, dict) and "payload" in payload and kind == "form":
            envelope_type, payload = "interactive", payload["payload"]
        frame = {"type": envelope_type, "envelope_id": f"env-fuzz-{next(fuzzed.numbers)}",
                 "payload": payload, "accepts_response_payload": envelope_type != "events_api"}
        await fake.socket_send(as_json(frame))
        return
    if kind == "form" and isinstance(payload, dict):
        delivery = await fake.post_body(as_form(payload),
                                        content_type="application/x-www-form-urlencoded")
    else:
        delivery = await fake.post_body(as_json(payload))
    # 413: a body over the endpoint's 1 MB limit. Never a 404 or a 5xx, which
    # Slack would retry.
    assert delivery.status in (200, 413), (delivery.status, delivery.body[:200])


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(bad_payloads, min_size=1, max_size=BATCH))
async def test_roost_survives_mutated_slack_payloads_and_answers_the_next_message(
    fuzzed: Fuzzed, roost_log: RoostLog, batch: list[tuple[str, list[Mutation]]],
) -> None:
    fake = fuzzed.fake
    mark = roost_log.mark()
    for name, changes in batch:
        kind, payload = _fresh(fuzzed, name)
        mutated: Any = payload
        for change in changes:
            mutated = MUTATOR.apply(mutated, change)
        await _deliver(fuzzed, kind, mutated)

    # An ordinary DM in a conversation of its own must be answered.
    dm = f"D0FUZZ{next(fuzzed.numbers)}"
    ordinary = fake.message("are you there?", channel=dm)
    if fuzzed.socket_mode:
        await fake.wait_for_ack(await fake.socket_event(ordinary), limit=15)
    else:
        assert (await fake.post_event(ordinary)).status == 200
    await fake.wait_until(lambda: any(m.channel == dm for m in fake.visible()), limit=15,
                          what=f"an answer in {dm}")

    assert roost_log.tracebacks(mark) == []
    warnings = [r.getMessage() for r in roost_log.since(mark)]
    assert len(warnings) <= len(batch), warnings
    assert all("\n" not in w and len(w) < 1_000 for w in warnings), warnings
