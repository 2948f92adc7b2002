"""Reply chunking, delivery retries and throttled streaming edits shared by the adapters."""

from __future__ import annotations

import asyncio

import pytest

from channels.chunking import split_message
from channels.delivery import DeliveryPolicy, EditStream, RateLimited, Transient, deliver


def test_short_text_is_one_piece() -> None:
    assert split_message("hello", 100) == ["hello"]


def test_splits_prefer_paragraphs_then_lines() -> None:
    text = ("a" * 40 + "\n\n" + "b" * 40 + "\n" + "c" * 40)
    assert split_message(text, 60) == ["a" * 40, "b" * 40, "c" * 40]
    assert split_message(text, 200) == [text]


def test_a_code_block_is_closed_and_reopened_across_pieces() -> None:
    code = "\n".join(f"print({i})" for i in range(200))
    text = f"Here:\n```python\n{code}\n```\nDone."
    pieces = split_message(text, 500)
    assert len(pieces) > 2 and all(len(p) <= 500 for p in pieces)
    for piece in pieces:
        assert piece.count("```") % 2 == 0, piece  # every piece renders on its own
    assert all(p.startswith("```python") for p in pieces[1:-1])
    body = "".join(pieces)
    assert all(f"print({i})" in body for i in range(200))


def test_a_single_huge_word_is_cut_hard() -> None:
    pieces = split_message("x" * 250, 100)
    assert [len(p) for p in pieces] == [96, 96, 58]


async def test_deliver_honours_retry_after_and_backs_off_on_transient_errors() -> None:
    waits: list[float] = []
    attempts = iter([RateLimited(3.0), Transient("502"), "sent"])

    async def call() -> str:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    assert await deliver(call, what="test", sleep=sleep) == "sent"
    assert waits[0] == 3.0 and 0.9 * 1.0 <= waits[1] <= 1.1 * 1.0


async def test_deliver_gives_up_after_the_last_attempt() -> None:
    async def call() -> str:
        raise Transient("503")

    async def sleep(seconds: float) -> None:
        return None

    with pytest.raises(Transient):
        await deliver(call, what="test", policy=DeliveryPolicy(attempts=3), sleep=sleep)


async def test_edit_stream_coalesces_edits_to_one_per_interval() -> None:
    sent: list[str] = []
    edits: list[str] = []
    final: list[tuple[str | None, str | None]] = []

    async def send(text: str) -> str:
        sent.append(text)
        return "m1"

    async def edit(message_id: str, text: str) -> None:
        edits.append(text)

    async def finalize(message_id: str | None, text: str | None) -> None:
        final.append((message_id, text))

    stream = EditStream(send=send, edit=edit, finalize=finalize, limit=100, interval=0.05)
    await stream.push("H")
    for text in ("He", "Hel", "Hell", "Hello"):
        await stream.push(text)
    await asyncio.sleep(0.1)
    await stream.push("Hello!")
    await stream.finish("Hello, world")
    assert sent == ["H"]
    assert edits == ["Hello"]  # four pushes inside the interval became one edit
    assert final == [("m1", "Hello, world")]
