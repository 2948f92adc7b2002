"""Driving `roost run` on Telegram from outside: tagged turns timed at both fakes.

Every message the bench pushes carries a tag (``Q<n>Z``). The fake Messages
API (:class:`TimedAnthropic`) answers ``ok Q<n>Z`` at once, streamed, and notes
when the request arrived and when the last byte of its answer was written; the
fake Bot API notes when the first ``sendMessage``/``editMessageText`` carrying
the answer arrived. All times are ``time.perf_counter()`` in the bench process,
so ingress (push -> LLM request), LLM time and egress (LLM done -> answer
shown) of one turn add up to its whole latency.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bench._common import InstantAnthropic
from bot.testing._server import DropConnection
from bot.testing.anthropic import Reply
from bot.testing.telegram import Call, FakeTelegram, user

_TAG = re.compile(r"Q(\d+)Z")
SHOWN = frozenset({"sendMessage", "editMessageText"})
"""The methods that put the answer's text in front of the user."""


@dataclass(slots=True)
class Turn:
    """One pushed message and the moments its answer passed through the fakes."""

    chat: int
    pushed: float
    arrived: float = 0.0
    """The LLM request reached the fake Messages API."""
    done: float = 0.0
    """The fake wrote the answer's last byte."""
    shown: float = 0.0
    """The first Bot API call carrying the answer reached the fake Telegram."""

    @property
    def total(self) -> float:
        """Push -> answer shown."""
        return self.shown - self.pushed

    @property
    def llm(self) -> float:
        """The LLM's own time (request arrived -> answer written)."""
        return self.done - self.arrived

    @property
    def ingress(self) -> float:
        return self.arrived - self.pushed

    @property
    def egress(self) -> float:
        return self.shown - self.done


class TimedAnthropic(InstantAnthropic):
    """Answers ``ok <tag>`` at once (streamed) and times each tagged request.

    The tag and arrival time of the request a handler serves ride in a context
    variable from reading the request to writing the answer's last byte.
    """

    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        arrived = time.perf_counter()
        body: dict[str, Any] = await request.json()
        messages = body.get("messages") or [{}]
        match = _TAG.findall(str(messages[-1].get("content", "")))
        _serving.set((int(match[-1]) if match else None, arrived))
        return body

    def _next_item(self) -> Reply | DropConnection | None:
        tag, _ = _serving.get()
        return Reply(blocks=(f"ok Q{tag}Z" if tag is not None else "ok",), ping=False)

    async def _send(self, response: web.StreamResponse, frames: Iterable[bytes], delay: float,
                    *, trailer: bytes = b"") -> None:
        await super()._send(response, frames, delay, trailer=trailer)
        tag, arrived = _serving.get()
        if tag is not None:
            self.tracker.llm_done(tag, arrived, time.perf_counter())


_serving: contextvars.ContextVar[tuple[int | None, float]] = \
    contextvars.ContextVar("serving", default=(None, 0.0))


