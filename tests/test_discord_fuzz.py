"""Fuzz: real-shaped Discord gateway payloads and their mutations, through discord.py into Roost.

The corpus holds MESSAGE_CREATE and INTERACTION_CREATE payloads as the
gateway sends them (Discord's API reference): a guild message, a DM, a reply
to the bot, a message in a thread, a message with attachments and embeds,
and slash commands in a guild and in a DM. Hypothesis mutates them with the
same mutations as the Slack fuzz test (wrong types, missing fields, megabyte
strings, null bytes, lone surrogates, nesting far past any decoder's depth,
huge and negative ids, unknown fields) and the fake gateway dispatches them
to the real discord.py client of a running Roost. After every batch an
ordinary DM from a new conversation must be answered on the same gateway
session, and Roost's own loggers must have logged no traceback and at most
one warning line per bad payload.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.testing.app import scripted
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
from bot.testing.fuzz import HOSTILE_VALUES, Mutation, Mutator, as_json
from channels.discord import DiscordChannel
from tests.conftest import AppFactory
from tests.test_discord import start
from tests.test_slack_hostile import (
    RoostLog,
    roost_log_fixture,  # noqa: F401  (the fixture)
)

TIMESTAMP = "2026-11-23T16:00:00.000000+00:00"
ALICE = user_payload(USER_ID, "alice")
BOT = user_payload(BOT_ID, "testbot", bot=True)
MEMBER = {"roles": [], "joined_at": TIMESTAMP, "deaf": False, "mute": False, "flags": 0,
          "premium_since": None, "pending": False, "nick": None, "avatar": None}

MUTATOR = Mutator(HOSTILE_VALUES)
mutations = MUTATOR.strategy(max_node=400)


def message(content: str, channel_id: int = CHANNEL_ID, *, guild: bool = True,
            **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "0", "channel_id": str(channel_id), "type": 0, "content": content,
        "author": ALICE, "timestamp": TIMESTAMP, "edited_timestamp": None, "tts": False,
        "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
        "embeds": [], "pinned": False, "flags": 0, "components": [], "nonce": "1177",
    }
    if guild:
        data.update(guild_id=str(GUILD_ID), member=MEMBER)
    return {**data, **fields}


EARLIER = message("the bot said this", author=BOT, id="1300000000000000001")
CORPUS: dict[str, tuple[str, dict[str, Any]]] = {
    "guild message": ("MESSAGE_CREATE", message(
        f"<@{BOT_ID}> what's up? 😀", mentions=[{**BOT, "member": MEMBER}])),
    "direct message": ("MESSAGE_CREATE", message("hello there", DM_CHANNEL_ID, guild=False)),
    "reply to the bot": ("MESSAGE_CREATE", message(
        "and then?", type=19, referenced_message=EARLIER,
        message_reference={"type": 0, "message_id": EARLIER["id"],
                           "channel_id": str(CHANNEL_ID), "guild_id": str(GUILD_ID)})),
    "thread message": ("MESSAGE_CREATE", message(
        f"<@{BOT_ID}> in the thread", THREAD_ID, mentions=[BOT], position=3)),
    "attachments and embeds": ("MESSAGE_CREATE", message(
        "what is this?", DM_CHANNEL_ID, guild=False,
        attachments=[{"id": "1300000000000000002", "filename": "report.pdf", "size": 52_000,
                      "url": "https://cdn.discordapp.com/attachments/1/2/report.pdf",
                      "proxy_url": "https://media.discordapp.net/attachments/1/2/report.pdf",
                      "content_type": "application/pdf"},
                     {"id": "1300000000000000003", "filename": "cat.png", "size": 1_200,
                      "url": "https://cdn.discordapp.com/attachments/1/3/cat.png",
                      "proxy_url": "https://media.discordapp.net/attachments/1/3/cat.png",
                      "content_type": "image/png", "width": 64, "height": 64}],
        embeds=[{"type": "rich", "title": "Release", "description": "Version 2",
                 "url": "https://example.com", "color": 5814783,
                 "fields": [{"name": "Changes", "value": "many", "inline": False}],
                 "footer": {"text": "roost"}}])),
}
COMMANDS = ("guild slash command", "dm slash command")
bad_payloads = st.tuples(st.sampled_from(sorted([*CORPUS, *COMMANDS])),
                         st.lists(mutations, max_size=3))
EXAMPLES = 100
BATCH = 8
"""Up to eight bad payloads between two ordinary messages (Hypothesis draws 4.5 on average):
about 450 mutated payloads per run, each batch still followed by an ordinary message."""


@dataclass
class Fuzzed:
    """The Roost every example talks to, and where fresh ids come from."""

    fake: FakeDiscord
    channel: DiscordChannel
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1_400_000_000_000_000_000))


@pytest.fixture(name="fuzzed")
async def fuzzed_fixture(fake_discord: FakeDiscord, make_app: AppFactory) -> Fuzzed:
    """One app for every example: what must survive is the process that saw them all."""
    _, channel, _ = await start(make_app, fake_discord, scripted({"reply": "ok"}, loop=True),
                                stream_channels={"discord": False})
    return Fuzzed(fake_discord, channel)


def _fresh(fuzzed: Fuzzed, name: str) -> tuple[str, dict[str, Any]]:
    """A copy of a corpus payload with its own ids, so no example is a redelivery."""
    if name in COMMANDS:
        guild = name.startswith("guild")
        return "INTERACTION_CREATE", fuzzed.fake.interaction_payload(
            "status", "now", channel_id=CHANNEL_ID if guild else DM_CHANNEL_ID, guild=guild)
    event, payload = CORPUS[name]
    payload = copy.deepcopy(payload)
    payload["id"] = str(next(fuzzed.ids))
    for attachment in payload.get("attachments", []):
        # Served by the fake CDN: a run fetches its files, and tests stay off the network.
        served = fuzzed.fake.attachment(b"%PDF-1.4 fuzz", attachment["filename"],
                                        attachment["content_type"], channel_id=DM_CHANNEL_ID)
        attachment.update(url=served["url"], proxy_url=served["proxy_url"])
    return event, payload


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(bad_payloads, min_size=1, max_size=BATCH))
async def test_roost_survives_mutated_gateway_payloads_and_answers_the_next_message(
    fuzzed: Fuzzed, roost_log: RoostLog, batch: list[tuple[str, list[Mutation]]],
) -> None:
    fake = fuzzed.fake
    sessions = (len(fake.identifies), fake.resumes)
    mark = roost_log.mark()
    for name, changes in batch:
        event, payload = _fresh(fuzzed, name)
        mutated: Any = payload
        for change in changes:
            mutated = MUTATOR.apply(mutated, change)
        await fake.dispatch_raw(event, as_json(mutated))

    # An ordinary DM in a conversation of its own must be answered.
    dm = next(fuzzed.ids)
    await fake.push_message(message("are you there?", dm, guild=False, id=str(next(fuzzed.ids)),
                                    author=user_payload(next(fuzzed.ids), "newcomer")))
    await fake.wait_for_call("POST", rf"^/channels/{dm}/messages$", limit=15)

    assert (len(fake.identifies), fake.resumes) == sessions  # the gateway session held
    assert roost_log.tracebacks(mark) == []
    warnings = [r.getMessage() for r in roost_log.since(mark)]
    assert len(warnings) <= len(batch), warnings
    assert all("\n" not in w and len(w) < 1_000 for w in warnings), warnings
