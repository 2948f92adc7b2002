"""Roost core benchmarks: per-turn overhead, throughput, startup, memory per idle session.

Run with ``.venv/bin/python bench/bench_core.py`` (about 30 s on 2 cores).
``--profile`` instead profiles the 1,000-session throughput case (cProfile on
the event-loop thread and, separately, on worker threads: the aiosqlite
connection thread and ``asyncio.to_thread`` workers) and prints where
retained memory per idle session comes from (tracemalloc).

Everything runs in-process against the public API (``Roost.create``, a
``Channel`` subclass, ``ScriptedProvider``) except the startup measurement,
which launches ``roost run`` as a subprocess. Data dirs are temporary; no
network is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import itertools
import os
import platform
import pstats
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import aiosqlite
import psutil  # type: ignore[import-untyped]

from bot.app.roost import Roost
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.storage.sessions import session_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (
    InstantProvider,
    Row,
    ms,
    percentile,
    print_rows,
    progress,
    quiet_logging,
    roost_app,
    roost_process,
    targets_line,
    verdict,
)

# -- targets -----------------------------------------------------------------

TARGET_P50_MS = 2.0
TARGET_TURNS_PER_S = 1_000.0
TARGET_READY_S = 0.7
TARGET_IDLE_RSS_MB = 80.0
TARGET_KB_PER_SESSION = 20.0

# -- sizes (bounded so the whole run stays well under two minutes) -------------

OVERHEAD_POOL = 50
"""Sessions the sequential overhead turns rotate through (bounds history growth)."""
OVERHEAD_TURNS = 1_000
THROUGHPUT_CASES: tuple[tuple[int, int], ...] = ((1, 300), (100, 5), (1_000, 2))
"""(concurrent sessions, turns each session sends per measured round)."""
THROUGHPUT_ROUNDS = 3
"""Measured rounds per case (same sessions, same app); the median rate is reported."""
MEMORY_SESSIONS = 1_000
MEMORY_WARMUP_SESSIONS = 100
STARTUP_RUNS = 5
TURN_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 5.0

TOOL_PREFIX = "tool"
PLAIN_REPLY = "ok"
TOOL_REPLY = "done"


# -- the provider and the channel ----------------------------------------------


class BenchProvider(InstantProvider):
    """Instant scripted answers: plain turns, one-tool turns, and compaction as in production."""

    def __init__(self) -> None:
        super().__init__([
            # Compaction runs as in production (every ~13 turns of a session): the
            # memory flush stores nothing and the summarizer answers at once.
            {"match": "^Pre-compaction memory flush", "reply": "NO_REPLY"},
            {"match": "\nassistant: ", "reply": "Summary: the user ran benchmark turns."},
            {"match": rf"^{TOOL_PREFIX}\b", "steps": [
                {"text": "", "tool_calls": [{"name": "list_files", "arguments": {}}]},
                {"reply": TOOL_REPLY},
            ]},
            {"reply": PLAIN_REPLY},
        ])

    def forget(self) -> None:
        """Drop the per-message turn choices (before a memory measurement)."""
        self._chosen.clear()


class BenchError(RuntimeError):
    """The core did not answer the way the bench expects."""


class BenchChannel(Channel):
    """A direct-chat channel that times each message until its reply is sent."""

    name = "bench"

    def __init__(self) -> None:
        self.handler: InboundHandler | None = None
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.expect: dict[str, str] = {}
        self.unexpected: list[OutboundMessage] = []
        self._ids = itertools.count(1)

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def send(self, message: OutboundMessage) -> None:
        now = time.perf_counter()
        fut = self.waiting.pop(message.chat_id, None)
        if fut is None or fut.done():
            self.unexpected.append(message)
            return
        wanted = self.expect.pop(message.chat_id, "")
        if message.kind != "reply" or message.text != wanted:
            fut.set_exception(BenchError(f"expected reply {wanted!r} for {message.chat_id}, "
                                         f"got {message.kind} {message.text!r}"))
        else:
            fut.set_result(now)

    def message(self, sender: str, text: str) -> InboundMessage:
        """A direct message from ``sender``."""
        return InboundMessage(channel=self.name, chat_id=sender, chat_type="direct",
                              sender_id=sender, text=text, message_id=str(next(self._ids)))

    async def turn(self, sender: str, text: str, reply: str) -> float:
        """Submit ``text`` from ``sender``; seconds until the reply reached :meth:`send`."""
        assert self.handler is not None, "channel not started"
        if sender in self.waiting:
            raise BenchError(f"{sender} already has a turn in flight")
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[sender] = fut
        self.expect[sender] = reply
        message = self.message(sender, text)
        start = time.perf_counter()
        await self.handler(message)
        done = await asyncio.wait_for(fut, TURN_TIMEOUT_S)
        return done - start

    async def plain(self, sender: str, n: int) -> float:
        """One plain turn."""
        return await self.turn(sender, f"hello {n}", PLAIN_REPLY)

    async def tool(self, sender: str, n: int) -> float:
        """One turn with a single ``list_files`` call."""
        return await self.turn(sender, f"{TOOL_PREFIX} {n}", TOOL_REPLY)


@contextlib.asynccontextmanager
async def bench_app(**settings: Any) -> AsyncIterator[tuple[Roost, BenchChannel, BenchProvider]]:
    """A fresh app on a temporary data dir with the bench channel started."""
    provider = BenchProvider()
    async with roost_app(provider, **settings) as app:
        channel = BenchChannel()
        await app.add_channel(channel)
        yield app, channel, provider
        if channel.unexpected:
            raise BenchError(f"{len(channel.unexpected)} unexpected message(s), first: "
                             f"{channel.unexpected[0]}")


# -- measurements ------------------------------------------------------------------


@dataclass(slots=True)
class Overhead:
    kind: str
    latencies: list[float]
    max_history: int


async def bench_overhead(kind: str) -> Overhead:
    """Sequential turns rotating through ``OVERHEAD_POOL`` warmed-up direct sessions."""
    async with bench_app() as (app, channel, _):
        do = channel.tool if kind == "tool" else channel.plain
        senders = [f"{kind}-{i}" for i in range(OVERHEAD_POOL)]
        for sender in senders:  # warm-up: creates sessions and seeds workspaces
            await do(sender, 0)
            await do(sender, 1)
        latencies = [await do(senders[n % len(senders)], n + 2) for n in range(OVERHEAD_TURNS)]
        await app.dispatcher.drain()
        history = 0
        for sender in senders:
            session = await app.store.get(session_key(channel.message(sender, "")))
            history = max(history, len(session.messages))
            if kind == "tool":
                tools = [m for m in session.messages if m.role == "tool"]
                if not tools or any(m.is_error for m in tools):
                    raise BenchError(f"tool turns of {sender} did not run list_files cleanly")
        return Overhead(kind, latencies, history)


@dataclass(slots=True)
class Throughput:
    sessions: int
    per_session: int
    first_contact_wall: float
    walls: list[float]
    """Wall time of each measured round (every session sends ``per_session`` turns)."""
    latencies: list[float]

    @property
    def turns(self) -> int:
        return self.sessions * self.per_session * len(self.walls)

    @property
    def rates(self) -> list[float]:
        return [self.sessions * self.per_session / wall for wall in self.walls]

    @property
    def rate(self) -> float:
        """Median turns/s over the rounds."""
        return statistics.median(self.rates)

    @property
    def first_contact_rate(self) -> float:
        return self.sessions / self.first_contact_wall


async def throughput_case(channel: BenchChannel, sessions: int, per_session: int, *,
                          rounds: int = THROUGHPUT_ROUNDS,
                          measure: Callable[[], contextlib.AbstractContextManager[Any]]
                          = contextlib.nullcontext) -> Throughput:
    """``sessions`` concurrent senders, each sending ``per_session`` turns in sequence.

    A first-contact round (one turn per session: new session row, workspace
    seeding) runs first and is timed separately; then ``rounds`` measured
    rounds. ``measure`` wraps only the measured rounds.
    """
    senders = [f"tp{sessions}-{i}" for i in range(sessions)]
    start = time.perf_counter()
    await asyncio.gather(*(channel.plain(s, 0) for s in senders))
    first_contact = time.perf_counter() - start
    latencies: list[float] = []
    walls: list[float] = []
    counter = itertools.count(1)

    async def sender_loop(sender: str) -> None:
        for _ in range(per_session):
            latencies.append(await channel.plain(sender, next(counter)))

    with measure():
        for _ in range(rounds):
            start = time.perf_counter()
            await asyncio.gather(*(sender_loop(s) for s in senders))
            walls.append(time.perf_counter() - start)
    return Throughput(sessions, per_session, first_contact, walls, latencies)


async def bench_throughput(sessions: int, per_session: int) -> Throughput:
    async with bench_app() as (app, channel, _):
        result = await throughput_case(channel, sessions, per_session)
        await app.dispatcher.drain()
        return result


def rss() -> int:
    """This process's resident set size in bytes."""
    return int(psutil.Process().memory_info().rss)


