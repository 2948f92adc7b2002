"""Budgets: what reserving each model call costs a turn, and how far limits hold at scale.

.venv/bin/python bench/bench_budgets.py [--postgres] [--users N]

Part 1, per-turn overhead: 300 turns, one at a time, over 20 direct chats, with the
instant scripted model, without budgets and with a user daily token limit (each
model call then reserves and settles in the database); p50/p99 from the channel
handing the message over to the reply, the median of 3 rounds after a warm-up round.

Part 2, overshoot: ``--users`` users (default 20) each mention the bot in 12 groups
at once against a 10,000-token daily budget, with a model that takes 50 ms and uses
all of ``max_tokens`` (2,000); reports, over the users, the largest spend and the
largest one-call reservation (the bound is budget + one reservation).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    InstantProvider,
    ms,
    percentile,
    print_table,
    quiet_logging,
    roost_app,
)
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText, Usage
from bot.contracts.messages import OutboundMessage
from bot.storage.usage import day_of
from bot.testing.app import ChatChannel

BUDGET = 10_000
ROUNDS = 3


class Timed(ChatChannel):
    """A chat whose every send resolves the future of the turn waiting for it."""

    def __init__(self) -> None:
        super().__init__("bench")
        self.waiting: dict[str, asyncio.Future[None]] = {}

    async def send(self, message: OutboundMessage) -> None:
        await super().send(message)
        future = self.waiting.pop(message.chat_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def turn(self, text: str, sender: str) -> float:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[sender] = future
        began = time.perf_counter()
        await self.say(text, sender=sender)
        await future
        return time.perf_counter() - began


async def per_turn(database_url: str, limited: bool) -> list[float]:
    budgets: dict[str, Any] = {"user_daily_tokens": 10**9} if limited else {}
    settings: dict[str, Any] = {"budgets": budgets, "memory_flush": False}
    if database_url:
        settings["database_url"] = database_url
    async with roost_app(InstantProvider([{"reply": "ok"}]), **settings) as app:
        chat = Timed()
        await chat.attach(app)
        if app.dispatcher.replicas is not None:
            await app.recover()
        for k in range(20):  # first contact apart
            await chat.turn("hello", f"u{k}")
        return [await chat.turn(f"turn {i}", f"u{i % 20}") for i in range(300)]


class Slow:
    """50 ms per call, all of ``max_tokens`` used."""

    name = "slow"

    def __init__(self) -> None:
        self.worst = 0

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        await asyncio.sleep(0.05)
        chars = len(request.system) + len(request.note) + sum(
            len(m.content) for m in request.messages) + sum(
            len(t.name) + len(t.description) + len(str(t.input_schema)) for t in request.tools)
        usage = Usage(chars // 4 + 1, request.max_tokens)
        self.worst = max(self.worst, usage.input_tokens + request.max_tokens)
        return LLMResponse("ok", (), usage, "end_turn")

    async def aclose(self) -> None:
        return None


async def overshoot(database_url: str, users: int) -> tuple[int, int, int, int]:
    """(largest spend, largest call, answered, refused) of ``users`` x 12 runs at once."""
    settings: dict[str, Any] = {"budgets": {"user_daily_tokens": BUDGET}, "max_tokens": 2_000,
                                "memory_flush": False}
    if database_url:
        settings["database_url"] = database_url
    provider = Slow()
    async with roost_app(provider, **settings) as app:  # type: ignore[arg-type]
        chat = ChatChannel("bench")
        await chat.attach(app)
        if app.dispatcher.replicas is not None:
            await app.recover()
        await asyncio.gather(*(chat.say(f"q{g}", sender=f"u{u}", group=f"g{u}-{g}")
                               for u in range(users) for g in range(12)))
        while len(chat.sent) < users * 12:
            chat.arrived.clear()
            await asyncio.wait_for(chat.arrived.wait(), 120)
        await app.dispatcher.drain()
        assert app.services.usage is not None
        await app.services.usage.flush()
        day = day_of(app.services.usage.clock())
        spent = [await app.services.usage.spent("user", f"bench:u{u}", day)
                 for u in range(users)]
        answered = sum(r == "ok" for r in chat.replies)
        return max(spent), provider.worst, answered, users * 12 - answered


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--postgres", action="store_true", help="also on a local PostgreSQL")
    parser.add_argument("--users", type=int, default=20)
    args = parser.parse_args()
    quiet_logging("roost.engine.runloop", "roost.engine.budgets", "roost.dispatch.dispatcher")
    backends = [("sqlite", "")]
    cluster = None
    if args.postgres:
        from bot.testing.postgres import PostgresCluster

        cluster = PostgresCluster(in_ram=False).start()
    try:
        if cluster is not None:
            backends.append(("postgresql", ""))
        rows = []
        for name, _ in backends:
            rounds: dict[bool, list[list[float]]] = {False: [], True: []}
            for _round in range(ROUNDS + 1):  # the first round warms up, alternating
                for limited in (False, True):
                    url = await cluster.create_database() \
                        if name == "postgresql" and cluster else ""
                    rounds[limited].append(await per_turn(url, limited))
            for limited in (False, True):
                kept = rounds[limited][1:]
                rows.append([name, "limit set" if limited else "no budgets",
                             ms(statistics.median(percentile(t, 50) for t in kept)),
                             ms(statistics.median(percentile(t, 99) for t in kept))])
        print(f"Per-turn overhead, 300 turns (instant model), median of {ROUNDS} rounds")
        print_table(["backend", "budgets", "p50", "p99"], rows)
        rows = []
        for name, _ in backends:
            url = await cluster.create_database() if name == "postgresql" and cluster else ""
            spent, worst, answered, refused = await overshoot(url, args.users)
            rows.append([name, f"{args.users} x 12", f"{spent:,}", f"{BUDGET + worst:,}",
                         str(answered), str(refused)])
        print(f"\nOvershoot against {BUDGET:,} daily tokens per user")
        print_table(["backend", "runs at once", "largest spend", "bound", "answered",
                     "refused"], rows)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
