"""What checking a cached session against the database costs each run (bot/storage/sessions.py).

Run with ``.venv/bin/python bench/bench_session_check.py`` (a few seconds; needs the
PostgreSQL server binaries, as the tests do). On SQLite and on a throwaway local
PostgreSQL (``fsync=off``), with a session of ``MESSAGES`` messages:

* ``get()`` of a cached copy that is current: the one read every run now makes;
* ``get()`` of a copy another process moved past: that read plus the reload.

Figures are medians of ``CALLS`` calls.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table
from bot.contracts.llm import ChatMessage
from bot.storage.sessions import STALE, SessionStore
from bot.testing.postgres import PostgresCluster

MESSAGES = 50
CALLS = 300


async def _medians(url: str) -> tuple[float, float]:
    store = await SessionStore.open(url)
    try:
        session = await store.get("k")
        for n in range(MESSAGES // 2):
            await store.append_run(session, f"r{n}", [ChatMessage("user", f"q{n} " * 50),
                                                      ChatMessage("assistant", f"a{n} " * 50)])
        current, stale = [], []
        for _ in range(CALLS):
            began = time.perf_counter()
            session = await store.get("k")
            current.append(time.perf_counter() - began)
        for _ in range(CALLS):
            session.version = STALE  # as if another replica had written it
            began = time.perf_counter()
            session = await store.get("k")
            stale.append(time.perf_counter() - began)
        return statistics.median(current), statistics.median(stale)
    finally:
        await store.close()


async def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("SQLite", *await _medians(f"sqlite:///{Path(tmp) / 'roost.db'}")))
    cluster = PostgresCluster(in_ram=False).start()
    try:
        rows.append(("PostgreSQL", *await _medians(await cluster.create_database())))
    finally:
        cluster.stop()
    print_table(["backend", "current copy (ms)", "stale copy reloaded (ms)"],
                [(name, f"{a * 1e3:.3f}", f"{b * 1e3:.3f}") for name, a, b in rows])


if __name__ == "__main__":
    asyncio.run(main())
