"""Telegram channel benchmark: `roost run` end to end against a fake Bot API.

Run with ``.venv/bin/python bench/bench_telegram.py`` (about 45 s on 2 cores).

``roost run`` runs as a subprocess, configured as in production: the Telegram
channel on long polling (aiogram) against :class:`bot.testing.telegram.FakeTelegram`,
and the Anthropic provider (the real ``anthropic`` SDK) against a fake Messages
API that answers every request at once. Both fakes run in this process, on
127.0.0.1. Streaming is off, so a reply is one ``sendMessage``.

Latency runs from pushing an update to the fake (the moment it is available to
the bot's pending ``getUpdates``) to the reply's ``sendMessage`` reaching the
fake; both timestamps are taken in this process. Throughput is closed-loop:
each chat sends its next message as soon as its reply arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    InstantAnthropic,
    Row,
    ms,
    percentile,
    print_rows,
    progress,
    roost_process,
    telegram_env,
    verdict,
)
from bot.testing.telegram import Call, FakeTelegram, user  # noqa: E402

TARGET_P50_MS = 10.0
TARGET_RPS_100 = 200.0
TARGET_RSS_MB = 80.0
LATENCY_TURNS = 300
WARMUP_TURNS = 30
THROUGHPUT_CHATS = (1, 20, 100)
THROUGHPUT_SECONDS = 4.0
RAMP_SECONDS = 0.5
STARTUP_RUNS = 3
FIRST_CHAT = 10_000


# -- driving chats ----------------------------------------------------------------


class Driver:
    """Pushes messages into the fake and times the replies' ``sendMessage``."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake
        self.sent_at: dict[int, float] = {}
        self.latencies: list[float] = []
        self.completed = 0
        self.looping: set[int] = set()
        self.replied = asyncio.Event()
        self.idle = asyncio.Event()
        fake.record = False  # thousands of calls: keep only what the bench needs
        fake.on_call = self._on_call

    def push(self, chat: int) -> None:
        self.sent_at[chat] = time.perf_counter()
        self.fake.private_message("hello", sender=user(chat, f"U{chat}"))

    def _on_call(self, call: Call) -> None:
        if call.method != "sendMessage":
            return
        chat = call.params.get("chat_id")
        sent = self.sent_at.pop(chat, None) if isinstance(chat, int) else None
        if sent is None:
            return
        self.latencies.append(call.at - sent)
        self.completed += 1
        self.replied.set()
        if chat in self.looping:
            self.push(chat)
        elif not self.sent_at:
            self.idle.set()

    async def one(self, chat: int) -> float:
        """One message, one reply; returns the latency."""
        self.replied.clear()
        self.push(chat)
        await asyncio.wait_for(self.replied.wait(), 10)
        return self.latencies[-1]

    async def closed_loop(self, chats: Sequence[int], seconds: float) -> tuple[float, list[float]]:
        """Replies/s over ``seconds`` (after a ramp), and the latencies in that window."""
        self.looping = set(chats)
        for chat in chats:
            self.push(chat)
        await asyncio.sleep(RAMP_SECONDS)
        done, mark = self.completed, len(self.latencies)
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - began
        rate = (self.completed - done) / elapsed
        window = self.latencies[mark:]
        # Let the replies still in flight arrive before the next phase.
        self.idle.clear()
        self.looping = set()
        await asyncio.wait_for(self.idle.wait(), 10)
        return rate, window


# -- report --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fakes() -> AsyncIterator[tuple[FakeTelegram, InstantAnthropic]]:
    async with FakeTelegram() as telegram, InstantAnthropic() as anthropic:
        yield telegram, anthropic


