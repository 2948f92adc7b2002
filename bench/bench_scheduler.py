"""Scheduler benchmark: starting with 10,000 persisted jobs, and how fast jobs fire.

Run with ``.venv/bin/python bench/bench_scheduler.py`` (about 40 s on 2 cores).

Everything runs in-process through the public API (``Roost.create`` with a
scripted provider, ``services.scheduler``) on SQLite files in temporary
directories; no network is used.

- Startup: 10,000 cron jobs are written into the ``jobs`` table (a mix of
  cron expressions, ``every`` intervals and future ``at`` times, in three time
  zones, 1,000 owners), then ``Roost.create`` is timed on that data dir: with a
  fake clock (load, parse, first fire times) and with the real clock (the
  same, plus one APScheduler job per row). An empty data dir is the baseline.
- Firing through ``run_due``: 10,000 no-op system jobs due at the same
  instant of a fake clock (claims, coalescing, task per run), then 1,000 cron
  jobs in 1,000 group chats answered at once by the scripted provider (a full
  agent turn each: session, prompt, run, persistence, delivery), twice: first
  contact (new sessions and workspaces), then warm.
- Firing through the APScheduler timer: 10,000 no-op system jobs due at the
  same wall-clock second; the time runs from that second to the last run.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.hookspecs import hookimpl
from bot.contracts.jobs import JobSpec
from bot.contracts.messages import OutboundMessage
from bot.scheduling.scheduler import Scheduler
from bot.storage.db import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import InstantProvider, print_table, quiet_logging, roost_app, verdict

JOBS = 10_000
CRON_RUNS = 1_000
ROUNDS = 3
"""Startup figures are the median of this many rounds."""
T0 = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)

TARGET_STARTUP_S = 2.0
"""Extra startup time allowed for 10,000 jobs (on top of an empty data dir)."""
TARGET_FIRES_PER_S = 5_000.0
"""No-op jobs fired per second (scheduler overhead alone)."""


class FakeClock:
    """The scheduler's clock, moved by the bench."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class CountingChannel(Channel):
    """Counts what the core delivers; wakes the bench when the expected count is reached."""

    name = "bench"

    def __init__(self) -> None:
        self.count = 0
        self.expected = 0
        self.done = asyncio.Event()

    async def start(self, handler: InboundHandler) -> None:
        """Nothing to connect."""

    async def send(self, message: OutboundMessage) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.done.set()


class NoopJobs:
    """A plugin offering ``n`` system jobs that only count their runs."""

    def __init__(self, n: int, schedule: str) -> None:
        self.n = n
        self.schedule = schedule
        self.done_at: list[float] = []
        self.all_done = asyncio.Event()

    @hookimpl
    def roost_scheduled_jobs(self, settings: Settings) -> list[JobSpec]:
        async def run(app: Roost) -> None:
            self.done_at.append(time.perf_counter())
            if len(self.done_at) == self.n:
                self.all_done.set()

        return [JobSpec(f"noop{i}", self.schedule, run) for i in range(self.n)]


def opened(data_dir: Path, *plugins: object,
           clock: FakeClock | None = None) -> contextlib.AbstractAsyncContextManager[Roost]:
    """An app on ``data_dir`` whose scripted model answers cron messages at once."""
    provider = InstantProvider([{"reply": "Reminder: {message}"}])
    return roost_app(provider, *plugins, data_dir=data_dir, clock=clock, memory_flush=False)


def scheduler_of(app: Roost) -> Scheduler:
    assert app.services.scheduler is not None
    return app.services.scheduler


# -- the persisted jobs ---------------------------------------------------------------------

_CRON = ("0 9 * * 1-5", "*/15 * * * *", "30 18 * * *", "0 8 1 * *", "0 */2 * * *",
         "45 7 * * 0,6", "0 12 15 * 1")
_EVERY = ("every 5m", "every 1h", "every 6h", "every 1d", "every 1h30m")
_ZONES = ("UTC", "Europe/Paris", "America/New_York")