@dataclass(slots=True)
class Memory:
    sessions: int
    rss_delta: int
    traced_delta: int
    cached: int
    top: list[str] = field(default_factory=list)

    @property
    def rss_kb_per_session(self) -> float:
        return self.rss_delta / self.sessions / 1024

    @property
    def traced_kb_per_session(self) -> float:
        return self.traced_delta / self.sessions / 1024


async def _idle_sessions(channel: BenchChannel, provider: BenchProvider, prefix: str,
                         count: int) -> None:
    for i in range(count):
        await channel.plain(f"{prefix}-{i}", 0)
    provider.forget()


async def bench_memory(*, top: int = 0) -> Memory:
    """Memory retained per idle cached session after one short exchange each.

    Two fresh apps: one for the RSS delta, one under tracemalloc (whose own
    bookkeeping would inflate RSS). Each is warmed up with
    ``MEMORY_WARMUP_SESSIONS`` sessions first so one-time costs (allocator
    arenas, SQLite page cache, executor threads) fall outside the delta.
    """
    cache = MEMORY_SESSIONS + MEMORY_WARMUP_SESSIONS + 10
    async with bench_app(session_cache_size=cache) as (app, channel, provider):
        await _idle_sessions(channel, provider, "warm", MEMORY_WARMUP_SESSIONS)
        gc.collect()
        before = rss()
        await _idle_sessions(channel, provider, "idle", MEMORY_SESSIONS)
        await app.dispatcher.drain()
        gc.collect()
        rss_delta = rss() - before
        cached = app.store.cached_count()

    async with bench_app(session_cache_size=cache) as (app, channel, provider):
        await _idle_sessions(channel, provider, "warm", MEMORY_WARMUP_SESSIONS)
        gc.collect()
        tracemalloc.start(1)
        try:
            base = tracemalloc.get_traced_memory()[0]
            first = tracemalloc.take_snapshot() if top else None
            await _idle_sessions(channel, provider, "idle", MEMORY_SESSIONS)
            await app.dispatcher.drain()
            gc.collect()
            traced_delta = tracemalloc.get_traced_memory()[0] - base
            lines: list[str] = []
            if first is not None:
                diff = tracemalloc.take_snapshot().compare_to(first, "lineno")
                lines = [str(stat) for stat in diff[:top]]
        finally:
            tracemalloc.stop()
    return Memory(MEMORY_SESSIONS, rss_delta, traced_delta, cached, lines)


