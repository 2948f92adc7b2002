"""Error submission channel benchmark: ErrorStore writes, reads and lists on SQLite.

Run with ``.venv/bin/python bench/bench_errors.py`` (about 15 s on 2 cores).

The stores run exactly as in the service: on the connection ``SessionStore.open``
makes (WAL, ``synchronous=NORMAL``) in a temporary directory, sharing the
session store's lock. Before measuring, the table is filled with
``PREFILL`` errors (3 KB stack traces, 100 sessions, 10 tools, spread over 30
days) so reads and lists hit a realistically sized table with its indexes.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bot.storage.errors import ErrorStore, summarize_error
from bot.storage.sessions import SessionStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table, targets_line, verdict

PREFILL = 10_000
SESSIONS = 100
TOOLS = 10
SEQUENTIAL_WRITES = 2_000
CONCURRENT_WRITES = 10_000
CONCURRENT_WORKERS = 100
"""Tasks storing at once (think: runs whose tools fail at the same time), each in a loop."""
READS = 5_000
LISTS = 1_000
ROUNDS = 5
"""Throughput figures are the median of this many rounds."""

SPEC_STORE_P50_MS = 5.0
SPEC_STORE_P99_MS = 15.0
SPEC_WRITES_PER_S = 200.0
SPEC_GET_P50_MS = 3.0
SPEC_GET_P99_MS = 10.0
SPEC_LIST_P50_MS = 10.0
TARGET_WRITES_PER_S = 5_000.0
TARGET_GET_P50_MS = 0.3


def raw_error(i: int) -> dict[str, object]:
    """A realistic structured error: a code, a one-line message, a 3 KB trace."""
    frames = "".join(f'  File "/srv/app/module_{j}.py", line {100 + j}, in handler_{j}\n'
                     f"    result = await backend.call(request_{j})\n" for j in range(30))
    return {"code": "SQL_ERROR", "message": f"relation \"table_{i}\" does not exist\n{frames}",
            "retryable": False, "details": {"affected_resources": [f"table_{i}"]}}


@dataclass(slots=True)
class Row:
    what: str
    measured: str
    spec: str
    target: str = ""
    verdict: str = ""


async def timed(op: Callable[[int], Awaitable[object]], n: int) -> list[float]:
    """Latency (ms) of ``n`` sequential calls ``op(i)``."""
    latencies = []
    for i in range(n):
        began = time.perf_counter()
        await op(i)
        latencies.append((time.perf_counter() - began) * 1000)
    return latencies


async def concurrent_rate(errors: ErrorStore, samples: list[dict[str, object]],
                          total: int) -> tuple[float, list[float]]:
    """Writes/s with ``CONCURRENT_WORKERS`` tasks each storing in a loop; and latencies."""
    per_worker = total // CONCURRENT_WORKERS
    latencies: list[float] = []

    async def worker(w: int) -> None:
        for i in range(per_worker):
            began = time.perf_counter()
            await errors.store(f"sess-{w % SESSIONS}", f"tool_{i % TOOLS}",
                               samples[i % len(samples)])
            latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(CONCURRENT_WORKERS)))
    return per_worker * CONCURRENT_WORKERS / (time.perf_counter() - began), latencies


async def run() -> list[Row]:
    samples = [raw_error(i) for i in range(50)]
    with tempfile.TemporaryDirectory() as tmp:
        sessions = await SessionStore.open(Path(tmp) / "roost.db")
        try:
            return await measure(sessions, samples)
        finally:
            await sessions.close()


async def measure(sessions: SessionStore, samples: list[dict[str, object]]) -> list[Row]:
    now = time.time()
    rng = random.Random(7)
    # Prefill with timestamps spread over 30 days (a clock the store reads per write).
    ages = iter([rng.uniform(0, 30 * 86_400) for _ in range(PREFILL)])
    prefill = ErrorStore(sessions.db, sessions.lock, clock=lambda: now - next(ages))
    stored = await asyncio.gather(*(
        prefill.store(f"sess-{i % SESSIONS}", f"tool_{i % TOOLS}", samples[i % len(samples)])
        for i in range(PREFILL)))
    ids = [e.id for e in stored]
    errors = ErrorStore(sessions.db, sessions.lock)

    # Reads first, on the prefilled table. Warm-up: code paths, statement and page cache.
    await timed(lambda i: errors.get(ids[i]), 200)
    picks = [rng.choice(ids) for _ in range(READS)]
    get_lat = await timed(lambda i: errors.get(picks[i]), READS)
    get_own = await timed(lambda i: errors.get(picks[i], session_id="sess-0"), READS)
    since = now - 86_400
    list_session = await timed(lambda i: errors.list(session_id=f"sess-{i % SESSIONS}",
                                                     limit=10), LISTS)
    list_tool = await timed(lambda i: errors.list(tool_name=f"tool_{i % TOOLS}", since=since,
                                                  limit=5), LISTS)
    list_both = await timed(lambda i: errors.list(session_id=f"sess-{i % SESSIONS}",
                                                  tool_name=f"tool_{i % TOOLS}", limit=50),
                            LISTS)

    await timed(lambda i: errors.store("warm", "t", samples[i % 50]), 200)
    seq_rates, seq_lat = [], []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        lat = await timed(lambda i: errors.store(f"sess-{i % SESSIONS}", f"tool_{i % TOOLS}",
                                                 samples[i % 50]), SEQUENTIAL_WRITES)
        seq_rates.append(SEQUENTIAL_WRITES / (time.perf_counter() - began))
        seq_lat += lat
    conc_rates, conc_lat = [], []
    for _ in range(ROUNDS):
        rate, lat = await concurrent_rate(errors, samples, CONCURRENT_WRITES)
        conc_rates.append(rate)
        conc_lat += lat
    total = len(await errors.list(limit=None))

    text = str(samples[0]["message"])
    began = time.perf_counter()
    for _ in range(100_000):
        summarize_error(text)
    summary_us = (time.perf_counter() - began) / 100_000 * 1e6

    seq_rate = statistics.median(seq_rates)
    conc_rate = statistics.median(conc_rates)
    get_p50 = percentile(get_lat, 50)

    def ms(values: list[float]) -> str:
        return f"{percentile(values, 50):.3f} / {percentile(values, 99):.3f} ms"

    print(f"  reads and lists ran on the {PREFILL:,} prefilled rows; the table ended with "
          f"{total:,}")
    return [
        Row("summarize_error (3 KB trace)", f"{summary_us:.2f} µs", "<1 µs p50"),
        Row("store, sequential: writes/s", f"{seq_rate:,.0f}/s", f"{SPEC_WRITES_PER_S:,.0f}/s",
            f">= {TARGET_WRITES_PER_S:,.0f}/s", verdict(seq_rate >= TARGET_WRITES_PER_S)),
        Row("store, sequential: p50 / p99", ms(seq_lat),
            f"{SPEC_STORE_P50_MS:g} / {SPEC_STORE_P99_MS:g} ms"),
        Row(f"store, {CONCURRENT_WORKERS} tasks: writes/s", f"{conc_rate:,.0f}/s",
            f"{SPEC_WRITES_PER_S:,.0f}/s", f">= {TARGET_WRITES_PER_S:,.0f}/s",
            verdict(conc_rate >= TARGET_WRITES_PER_S)),
        Row(f"store, {CONCURRENT_WORKERS} tasks: p50 / p99", ms(conc_lat),
            f"{SPEC_STORE_P50_MS:g} / {SPEC_STORE_P99_MS:g} ms"),
        Row("get by ID: p50 / p99", ms(get_lat),
            f"{SPEC_GET_P50_MS:g} / {SPEC_GET_P99_MS:g} ms",
            f"p50 <= {TARGET_GET_P50_MS:g} ms", verdict(get_p50 <= TARGET_GET_P50_MS)),
        Row("get by ID + session: p50 / p99", ms(get_own),
            f"{SPEC_GET_P50_MS:g} / {SPEC_GET_P99_MS:g} ms",
            f"p50 <= {TARGET_GET_P50_MS:g} ms",
            verdict(percentile(get_own, 50) <= TARGET_GET_P50_MS)),
        Row("list session, limit 10: p50 / p99", ms(list_session),
            f"{SPEC_LIST_P50_MS:g} / 50 ms"),
        Row("list tool + last 24 h, limit 5", ms(list_tool), f"{SPEC_LIST_P50_MS:g} / 50 ms"),
        Row("list session + tool, limit 50", ms(list_both), f"{SPEC_LIST_P50_MS:g} / 50 ms"),
    ]


def print_report(rows: list[Row]) -> None:
    print_table(("Measurement", "Roost", "Spec (Go)", "Target", ""),
                [(r.what, r.measured, r.spec, r.target, r.verdict) for r in rows], indent="  ")


def main() -> None:
    began = time.perf_counter()
    print("Roost error store benchmark")
    print(f"  Python {sys.version.split()[0]}; SQLite (WAL, synchronous=NORMAL) in a temp dir; "
          f"{PREFILL:,} errors prefilled over {SESSIONS} sessions and {TOOLS} tools")
    rows = asyncio.run(run())
    print()
    print_report(rows)
    print("\n" + targets_line([r.verdict for r in rows], began))


if __name__ == "__main__":
    main()
