"""Telegram benchmark: `roost run` as a user runs it, measured from outside.

Run with ``.venv/bin/python bench/bench_telegram.py`` (3-5 minutes on 2 cores;
``--runs 1`` for a quick look). See bench/README.md, "Telegram benchmark".

``roost run`` is a separate process with Roost's default settings (streaming
on), the real aiogram and anthropic SDKs, against the fake Bot API
(:class:`bot.testing.telegram.FakeTelegram`, long polling woken by a push) and
a fake Messages API that streams its answer at once (:mod:`bench._tg_driver`).
CPU and RSS of that process are read from ``/proc``. Each figure is the median
of ``--runs`` runs, each in fresh processes on fresh data dirs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    RoostProcess,
    percentile,
    print_table,
    progress,
    roost_process,
    telegram_env,
    verdict,
)
from bench._tg_driver import TimedAnthropic, Tracker, Turn  # noqa: E402
from bench.tg_memory import run_memory  # noqa: E402
from bot.testing.telegram import FakeTelegram  # noqa: E402

WARMUP_TURNS = 30
LATENCY_TURNS = 150
THROUGHPUT_CHATS = (1, 20, 100)
THROUGHPUT_SECONDS = 3.0
RAMP_SECONDS = 0.5
NEW_SESSIONS = 1000
NEW_SESSION_CONCURRENCY = 50
IDLE_SETTLE = 0.5
"""Seconds after the provider's SDK is loaded (its log line) before idle RSS is read and
the cold message pushed."""
FIRST_CHAT = 10_000


@dataclass(slots=True)
class Figure:
    """One line of the table: the value of each run, how to print it, the target."""

    label: str
    unit: str
    target: float | None = None
    higher_is_better: bool = False
    values: list[float] = field(default_factory=list)
    note: str = ""

    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def cell(self, value: float) -> str:
        return f"{value:,.2f}" if self.unit in ("ms", "s", "MiB") else f"{value:,.1f}"

    def row(self) -> tuple[str, str, str, str, str]:
        if not self.values:
            return self.label, "-", "", "", "not measured"
        med = self.median()
        target = "" if self.target is None else \
            f"{'>=' if self.higher_is_better else '<='} {self.target:g} {self.unit}"
        ok = "" if self.target is None else verdict(
            med >= self.target if self.higher_is_better else med <= self.target)
        runs = " / ".join(self.cell(v) for v in self.values)
        return self.label, f"{self.cell(med)} {self.unit}", target, ok, \
            f"runs: {runs}" + (f"; {self.note}" if self.note else "")


class Table:
    """The figures of the issue's table, in its order."""

    def __init__(self) -> None:
        self.figures = {
            "p50": Figure("push -> first text with the answer, minus LLM, p50", "ms", 4),
            "p99": Figure("push -> first text with the answer, minus LLM, p99", "ms", 10),
            "ingress": Figure("  ingress: push -> LLM request arrives, p50", "ms", 2),
            "egress": Figure("  egress: LLM done -> answer shown, p50", "ms", 1.5),
            "rps1": Figure("replies/s, closed loop, 1 chat", "/s", 150, True),
            "rps20": Figure("replies/s, closed loop, 20 chats", "/s", 300, True),
            "rps100": Figure("replies/s, closed loop, 100 chats", "/s", 300, True),
            "cpu": Figure("CPU per reply (utime+stime, 100 chats)", "ms", 3),
            "calls": Figure("Bot API calls per short reply", "calls", 2),
            "cold": Figure("cold first reply of a process, minus LLM", "ms", 50),
            "restart": Figure("restart -> answer to a DM that waited", "s", 1.0),
            "start": Figure("start -> first getUpdates", "s", 0.7),
            "term_idle": Figure("SIGTERM -> exit, idle", "s", 0.3),
            "term_load": Figure("SIGTERM -> exit, after load", "s", 0.3),
            "rss": Figure("idle RSS after start (Telegram + Anthropic)", "MiB", 80),
            "session": Figure("RSS growth per new chat session", "KiB", 20),
        }
        self.methods: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.turns = 0

    def add(self, key: str, value: float) -> None:
        self.figures[key].values.append(value)

    def print(self) -> None:
        per_reply = ", ".join(f"{m} {n / max(self.turns, 1):.2f}"
                              for m, n in self.methods.most_common())
        self.figures["calls"].note = per_reply + (
            f"; refused: {dict(self.refused)}" if self.refused else "; none refused")
        rows = [fig.row() for fig in self.figures.values()]
        print_table(("figure", "median", "target", "result"), [r[:4] for r in rows],
                    details=[[r[4]] for r in rows])