# -- startup ---------------------------------------------------------------------


@dataclass(slots=True)
class StartupRun:
    ready: float | None
    rss: int | None
    exit_code: int | None
    exit_time: float | None
    note: str = ""


def _child_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_PROVIDER="scripted", ROOST_CONSOLE="1", ROOST_LOG_LEVEL="INFO",
               ROOST_DM_POLICY="open",
               ROOST_DATA_DIR=str(data_dir))
    return env


def startup_once() -> StartupRun:
    """Launch ``roost run`` with the console on an open, silent stdin pipe."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-run-") as tmp, \
            roost_process(_child_env(Path(tmp) / "data"), Path(tmp), stdin_pipe=True) as roost:
        try:
            ready = roost.wait_ready(READY_TIMEOUT_S)
        except RuntimeError:
            return StartupRun(None, None, roost.proc.poll(), None,
                              "no 'roost ready' line; stderr: " + roost.stderr_tail())
        time.sleep(0.5)  # let it settle into idle before sampling RSS
        resident = roost.rss()
        code, exit_time = roost.stop(EXIT_TIMEOUT_S)
        note = "" if code == 0 else "stderr tail: " + roost.stderr_tail()
        return StartupRun(ready, resident, code, exit_time, note)


def interpreter_startup() -> float:
    """Median wall time of ``python -c pass``, for scale."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- report -------------------------------------------------------------------