def job_rows(n: int, now: datetime) -> list[tuple[Any, ...]]:
    """``n`` realistic cron-job rows: 50% cron expressions, 35% intervals, 15% one-shots."""
    rows = []
    for i in range(n):
        kind = i % 20
        if kind < 10:
            schedule = _CRON[i % len(_CRON)]
        elif kind < 17:
            schedule = _EVERY[i % len(_EVERY)]
        else:
            when = (now + timedelta(days=1 + i % 30, minutes=i % 1440)).replace(microsecond=0)
            schedule = f"at {when.isoformat()}"
        created = (now - timedelta(days=i % 60, seconds=i % 86_400)).timestamp() // 1
        rows.append((f"{i:08x}", "cron", f"job {i}", schedule, _ZONES[i % len(_ZONES)],
                     f"Reminder number {i}: check the thing.", f"u{i % 1000}", "bench",
                     f"g{i % 2000}", "group", None, created, None))
    return rows


async def seed(data_dir: Path, rows: Sequence[tuple[Any, ...]]) -> None:
    """Write ``rows`` into the jobs table of a fresh database at ``data_dir``."""
    db = await connect(data_dir / "roost.db")
    try:
        await db.execute("BEGIN")
        await db.executemany(
            "INSERT INTO jobs (id, kind, name, schedule, timezone, message, owner_id, channel,"
            " chat_id, chat_type, thread_id, created_at, last_fire)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        await db.execute("COMMIT")
    finally:
        await db.close()


async def timed_create(data_dir: Path, clock: FakeClock | None) -> float:
    """Seconds ``Roost.create`` takes on ``data_dir``."""
    gc.collect()
    began = time.perf_counter()
    async with opened(data_dir, clock=clock) as app:
        elapsed = time.perf_counter() - began
        # The built-in system jobs (error retention) are there either way.
        loaded = sum(view.job.kind == "cron" for view in await scheduler_of(app).all_jobs())
        assert loaded in (0, JOBS), loaded
    return elapsed


async def bench_startup(root: Path) -> dict[str, float]:
    empty, full = root / "empty", root / "full"
    await seed(empty, [])
    await seed(full, job_rows(JOBS, datetime.now(UTC)))
    results: dict[str, list[float]] = {"empty": [], "fake": [], "timer": []}
    for _ in range(ROUNDS):
        results["empty"].append(await timed_create(empty, None))
        results["fake"].append(await timed_create(full, FakeClock(datetime.now(UTC))))
        results["timer"].append(await timed_create(full, None))
    out = {k: statistics.median(v) for k, v in results.items()}
    # Memory held per loaded job (rows, parsed triggers, APScheduler jobs).
    gc.collect()
    tracemalloc.start()
    async with opened(empty):
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
    async with opened(full):
        gc.collect()
        loaded = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    out["bytes_per_job"] = max(0.0, (loaded - base) / JOBS)
    return out


# -- firing ------------------------------------------------------------------------------------


async def bench_noop_run_due(root: Path) -> tuple[float, float]:
    """No-op system jobs all due at once on the fake clock: (jobs/s, ms in run_due)."""
    clock = FakeClock()
    jobs = NoopJobs(JOBS, "every 1m")
    async with opened(root / "noop", jobs, clock=clock) as app:
        scheduler = scheduler_of(app)
        clock.now += timedelta(minutes=1)
        began = time.perf_counter()
        fires = await scheduler.run_due()
        claimed = time.perf_counter()
        await scheduler.wait_idle()
        ended = time.perf_counter()
        assert len(fires) == JOBS and len(jobs.done_at) == JOBS
    return JOBS / (ended - began), (claimed - began) * 1000


async def bench_cron_runs(root: Path) -> tuple[float, float]:
    """Cron jobs answered by the instant provider: (runs/s first contact, runs/s warm)."""
    clock = FakeClock()
    async with opened(root / "cron", clock=clock) as app:
        channel = CountingChannel()
        await app.add_channel(channel)
        scheduler = scheduler_of(app)
        for i in range(CRON_RUNS):
            await scheduler.add(owner_id=f"u{i % 100}", channel="bench", chat_id=f"g{i}",
                                chat_type="group", thread_id=None, schedule="every 1m",
                                message=f"stand up and stretch ({i})")
        rates = []
        for _ in range(2):
            channel.count, channel.expected = 0, CRON_RUNS
            channel.done.clear()
            clock.now += timedelta(minutes=1)
            began = time.perf_counter()
            fires = await scheduler.run_due()
            await scheduler.wait_idle()
            await asyncio.wait_for(channel.done.wait(), 60)
            rates.append(len(fires) / (time.perf_counter() - began))
    return rates[0], rates[1]


async def bench_timer(root: Path) -> tuple[float, float]:
    """No-op system jobs due at one wall-clock second, through APScheduler.

    Returns (jobs/s from the fire time to the last run, ms from the fire time to the
    first run). The jobs' rows are written first with one shared anchor, which
    the scheduler keeps (same schedule), so all of them fire at the same second.
    """
    data_dir = root / "timer"
    fire_at = math.floor(time.time()) + 6
    anchor = fire_at - 60
    await seed(data_dir, [(f"system:noop{i}", "system", f"noop{i}", "every 1m", "UTC", "", "",
                           "", "", "direct", None, float(anchor), None) for i in range(JOBS)])
    jobs = NoopJobs(JOBS, "every 1m")
    async with opened(data_dir, jobs):
        ready = time.time()
        assert ready < fire_at - 0.5, "startup took too long for the planned fire time"
        await asyncio.wait_for(jobs.all_done.wait(), 60)
        # perf_counter and time.time tick together over these few seconds.
        offset = time.time() - time.perf_counter()
        first = jobs.done_at[0] + offset - fire_at
        last = jobs.done_at[-1] + offset - fire_at
    return JOBS / last, first * 1000


# -- report -------------------------------------------------------------------------------------


async def run() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        startup = await bench_startup(root)
        noop_rate, claim_ms = await bench_noop_run_due(root)
        cold, warm = await bench_cron_runs(root)
        timer_rate, timer_first = await bench_timer(root)
    extra_fake = startup["fake"] - startup["empty"]
    extra_timer = startup["timer"] - startup["empty"]
    rows: list[tuple[str, str, str]] = [
        ("Startup, empty data dir (Roost.create)", f"{startup['empty'] * 1000:.0f} ms", ""),
        (f"Startup, {JOBS:,} jobs, fake clock (load, parse, first fire)",
         f"{startup['fake'] * 1000:.0f} ms (+{extra_fake * 1000:.0f} ms)", ""),
        (f"Startup, {JOBS:,} jobs, real clock (+ APScheduler jobs)",
         f"{startup['timer'] * 1000:.0f} ms (+{extra_timer * 1000:.0f} ms)",
         f"+<= {TARGET_STARTUP_S:g} s: {verdict(extra_timer <= TARGET_STARTUP_S)}"),
        ("Memory per loaded job (tracemalloc, with APScheduler)",
         f"{startup['bytes_per_job'] / 1024:.1f} KB", ""),
        (f"Fire {JOBS:,} no-op jobs due at once (run_due)",
         f"{noop_rate:,.0f} jobs/s (claims + spawn {claim_ms:.0f} ms)",
         f">= {TARGET_FIRES_PER_S:,.0f}/s: {verdict(noop_rate >= TARGET_FIRES_PER_S)}"),
        (f"Fire {JOBS:,} no-op jobs at one second (APScheduler timer)",
         f"{timer_rate:,.0f} jobs/s, first run {timer_first:.0f} ms after the second", ""),
        (f"Fire {CRON_RUNS:,} cron jobs, instant provider, first contact",
         f"{cold:,.0f} runs/s", ""),
        (f"Fire {CRON_RUNS:,} cron jobs, instant provider, warm", f"{warm:,.0f} runs/s", ""),
    ]
    print_table(("Measurement", "Result", "Target"), rows, indent="  ")


def main() -> None:
    # Per-run and per-job INFO lines would be most of the work measured.
    quiet_logging()
    print("Roost scheduler benchmark")
    print(f"  Python {sys.version.split()[0]}; SQLite (WAL) in a temp dir; {JOBS:,} jobs; "
          f"startup median of {ROUNDS} rounds")
    print()
    began = time.perf_counter()
    asyncio.run(run())
    print(f"\ntotal bench time {time.perf_counter() - began:.0f} s")

if __name__ == "__main__":
    main()