async def bench_load() -> list[Row]:
    """Latency and throughput with the real Anthropic SDK behind the core."""
    rows: list[Row] = []
    async with fakes() as (telegram, anthropic):
        driver = Driver(telegram)
        with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp:
            env = telegram_env(Path(tmp) / "data", telegram, anthropic)
            with roost_process(env, Path(tmp)) as roost:
                await asyncio.to_thread(roost.wait_ready)
                progress("roost run is up; warming up")
                for _ in range(WARMUP_TURNS):
                    await driver.one(FIRST_CHAT)
                # First contact (a new session and workspace) for every chat used later.
                first = [await driver.one(FIRST_CHAT + i) for i in range(1, max(THROUGHPUT_CHATS))]

                progress(f"latency: {LATENCY_TURNS} sequential turns")
                latencies = [await driver.one(FIRST_CHAT) for _ in range(LATENCY_TURNS)]
                p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
                rows.append(Row("latency p50 (update pushed -> sendMessage)", ms(p50),
                                f"<= {TARGET_P50_MS:g} ms", verdict(p50 * 1000 <= TARGET_P50_MS)))
                rows.append(Row("latency p99", ms(p99)))
                rows.append(Row("latency p50, first message of a chat",
                                ms(percentile(first, 50))))

                for count in THROUGHPUT_CHATS:
                    progress(f"throughput: {count} chat(s) for {THROUGHPUT_SECONDS:g} s")
                    chats = [FIRST_CHAT + i for i in range(count)]
                    rate, window = await driver.closed_loop(chats, THROUGHPUT_SECONDS)
                    target = f">= {TARGET_RPS_100:g}/s" if count == 100 else ""
                    ok = verdict(rate >= TARGET_RPS_100) if count == 100 else ""
                    rows.append(Row(f"replies/s, {count} chat(s)", f"{rate:,.0f}/s", target, ok))
                    rows.append(Row(f"  latency p50/p99 at {count} chat(s)",
                                    f"{ms(percentile(window, 50))} / "
                                    f"{ms(percentile(window, 99))}"))
                rows.append(Row("RSS of roost run after the load", f"{roost.rss_mb():.1f} MB"))
                code, took = roost.stop()
                rows.append(Row("SIGTERM after the load -> exit", "exit 0" if code == 0 else
                                f"exit {code}", "exit 0 < 10 s",
                                verdict(code == 0 and took is not None)))
    return rows


async def bench_channel_only() -> list[Row]:
    """Throughput at 100 chats with the scripted provider: the channel and core alone.

    Not a target; it shows how much of the time above the Anthropic SDK takes.
    """
    count = max(THROUGHPUT_CHATS)
    async with fakes() as (telegram, _):
        driver = Driver(telegram)
        with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp, \
                roost_process(telegram_env(Path(tmp) / "data", telegram, None), Path(tmp)) as roost:
            await asyncio.to_thread(roost.wait_ready)
            progress(f"throughput without the SDK: {count} chats")
            for i in range(count):
                await driver.one(FIRST_CHAT + i)
            chats = [FIRST_CHAT + i for i in range(count)]
            rate, window = await driver.closed_loop(chats, THROUGHPUT_SECONDS)
            roost.stop()
    return [Row(f"replies/s, {count} chats, scripted provider (no SDK)", f"{rate:,.0f}/s"),
            Row(f"  latency p50/p99 at {count} chats, scripted",
                f"{ms(percentile(window, 50))} / {ms(percentile(window, 99))}")]


async def bench_startup(with_anthropic: bool) -> tuple[list[float], list[float], list[int | None]]:
    ready: list[float] = []
    rss: list[float] = []
    codes: list[int | None] = []
    async with fakes() as (telegram, anthropic):
        for _ in range(STARTUP_RUNS):
            with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp:
                env = telegram_env(Path(tmp) / "data", telegram,
                                   anthropic if with_anthropic else None)
                with roost_process(env, Path(tmp)) as roost:
                    ready.append(await asyncio.to_thread(roost.wait_ready))
                    await asyncio.sleep(0.5)  # settle into idle (a pending long poll)
                    rss.append(roost.rss_mb())
                    code, _ = await asyncio.to_thread(roost.stop)
                    codes.append(code)
    return ready, rss, codes


async def run_all() -> list[Row]:
    began = time.perf_counter()
    rows = await bench_load()
    rows += await bench_channel_only()
    for with_anthropic, label in ((False, "scripted provider"), (True, "anthropic provider")):
        progress(f"startup and idle RSS, {label}: {STARTUP_RUNS} runs")
        ready, rss, codes = await bench_startup(with_anthropic)
        rss_mb = statistics.median(rss)
        rows.append(Row(f"roost run -> 'roost ready', {label}",
                        f"{statistics.median(ready):.2f} s"))
        target = f"<= {TARGET_RSS_MB:g} MB" if not with_anthropic else ""
        rows.append(Row(f"idle RSS, {label}", f"{rss_mb:.1f} MB", target,
                        verdict(rss_mb <= TARGET_RSS_MB) if not with_anthropic else ""))
        rows.append(Row(f"clean stop (SIGTERM -> exit 0), {label}",
                        f"{sum(c == 0 for c in codes)}/{len(codes)}", "all",
                        verdict(all(c == 0 for c in codes))))
    progress(f"done in {time.perf_counter() - began:.1f} s")
    return rows


def main() -> None:
    rows = asyncio.run(run_all())
    print()
    print(f"Roost Telegram channel benchmark ({os.cpu_count()} cores, "
          f"python {sys.version.split()[0]})")
    print_rows(rows)


if __name__ == "__main__":
    main()