def machine_info() -> list[str]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                cpu = text.split(":", 1)[1].strip()
                break
    return [
        f"cores: {os.cpu_count()} logical, {psutil.cpu_count(logical=False)} physical  "
        f"cpu: {cpu or 'unknown'}",
        f"python: {platform.python_implementation()} {platform.python_version()}  "
        f"platform: {platform.platform()}",
        f"sqlite: {sqlite3.sqlite_version}  aiosqlite: {aiosqlite.__version__}  "
        f"event loop: {type(asyncio.get_event_loop_policy()).__name__} (stdlib asyncio)",
    ]


async def run_all() -> list[Row]:
    rows: list[Row] = []
    phase = time.perf_counter()
    for kind, label in (("plain", "plain reply"), ("tool", "1 tool call (list_files)")):
        result = await bench_overhead(kind)
        p50 = percentile(result.latencies, 50)
        p99 = percentile(result.latencies, 99)
        rows.append(Row(f"overhead p50, {label}", ms(p50), f"<= {TARGET_P50_MS:g} ms",
                        verdict(p50 * 1000 <= TARGET_P50_MS)))
        rows.append(Row(f"overhead p99, {label}", ms(p99), details=[
            f"{len(result.latencies):,} sequential turns round-robin over {OVERHEAD_POOL} "
            f"warmed-up sessions (history <= {result.max_history} messages); "
            f"mean {ms(statistics.fmean(result.latencies))}, "
            f"max {ms(max(result.latencies))}"]))
    progress(f"overhead done in {time.perf_counter() - phase:.1f}s")

    phase = time.perf_counter()
    for sessions, per_session in THROUGHPUT_CASES:
        tp = await bench_throughput(sessions, per_session)
        target = result_text = ""
        if sessions == 1_000:
            target = f">= {TARGET_TURNS_PER_S:,.0f} turns/s"
            result_text = verdict(tp.rate >= TARGET_TURNS_PER_S)
        rounds = ", ".join(f"{r:,.0f}" for r in tp.rates)
        rows.append(Row(f"throughput, {sessions:,} concurrent session(s)",
                        f"{tp.rate:,.0f} turns/s", target, result_text, details=[
                            f"median of {len(tp.walls)} rounds ({rounds} turns/s), each "
                            f"{sessions:,} x {per_session} sequential turns; {tp.turns:,} turns",
                            f"turn latency p50 {ms(percentile(tp.latencies, 50))}, p99 "
                            f"{ms(percentile(tp.latencies, 99))}; first contact (new session + "
                            f"workspace seeding, not in the rate) "
                            f"{tp.first_contact_rate:,.0f} sessions/s"]))
    progress(f"throughput done in {time.perf_counter() - phase:.1f}s")

    phase = time.perf_counter()
    memory = await bench_memory()
    target = f"<= {TARGET_KB_PER_SESSION:g} KB"
    rows.append(Row("memory per idle session (tracemalloc)",
                    f"{memory.traced_kb_per_session:.2f} KB", target,
                    verdict(memory.traced_kb_per_session <= TARGET_KB_PER_SESSION)))
    rows.append(Row("memory per idle session (RSS delta)",
                    f"{memory.rss_kb_per_session:.2f} KB", target,
                    verdict(memory.rss_kb_per_session <= TARGET_KB_PER_SESSION), details=[
                        f"{memory.sessions:,} sessions x 1 exchange, all idle and cached "
                        f"({memory.cached:,} in cache); after {MEMORY_WARMUP_SESSIONS} warm-up "
                        "sessions; RSS is coarse (allocator reuse), tracemalloc is Python heap "
                        "only"]))
    progress(f"memory done in {time.perf_counter() - phase:.1f}s")
    return rows


