"""Reply chunking, delivery retries, throttled streaming edits and rate limits shared by the
adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from channels.chunking import split_message
from channels.delivery import (
    BOT,
    TELEGRAM_LIMITS,
    DeliveryPolicy,
    EditStream,
    Limits,
    RateLimited,
    RateLimiter,
    Transient,
    deliver,
)


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
    attempts: Iterator[Exception | str] = iter([RateLimited(3.0), Transient("502"), "sent"])

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

    edited = asyncio.Event()

    async def edit(message_id: str, text: str) -> None:
        edits.append(text)
        edited.set()

    async def finalize(message_id: str | None, text: str | None) -> str | None:
        final.append((message_id, text))
        return "m2"  # the final reply needed a new message

    stream = EditStream(send=send, edit=edit, finalize=finalize, limit=100, interval=0.05)
    await stream.push("H")
    for text in ("He", "Hel", "Hell", "Hello"):
        await stream.push(text)
    await asyncio.wait_for(edited.wait(), 5)  # the interval passed: one edit for the four
    await stream.push("Hello!")
    await stream.finish("Hello, world")
    assert sent == ["H"]
    assert edits == ["Hello"]  # four pushes inside the interval became one edit
    assert final == [("m1", "Hello, world")]
    assert stream.message_id == "m2"  # the stream names the message carrying the reply


# -- the rate limiter, on a clock that only its own waits move ---------------------------------


class Clock:
    """A clock advanced by the limiter's own sleeps, so waits are exact and instant."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def limiter(limits: Limits | None = None) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    return RateLimiter(limits or Limits(), clock=clock, sleep=clock.sleep), clock


async def test_a_429_holds_every_call_to_its_chat_until_retry_after_passed() -> None:
    limits, clock = limiter()
    with pytest.raises(RateLimited):
        async with limits.slot("chat:1"):
            raise RateLimited(5.0)
    async with limits.slot("chat:1", urgent=False) as go:
        assert not go  # a typing indicator or draft skips the call
    async with limits.slot("chat:2") as go:
        assert go and clock.slept == []  # another chat is not held
    async with limits.slot("chat:1") as go:
        assert go and clock.now == 105.0  # a final reply waits the window out


async def test_a_429_in_the_bot_scope_holds_every_chat() -> None:
    limits, clock = limiter()
    with pytest.raises(RateLimited):
        async with limits.slot("chat:1"):
            raise RateLimited(2.0, scope=BOT)  # a global flood
    async with limits.slot("chat:9"):
        assert clock.now == 102.0


async def test_the_budget_keeps_the_documented_rates_and_a_reserve_for_final_replies() -> None:
    limits, clock = limiter(TELEGRAM_LIMITS)
    for _ in range(2):
        async with limits.slot("chat:1", counted=True, urgent=False) as go:
            assert go
    async with limits.slot("chat:1", counted=True, urgent=False) as go:
        assert not go  # the third of three per three seconds is kept for the final reply
    async with limits.slot("chat:1", counted=True) as go:
        assert go and clock.slept == []
    async with limits.slot("chat:1", counted=True):
        assert clock.now == 103.0  # a fourth within three seconds waits
    async with limits.slot("chat:1") as go:
        assert go and clock.now == 103.0  # calls that do not count are not held


async def test_a_group_gets_at_most_twenty_counted_calls_a_minute() -> None:
    limits, clock = limiter(TELEGRAM_LIMITS)
    for _ in range(20):
        async with limits.slot("chat:-5", group=True, counted=True):
            pass
    async with limits.slot("chat:-5", group=True, counted=True):
        assert clock.now >= 160.0


async def test_a_draft_gives_way_to_a_final_reply_waiting_for_the_same_chat() -> None:
    limits, _ = limiter()
    release = asyncio.Event()
    order: list[str] = []

    async def call(name: str, urgent: bool) -> None:
        async with limits.slot("chat:1", urgent=urgent) as go:
            if go:
                order.append(name)
                if name == "first":
                    await release.wait()

    first = asyncio.create_task(call("first", True))
    await asyncio.sleep(0)
    draft = asyncio.create_task(call("draft", False))
    final = asyncio.create_task(call("final", True))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, draft, final)
    assert order == ["first", "final"]  # the draft was skipped, not queued ahead