# -- running roost --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fakes() -> AsyncIterator[tuple[FakeTelegram, TimedAnthropic, Tracker]]:
    async with FakeTelegram() as telegram:
        tracker = Tracker(telegram)
        async with TimedAnthropic(tracker) as anthropic:
            yield telegram, anthropic, tracker


async def launch(stack: contextlib.ExitStack, data: Path, telegram: FakeTelegram,
                 anthropic: TimedAnthropic, tracker: Tracker) -> tuple[RoostProcess, float]:
    """Start ``roost run`` on ``data``; returns it and seconds to its first ``getUpdates``."""
    tracker.expect_launch()
    roost = stack.enter_context(roost_process(
        telegram_env(data, telegram, anthropic, streaming=None), data.parent))
    first_poll = await tracker.wait_first_poll(roost.started)
    await asyncio.to_thread(roost.wait_ready)
    return roost, first_poll


async def stop(roost: RoostProcess) -> float:
    code, took = await asyncio.to_thread(roost.stop)
    if code != 0 or took is None:
        raise RuntimeError(f"roost run did not stop cleanly (exit {code}):\n"
                           + roost.stderr_tail(2000))
    return took


def minus_llm(turns: Sequence[Turn]) -> list[float]:
    return [t.total - t.llm for t in turns]


async def run_start(table: Table) -> None:
    """Start, idle RSS, cold first reply, SIGTERM when idle, restart with a DM waiting."""
    async with fakes() as (telegram, anthropic, tracker):
        with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp, \
                contextlib.ExitStack() as stack:
            data = Path(tmp) / "data"
            roost, first_poll = await launch(stack, data, telegram, anthropic, tracker)
            table.add("start", first_poll)
            # Idle: the SDK loaded in the background (the log says when), then a moment.
            await asyncio.to_thread(roost.wait_line, "LLM provider anthropic loaded")
            await asyncio.sleep(IDLE_SETTLE)
            table.add("rss", roost.rss_mb())
            cold = await tracker.one(FIRST_CHAT)
            table.add("cold", (cold.total - cold.llm) * 1000)
            await asyncio.sleep(0.5)
            table.add("term_idle", await stop(roost))

            # The user writes while the bot is down; the next process answers.
            tag = tracker.push(FIRST_CHAT)
            with contextlib.ExitStack() as again:
                tracker.expect_launch()
                roost = again.enter_context(roost_process(
                    telegram_env(data, telegram, anthropic, streaming=None), Path(tmp)))
                answered = await tracker.shown(tag)
                table.add("restart", answered.shown - roost.started)
                await stop(roost)


async def run_load(table: Table) -> None:
    """Latency, calls per reply, throughput and CPU, session growth, SIGTERM after load."""
    async with fakes() as (telegram, anthropic, tracker):
        with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp, \
                contextlib.ExitStack() as stack:
            roost, _ = await launch(stack, Path(tmp) / "data", telegram, anthropic, tracker)
            for _ in range(WARMUP_TURNS):
                await tracker.one(FIRST_CHAT)
            await asyncio.sleep(1.2)  # let the warm-up's trailing calls land
            tracker.reset_counts()
            progress(f"latency: {LATENCY_TURNS} sequential turns")
            turns = [await tracker.one(FIRST_CHAT) for _ in range(LATENCY_TURNS)]
            await asyncio.sleep(1.2)
            table.methods.update(tracker.calls)
            table.refused.update(tracker.refused)
            table.turns += LATENCY_TURNS
            table.add("calls", sum(tracker.calls.values()) / LATENCY_TURNS)
            lat = minus_llm(turns)
            table.add("p50", percentile(lat, 50) * 1000)
            table.add("p99", percentile(lat, 99) * 1000)
            table.add("ingress", percentile([t.ingress for t in turns], 50) * 1000)
            table.add("egress", percentile([t.egress for t in turns], 50) * 1000)

            # First contact of every chat the loops use, outside the measured windows.
            await parallel(tracker, range(FIRST_CHAT + 1, FIRST_CHAT + max(THROUGHPUT_CHATS)), 20)
            for count in THROUGHPUT_CHATS:
                progress(f"closed loop: {count} chat(s) for {THROUGHPUT_SECONDS:g} s")
                chats = [FIRST_CHAT + i for i in range(count)]
                rate, cpu, _ = await tracker.closed_loop(chats, THROUGHPUT_SECONDS, RAMP_SECONDS,
                                                         roost.cpu_seconds)
                table.add(f"rps{count}", rate)
                if count == max(THROUGHPUT_CHATS):
                    table.add("cpu", cpu * 1000)

            progress(f"{NEW_SESSIONS} new chat sessions")
            await asyncio.sleep(0.5)
            before = roost.rss()
            base = FIRST_CHAT + 100_000
            await parallel(tracker, range(base, base + NEW_SESSIONS), NEW_SESSION_CONCURRENCY)
            await asyncio.sleep(0.5)
            table.add("session", (roost.rss() - before) / NEW_SESSIONS / 1024)
            table.add("term_load", await stop(roost))