def startup_rows() -> list[Row]:
    phase = time.perf_counter()
    runs = [startup_once() for _ in range(STARTUP_RUNS)]
    rows: list[Row] = []
    ok = [r for r in runs if r.ready is not None and r.rss is not None]
    readies = [r.ready for r in ok if r.ready is not None]
    sizes = [r.rss / 2**20 for r in ok if r.rss is not None]
    if readies and sizes:
        ready = statistics.median(readies)
        resident = statistics.median(sizes)
        rows.append(Row("roost run -> 'roost ready'", f"{ready:.3f} s",
                        f"<= {TARGET_READY_S:g} s", verdict(ready <= TARGET_READY_S), details=[
                            f"median of {len(readies)} runs: "
                            + ", ".join(f"{t:.3f}" for t in readies)
                            + f" s; python -c pass takes {interpreter_startup():.3f} s"]))
        rows.append(Row("idle RSS after ready (console channel)", f"{resident:.1f} MB",
                        f"<= {TARGET_IDLE_RSS_MB:g} MB", verdict(resident <= TARGET_IDLE_RSS_MB),
                        details=["median; sampled 0.5 s after ready: "
                                 + ", ".join(f"{m:.1f}" for m in sizes) + " MB"]))
    else:
        rows.append(Row("roost run -> 'roost ready'", "FAILED", f"<= {TARGET_READY_S:g} s",
                        "MISS"))
    clean = [r for r in runs if r.exit_code == 0]
    exits = [r.exit_time for r in clean if r.exit_time is not None]
    measured = f"{len(clean)}/{len(runs)} runs"
    if exits:
        measured += f", slowest {max(exits):.2f} s"
    rows.append(Row("SIGTERM -> exit 0", measured, f"all, within {EXIT_TIMEOUT_S:g} s",
                    verdict(len(clean) == len(runs)),
                    details=[f"run {n}: {r.note}".replace("\n", " | ")
                             for n, r in enumerate(runs, 1) if r.note]))
    progress(f"startup done in {time.perf_counter() - phase:.1f}s")
    return rows


# -- profile -----------------------------------------------------------------------


class ThreadProfiles:
    """cProfile every thread started while installed (aiosqlite, to_thread workers).

    Worker profiles use per-thread CPU time, so time spent blocked on a queue
    or waiting for the GIL is not charged to the function that was running.
    """

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        # Called once, as the new thread's first profile event: replace the
        # Python-level hook with a C profiler for this thread.
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(profile)
        profile.enable()

    def __enter__(self) -> ThreadProfiles:
        threading.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.setprofile(None)


ROOST_CODE = r"/(bot|plugins|channels|workspaces)/|aiosqlite"


def print_profile(title: str, stats: pstats.Stats, sort: str, limit: int,
                  pattern: str | None = ROOST_CODE) -> None:
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats(sort)
    if pattern:
        stats.print_stats(pattern, limit)
    else:
        stats.print_stats(limit)
    text = out.getvalue()
    body = text[text.find("   ncalls"):] if "   ncalls" in text else text
    print(f"\n== {title} ==")
    print(body.rstrip())


