"""Fair under saturation: when Telegram's bot-wide 30 messages/s is the bottleneck,
replies leave in the order their chats became ready (round-robin across chats, each
chat's in order), and typing indicators and drafts give way first.

The limiter runs on virtual time that moves only when every task waits; timers due
at the same moment fire in a seeded random order, as the event loop's timer heap
does not keep them in order either.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable

from channels.delivery import TELEGRAM_LIMITS, RateLimiter

CHATS = 1000
ROUNDS = 3


class VirtualTime:
    """A clock and a sleep: sleeps end in deadline order (ties at random), and time
    jumps to the next deadline once no task can run."""

    def __init__(self, seed: int = 1) -> None:
        self.now = 100.0
        self._timers: list[tuple[float, float, int, asyncio.Future[None]]] = []
        self._rng = random.Random(seed)
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), self._rng.random(),
                                      next(self._order), done))
        await done

    async def run_until(self, finished: Callable[[], bool]) -> None:
        while not finished():
            for _ in range(50):  # let every task that can run get to its next wait
                await asyncio.sleep(0)
            if self._timers and not finished():
                when, _, _, done = heapq.heappop(self._timers)
                self.now = max(self.now, when)
                if not done.cancelled():
                    done.set_result(None)


async def test_a_thousand_chats_replies_leave_round_robin_and_typing_gives_way() -> None:
    clock = VirtualTime()
    limiter = RateLimiter(TELEGRAM_LIMITS, clock=clock, sleep=clock.sleep)
    readied: list[int] = []
    granted: list[int] = []
    waits: list[float] = []
    typing: list[bool] = []
    drafts: list[bool] = []

    async def chat(number: int) -> None:
        # A closed loop: each reply is ready a second (the person, the model) after the
        # one before it left.
        for _ in range(ROUNDS):
            await clock.sleep(1.0)
            ready = clock.now
            readied.append(number)
            async with limiter.slot(f"chat:{number}", counted=True) as go:
                assert go
                granted.append(number)
                waits.append(clock.now - ready)
            if number % 100 == 0 and limiter.queued:
                # Someone else's reply is in line: "typing…" and a draft give way.
                async with limiter.slot(f"chat:{number}", urgent=False) as go:
                    typing.append(go)
                async with limiter.slot(f"chat:{number}", counted=True, urgent=False) as go:
                    drafts.append(go)

    tasks = [asyncio.ensure_future(chat(n)) for n in range(CHATS)]
    await clock.run_until(lambda: all(t.done() for t in tasks))
    await asyncio.gather(*tasks)
    assert granted == readied  # in the order they became ready: round-robin
    # 30 a second: the whole round of 1,000 in ~33 s, nobody waiting much longer.
    assert max(waits) <= CHATS / 30 + 1
    assert clock.now - 100.0 <= CHATS * ROUNDS / 30 + 2
    assert typing and not any(typing)
    assert drafts and not any(drafts)
