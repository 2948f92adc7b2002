"""The core takes presses, edits, deletions and reactions from channels without acting on
them yet: each is logged at debug level, nothing is run or answered, and messages still
run as before."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from bot.contracts.messages import (
    ButtonPress,
    InboundMessage,
    MessageDeletion,
    MessageEdit,
    ReactionEvent,
)


async def test_events_other_than_messages_are_logged_and_not_run(
        roost_app: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    chat = await roost_app([{"reply": "answered"}])
    edited = InboundMessage(channel=chat.name, chat_id="u1", chat_type="direct",
                            sender_id="u1", text="corrected text", message_id="1")
    events = [
        ButtonPress(channel=chat.name, chat_id="u1", message_id="7", data="approve:1",
                    user_id="u1", press_id="p1"),
        MessageEdit(edited),
        MessageDeletion(channel=chat.name, chat_id="u1", message_ids=("1",)),
        ReactionEvent(channel=chat.name, chat_id="u1", message_id="7", user_id="u1",
                      emoji="👍", added=True),
    ]
    with caplog.at_level(logging.DEBUG, logger="roost.intake"):
        for event in events:
            await chat.hand_in(event)
    await chat.settle()
    assert chat.replies == []
    assert chat.requests == []
    logged = [r.getMessage() for r in caplog.records if r.name == "roost.intake"]
    assert logged == [f"{chat.name}: {kind} not acted on" for kind in
                      ("ButtonPress",)]  # edits: tests/test_edits.py; reactions: test_receipts
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "roost.intake")
    # A message still takes the ordinary path.
    assert await chat.ask("hello") == ["answered"]


def test_button_data_is_limited_to_what_every_platform_takes() -> None:
    from bot.contracts.messages import MAX_BUTTON_DATA, Button, OutboundMessage

    assert Button("Approve", "a" * MAX_BUTTON_DATA).data == "a" * 64
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        Button("Approve", "é" * 33)  # 66 bytes in UTF-8
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        Button("Approve", "")
    with pytest.raises(ValueError, match="label"):
        Button(" ", "x")
    assert OutboundMessage(channel="c", chat_id="1", text="t").buttons == ()


def test_a_reply_with_buttons_survives_the_outbox() -> None:
    # A committed reply is stored as JSON and sent again from it after a failure or a restart.
    from bot.contracts.messages import Button, OutboundMessage
    from bot.storage.inbox import decode_outbound, encode_outbound

    reply = OutboundMessage("telegram", "1", "run it?", buttons=(
        (Button("Approve", "ap:1", "success"), Button("Deny", "dn:1", "danger")),
        (Button("Approve for this session", "as:1"),)))
    assert decode_outbound(encode_outbound(reply)) == reply
    plain = OutboundMessage("telegram", "1", "hello")
    assert decode_outbound(encode_outbound(plain)) == plain