SATURATION_CHATS = 1000
SATURATION_RAMP = 45.0
"""Seconds of the closed loops before answers are counted (every chat's first contact)."""
SATURATION_WITHIN = 120.0
"""Every message answered within this many seconds (the target)."""


async def run_saturation(seconds: float) -> None:
    """1,000 chats in closed loops against Telegram's 30 messages/s (the proactive budget
    on, as by default): answer latency p50/p99 and messages unanswered after 120 s."""
    async with fakes() as (telegram, anthropic, tracker):
        with tempfile.TemporaryDirectory(prefix="roost-bench-tg-") as tmp, \
                contextlib.ExitStack() as stack:
            env = telegram_env(Path(tmp) / "data", telegram, anthropic, streaming=None)
            env["ROOST_TELEGRAM_RATE_LIMITS"] = "true"
            tracker.expect_launch()
            roost = stack.enter_context(roost_process(env, Path(tmp)))
            await tracker.wait_first_poll(roost.started)
            await asyncio.to_thread(roost.wait_ready)
            chats = [FIRST_CHAT + i for i in range(SATURATION_CHATS)]
            progress(f"saturation: {len(chats)} chats in closed loops for "
                     f"{SATURATION_RAMP + seconds:g} s, answers counted after "
                     f"{SATURATION_RAMP:g} s")
            tracker.looping = set(chats)
            for chat in chats:
                tracker.push(chat)
            await asyncio.sleep(SATURATION_RAMP)
            began, cpu0 = time.perf_counter(), roost.cpu_seconds()
            await asyncio.sleep(seconds)
            ended, cpu1 = time.perf_counter(), roost.cpu_seconds()
            tracker.looping = set()
            with contextlib.suppress(TimeoutError):
                await tracker.settle(SATURATION_WITHIN)
            counted = [t for t in tracker.turns.values() if began <= t.pushed < ended]
            answered = [t.total for t in counted if t.shown]
            late = [t for t in counted if not t.shown or t.total > SATURATION_WITHIN]
            rate = sum(1 for t in tracker.turns.values() if began <= t.shown < ended) \
                / (ended - began)
            await stop(roost)
    p50, p99 = percentile(answered, 50), percentile(answered, 99)
    print(f"\nsaturation: {len(chats)} chats, closed loops, Telegram's limits on "
          f"({os.cpu_count()} cores, {seconds:g} s counted after a {SATURATION_RAMP:g} s ramp)")
    print(f"  messages pushed in the window: {len(counted)}; answers/s: {rate:.1f}; "
          f"CPU of roost run: {(cpu1 - cpu0) / (ended - began):.0%} of a core")
    print(f"  answer latency p50 {p50:.1f} s, p99 {p99:.1f} s (p99/p50 {p99 / p50:.2f}, "
          f"target <= 2), max {max(answered):.1f} s")
    print(f"  not answered within {SATURATION_WITHIN:g} s: {len(late)} (target 0)")


async def parallel(tracker: Tracker, chats: range, width: int) -> None:
    """One message from each of ``chats``, ``width`` at a time."""
    pending = iter(chats)

    async def worker() -> None:
        for chat in pending:
            await tracker.one(chat)

    await asyncio.gather(*(worker() for _ in range(width)))


async def run_all(runs: int, parts: Sequence[Callable[[Table], object]]) -> Table:
    table = Table()
    for n in range(runs):
        for part in parts:
            progress(f"run {n + 1}/{runs}: {part.__name__}")  # type: ignore[attr-defined]
            await part(table)  # type: ignore[misc]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--only", choices=("start", "load", "memory", "saturation"),
                        help="one part: the table's start or load figures, where memory "
                             "goes, or 1,000 chats against Telegram's 30 messages/s")
    parser.add_argument("--saturation-seconds", type=float, default=120.0,
                        help="seconds of the saturation run whose answers are counted")
    args = parser.parse_args()
    began = time.perf_counter()
    if args.only == "saturation":
        asyncio.run(run_saturation(args.saturation_seconds))
        return
    if args.only != "memory":
        parts = {"start": [run_start], "load": [run_load]}.get(args.only or "",
                                                               [run_start, run_load])
        table = asyncio.run(run_all(args.runs, parts))
        print()
        print(f"Roost on Telegram, `roost run` measured from outside ({os.cpu_count()} cores, "
              f"python {sys.version.split()[0]}, median of {args.runs} runs, "
              f"{time.perf_counter() - began:.0f} s)")
        table.print()
    if args.only in (None, "memory"):
        asyncio.run(run_memory())


if __name__ == "__main__":
    main()
