"""Storage backends side by side: SQLite and PostgreSQL (a throwaway local server).

Run with ``.venv/bin/python bench/bench_storage.py`` (about a minute on 2 cores; needs the
PostgreSQL server binaries, as the tests do). It measures, on each backend:

* error-store writes/s: 50 tasks storing at once (group commit) and one task awaiting
  each write;
* runs/s of the service (scripted model answering at once, no tools): one message at a
  time in 20 chats, and 300 messages in 50 chats submitted together;
* on PostgreSQL, the database work of one run counted at the adapter: statements,
  ``executemany`` batches, transactions (``BEGIN`` and ``COMMIT`` are a round trip each)
  and bytes of SQL and parameters.

Figures are medians of ``ROUNDS`` rounds. The local server runs with ``fsync=off`` (as in
the tests): a durable server commits more slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table
from bot.contracts.messages import InboundMessage
from bot.storage import postgres as pgmod
from bot.storage.errors import ErrorStore
from bot.storage.sessions import SessionStore
from bot.testing.app import ChatChannel, create_app, scripted
from bot.testing.postgres import PostgresCluster

ROUNDS = 3
WRITERS = 50
WRITES = 3_000
SEQUENTIAL_WRITES = 500
RUNS = 200
BURST = 300


async def error_writes(url: str) -> tuple[float, float]:
    """(concurrent, sequential) error-store writes per second."""
    store = await SessionStore.open(url)
    errors = ErrorStore(store.db, store.lock)
    try:
        async def writer(k: int) -> None:
            for _ in range(WRITES // WRITERS):
                await errors.store(f"s{k}", "tool", {"message": "boom " * 50})

        started = time.perf_counter()
        await asyncio.gather(*(writer(k) for k in range(WRITERS)))
        concurrent = WRITES / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(SEQUENTIAL_WRITES):
            await errors.store("s", "tool", "x")
        return concurrent, SEQUENTIAL_WRITES / (time.perf_counter() - started)
    finally:
        await store.close()


async def runs_per_second(url: str, data: Path, *, burst: bool,
                          counted: Counted | None = None) -> float:
    """Runs per second of an app on ``url`` (``counted``: count the runs' database work)."""
    app, log = await create_app(scripted({"reply": "ok"}, loop=True), data_dir=data,
                                database_url=url)
    channel = ChatChannel("test", sender="u1")
    await channel.attach(app, log)
    try:
        await app.dispatcher.submit(InboundMessage("test", "w", "direct", "w", "hi",
                                                   event_id="w"))
        await app.dispatcher.drain()
        await app.store.writer.close()
        measuring = counted if counted is not None else contextlib.nullcontext()
        with measuring:
            return await _timed(app, burst=burst)
    finally:
        await app.close()


async def _timed(app: Any, *, burst: bool) -> float:
    started = time.perf_counter()
    if burst:
        await asyncio.gather(*(app.dispatcher.submit(InboundMessage(
            "test", f"u{i % 50}", "direct", f"u{i % 50}", f"m{i}", event_id=f"e{i}"))
            for i in range(BURST)))
        await app.dispatcher.drain()
        count = BURST
    else:
        for i in range(RUNS):
            await app.dispatcher.submit(InboundMessage(
                "test", f"u{i % 20}", "direct", f"u{i % 20}", f"m{i}", event_id=f"e{i}"))
            await app.dispatcher.drain()
        count = RUNS
    await app.store.writer.close()
    return count / (time.perf_counter() - started)


class Counted:
    """Statements, batches, transactions and bytes the PostgreSQL adapter sent."""

    def __init__(self) -> None:
        self.statements = self.batches = self.transactions = self.bytes = 0

    def __enter__(self) -> Counted:
        self._saved = (pgmod.PgConnection._statement, pgmod.PgConnection.executemany,
                       pgmod.transaction)
        statement, executemany, transaction = self._saved

        async def counted_statement(conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
            self.statements += 1
            self.bytes += len(sql) + sum(len(str(p)) for p in params)
            return await statement(conn, sql, params)

        async def counted_many(conn: Any, sql: str, seq: Iterable[Sequence[Any]]) -> Any:
            rows = list(seq)
            self.batches += 1
            self.bytes += len(sql) + sum(len(str(p)) for row in rows for p in row)
            return await executemany(conn, sql, rows)

        async def counted_transaction(db: Any, body: Callable[[Any], Awaitable[Any]]) -> Any:
            self.transactions += 1
            return await transaction(db, body)

        pgmod.PgConnection._statement = counted_statement  # type: ignore[method-assign]
        pgmod.PgConnection.executemany = counted_many  # type: ignore[method-assign]
        pgmod.transaction = counted_transaction
        return self

    def __exit__(self, *exc: object) -> None:
        (pgmod.PgConnection._statement, pgmod.PgConnection.executemany,  # type: ignore[method-assign]
         pgmod.transaction) = self._saved


async def main() -> None:
    cluster = PostgresCluster(in_ram=False).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            names = iter(range(10_000))

            async def fresh(backend: str) -> str:
                if backend == "sqlite":
                    return f"sqlite:///{root / f'{next(names)}.db'}"
                return await cluster.create_database()

            rows = []
            figures: dict[str, dict[str, list[float]]] = {}
            for backend in ("sqlite", "postgresql"):
                got = figures[backend] = {"conc": [], "seq": [], "runs": [], "burst": []}
                for _ in range(ROUNDS):
                    concurrent, sequential = await error_writes(await fresh(backend))
                    got["conc"].append(concurrent)
                    got["seq"].append(sequential)
                    got["runs"].append(await runs_per_second(
                        await fresh(backend), root / f"d{next(names)}", burst=False))
                    got["burst"].append(await runs_per_second(
                        await fresh(backend), root / f"d{next(names)}", burst=True))
            labels = {"conc": f"error store, {WRITERS} writers (writes/s)",
                      "seq": "error store, one writer (writes/s)",
                      "runs": "runs/s, one message at a time",
                      "burst": f"runs/s, {BURST} messages in 50 chats at once"}
            for key, label in labels.items():
                rows.append([label] + [f"{statistics.median(figures[b][key]):,.0f}"
                                       for b in ("sqlite", "postgresql")])
            print_table(["", "SQLite", "PostgreSQL"], rows, numbers_right=True)

            counted = Counted()
            await runs_per_second(await fresh("postgresql"), root / "counted", burst=False,
                                  counted=counted)
            per = RUNS
            trips = (counted.statements + counted.batches + 2 * counted.transactions) / per
            print(f"\nper run on PostgreSQL: {counted.statements / per:.1f} statements, "
                  f"{counted.batches / per:.1f} executemany batches, "
                  f"{counted.transactions / per:.1f} transactions (~{trips:.0f} round trips), "
                  f"{counted.bytes / per:,.0f} bytes of SQL and parameters")
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