class TimedLock(asyncio.Lock):
    """An ``asyncio.Lock`` that records how long each holder kept it."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[float] = []
        self._since = 0.0

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        self._since = time.perf_counter()
        return True

    def release(self) -> None:
        self.held.append(time.perf_counter() - self._since)
        super().release()


async def lock_diagnostic() -> list[str]:
    """How long a turn holds the session store's write lock, per throughput case.

    Swaps the store's private ``_lock`` for a timing one; diagnostic only.
    """
    lines = []
    for sessions, per_session in THROUGHPUT_CASES:
        async with bench_app() as (app, channel, _):
            if not isinstance(getattr(app.store, "_lock", None), asyncio.Lock):
                return ["(SessionStore has no _lock any more; diagnostic skipped)"]
            lock = TimedLock()
            app.store._lock = lock
            tp = await throughput_case(channel, sessions, per_session)
            held = lock.held[-tp.turns:]
            lines.append(
                f"{sessions:>5,} sessions: {tp.rate:,.0f} turns/s; lock held per turn p50 "
                f"{ms(statistics.median(held))}, mean {ms(statistics.fmean(held))}; "
                f"held {sum(held) / sum(tp.walls):.0%} of the measured wall time")
    return lines


async def profile_throughput(sessions: int, per_session: int,
                             threads: ThreadProfiles) -> tuple[pstats.Stats, Throughput]:
    main = cProfile.Profile()

    @contextlib.contextmanager
    def measure() -> Iterator[None]:
        main.enable()
        try:
            yield
        finally:
            main.disable()

    with threads:
        async with bench_app() as (app, channel, _):
            result = await throughput_case(channel, sessions, per_session, rounds=1,
                                           measure=measure)
            await app.dispatcher.drain()
    return pstats.Stats(main), result


def run_profile() -> None:
    sessions, per_session = THROUGHPUT_CASES[-1]
    threads = ThreadProfiles()
    main_stats, result = asyncio.run(profile_throughput(sessions, per_session, threads))
    print(f"profiled: {sessions:,} sessions x {per_session} turns = {result.turns:,} turns, "
          f"{result.rate:,.0f} turns/s under cProfile (the first-contact round is not profiled)")
    print_profile("event-loop thread: Roost + aiosqlite, by cumulative time", main_stats,
                  "cumulative", 25)
    print_profile("event-loop thread: everything, by own time", main_stats, "tottime", 20, None)
    worker = [p for p in threads.profiles if p.getstats()]
    if worker:
        # Worker threads ran for the whole app lifetime (first contact included).
        thread_stats = pstats.Stats(worker[0])
        for extra in worker[1:]:
            thread_stats.add(extra)
        print_profile(f"worker threads ({len(worker)}: aiosqlite + to_thread), by own CPU "
                      "time, whole app lifetime (first contact included)", thread_stats,
                      "tottime", 15, None)
    print("\n== session-store write lock (serialises every run's flush) ==")
    for line in asyncio.run(lock_diagnostic()):
        print(line)
    memory = asyncio.run(bench_memory(top=12))
    print(f"\n== retained allocations for {memory.sessions:,} idle sessions "
          f"({memory.traced_kb_per_session:.1f} KB/session), top sites ==")
    for line in memory.top:
        print(line)


# -- main ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", action="store_true",
                        help="profile the 1,000-session throughput case instead")
    args = parser.parse_args()
    quiet_logging("roost.engine.runloop")
    if args.profile:
        run_profile()
        return
    began = time.perf_counter()
    print("Roost core benchmark")
    for line in machine_info():
        print("  " + line)
    print("  provider: scripted, answers instantly; persistence: SQLite (WAL) in a temp dir; "
          "roost.engine.runloop INFO logs silenced")
    rows = asyncio.run(run_all())
    rows += startup_rows()
    print()
    print_rows(rows)
    print("\n" + targets_line([r.verdict for r in rows], began))


if __name__ == "__main__":
    main()