class Tracker:
    """Pushes tagged messages into the fake Telegram and collects their :class:`Turn`\\ s."""

    def __init__(self, telegram: FakeTelegram) -> None:
        self.telegram = telegram
        self.turns: dict[int, Turn] = {}
        self.calls: Counter[str] = Counter()
        """Bot API calls by method (``getUpdates`` aside)."""
        self.refused: Counter[str] = Counter()
        """Calls the fake answered with an error, by method and description."""
        self.first_poll = 0.0
        self._poll_after = 0.0
        self.looping: set[int] = set()
        self.completed = 0
        self._tags = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Turn]] = {}
        self._open: dict[int, int] = {}
        self._quiet = asyncio.Event()
        telegram.record = False  # thousands of calls: keep only the counts
        telegram.on_call = self._on_call
        self._wrap_record()

    def _wrap_record(self) -> None:
        # Refusals are only known once the fake answered: see each finished call.
        original = self.telegram.record_call

        async def record(call: Call, *, arrived: bool = False) -> None:
            if not arrived and call.status not in (0, 200):
                self.refused[f"{call.method}: {call.error}"] += 1
            await original(call, arrived=arrived)

        self.telegram.record_call = record  # type: ignore[method-assign]

    def push(self, chat: int) -> int:
        """Push one message from ``chat``'s user; returns its tag."""
        tag = next(self._tags)
        self.turns[tag] = Turn(chat, time.perf_counter())
        self._open[tag] = chat
        self._quiet.clear()
        self.telegram.private_message(f"hello Q{tag}Z", sender=user(chat, f"U{chat}"))
        return tag

    def llm_done(self, tag: int, arrived: float, done: float) -> None:
        turn = self.turns.get(tag)
        if turn is not None and not turn.arrived:
            turn.arrived, turn.done = arrived, done

    def _on_call(self, call: Call) -> None:
        if call.method == "getUpdates":
            if not self.first_poll and call.at >= self._poll_after:
                self.first_poll = call.at
            return
        self.calls[call.method] += 1
        if call.method not in SHOWN:
            return
        match = _TAG.search(str(call.params.get("text", "")))
        turn = self.turns.get(int(match.group(1))) if match else None
        if turn is None or turn.shown:
            return
        turn.shown = call.at
        tag = int(match.group(1)) if match else 0
        chat = self._open.pop(tag, None)
        self.completed += 1
        waiter = self._waiters.pop(tag, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(turn)
        if chat is not None and chat in self.looping:
            self.push(chat)
        elif not self._open:
            self._quiet.set()

    def reset_counts(self) -> None:
        self.calls.clear()
        self.refused.clear()

    async def one(self, chat: int, limit: float = 15.0) -> Turn:
        """One message from ``chat``; returns its turn once the answer is shown."""
        tag = self.push(chat)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[tag] = waiter
        try:
            return await asyncio.wait_for(waiter, limit)
        except TimeoutError:
            raise TimeoutError(f"no answer to Q{tag}Z in {limit:g} s: "
                               f"{self.turns[tag]}") from None

    async def shown(self, tag: int, limit: float = 30.0) -> Turn:
        """The turn of ``tag`` (pushed earlier) once its answer is shown."""
        turn = self.turns[tag]
        if turn.shown:
            return turn
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[tag] = waiter
        return await asyncio.wait_for(waiter, limit)

    async def settle(self, limit: float = 30.0) -> None:
        """Until every pushed message is answered."""
        if self._open:
            await asyncio.wait_for(self._quiet.wait(), limit)

    async def closed_loop(self, chats: Sequence[int], seconds: float, ramp: float,
                          cpu: Any) -> tuple[float, float, list[Turn]]:
        """Replies/s and CPU seconds per reply over ``seconds`` after ``ramp``.

        ``cpu()`` reads the bot's CPU seconds. Each chat sends its next message
        as soon as its answer is shown. Returns the rate, CPU per reply and the
        turns answered in the window.
        """
        self.looping = set(chats)
        for chat in chats:
            self.push(chat)
        await asyncio.sleep(ramp)
        done, cpu0, began = self.completed, cpu(), time.perf_counter()
        await asyncio.sleep(seconds)
        count, cpu1, elapsed = self.completed - done, cpu(), time.perf_counter() - began
        window = [t for t in self.turns.values() if began <= t.shown]
        self.looping = set()
        await self.settle()
        return count / elapsed, (cpu1 - cpu0) / max(count, 1), window

    def expect_launch(self) -> None:
        """A process is about to start: :meth:`wait_first_poll` waits for its first poll."""
        self.first_poll, self._poll_after = 0.0, time.perf_counter()

    async def wait_first_poll(self, since: float, limit: float = 30.0) -> float:
        """Seconds from ``since`` to the first ``getUpdates`` after :meth:`expect_launch`."""
        deadline = time.perf_counter() + limit
        while not self.first_poll:
            if time.perf_counter() > deadline:
                raise TimeoutError("no getUpdates")
            await asyncio.sleep(0.002)
        return self.first_poll - since
