"""The Control UI's session, run and error pages on a large store (uisessions' own check;
the official page-time bench is uibrowser's).

Seeds an SQLite store (``tests/ui_sessions_seed.py``; by default 10,000 sessions,
1,000,000 messages, 100,000 runs, 10,000 errors; kept in ``--db`` for the next
run), starts a Roost app on it with the HTTP server, and times each page over
HTTP as the server saw it (request received to response written, from the
``Server-Timing``-free measure of the aiohttp client on loopback, minus nothing):
p50 and p95 of ``--rounds`` requests per page::

    .venv/bin/python bench/bench_ui_sessions.py --db /tmp/ui-bench.db
    .venv/bin/python bench/bench_ui_sessions.py --queries   # the query layer first
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.storage.sessions import SessionStore
from bot.ui.queries import errors as eq
from bot.ui.queries import runs as rq
from bot.ui.queries import sessions as sq
from tests.ui_sessions_seed import seed


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


async def seeded(path: Path, sessions: int, messages: int, runs: int, errors: int) -> None:
    store = await SessionStore.open(path)
    try:
        t0 = time.perf_counter()
        await seed(store.db, store.lock, sessions=sessions, messages=messages, runs=runs,
                   errors=errors)
        await store.db.execute("ANALYZE")
        print(f"seeded {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        await store.close()


async def timed(name: str, rounds: int, op: Callable[[], Awaitable[object]]) -> None:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await op()
        times.append((time.perf_counter() - t0) * 1000)
    print(f"{name:<34} p50 {statistics.median(times):7.2f} ms   p95 "
          f"{percentile(times, 95):7.2f} ms", flush=True)


async def queries(path: Path | str, rounds: int) -> None:
    store = await SessionStore.open(path)
    try:
        first = await sq.list_sessions(store)
        assert first.before is not None
        sid = first.rows[0].id
        page = await sq.transcript(store, sid)
        run_id = page.messages[-1].run_id
        some_run = (await sq.runs_of(store, first.rows[0].key))[0].id
        err = (await eq.list_errors(store)).rows[0].id
        await timed("sessions list", rounds, lambda: sq.list_sessions(store))
        await timed("sessions list, page 50", rounds,
                    lambda: sq.list_sessions(store, before=first.before))
        await timed("sessions by agent+channel", rounds, lambda: sq.list_sessions(
            store, sq.SessionFilter(agent="support", channel="slack")))
        await timed("sessions by user", rounds,
                    lambda: sq.list_sessions(store, sq.SessionFilter(user="u17_17")))
        await timed("search, common word", rounds,
                    lambda: sq.search(store, sq.SessionFilter(text="invoice")))
        await timed("search, rare word", rounds,
                    lambda: sq.search(store, sq.SessionFilter(text="zanzibarquux")))
        await timed("search, two words + agent", rounds, lambda: sq.search(
            store, sq.SessionFilter(text="invoice refund", agent="support")))
        await timed("session detail+transcript+runs", rounds, lambda: asyncio.gather(
            sq.session_detail(store, sid), sq.transcript(store, sid),
            sq.runs_of(store, first.rows[0].key, [run_id])))
        await timed("live poll (newest message id)", rounds,
                    lambda: sq.newest_message_id(store, sid))
        await timed("run trace", rounds, lambda: rq.run_trace(store, some_run))
        await timed("errors list", rounds, lambda: eq.list_errors(store))
        await timed("errors by kind", rounds,
                    lambda: eq.list_errors(store, eq.ErrorFilter(kind="timeout")))
        await timed("errors by user", rounds,
                    lambda: eq.list_errors(store, eq.ErrorFilter(user="u17_17")))
        await timed("error detail", rounds, lambda: eq.error_detail(store, err))
    finally:
        await store.close()


async def pages(path: Path, rounds: int) -> None:
    import aiohttp

    from bot.contracts.llm import ChatMessage
    from bot.testing.app import create_app, scripted
    from bot.testing.ui import serve_ui

    data = path.parent / (path.stem + "-data")
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=data,
                              database_url=f"sqlite:///{path}")
    try:
        server = await serve_ui(app)  # no account, loopback: the local admin
        store = app.store
        first = await sq.list_sessions(store)
        newest = first.rows[0]
        run_id = (await sq.runs_of(store, newest.key))[0].id
        err = (await eq.list_errors(store)).rows[0].id
        paths = {
            "/ui/sessions": "/ui/sessions",
            "/ui/sessions page 2": f"/ui/sessions?before={first.before}",
            "/ui/sessions agent+channel": "/ui/sessions?agent=support&channel=slack",
            "/ui/sessions user": "/ui/sessions?user=u17_17",
            "/ui/sessions?q= common": "/ui/sessions?q=invoice",
            "/ui/sessions?q= rare": "/ui/sessions?q=zanzibarquux",
            "/ui/sessions/<id>": f"/ui/sessions/{newest.id}",
            "/ui/runs/<id>": f"/ui/runs/{run_id}",
            "/ui/errors": "/ui/errors",
            "/ui/errors kind": "/ui/errors?kind=timeout",
            "/ui/errors user": "/ui/errors?user=u17_17",
            "/ui/errors/<id>": f"/ui/errors/{err}",
        }
        async with aiohttp.ClientSession() as client:
            for name, target in paths.items():
                async with client.get(server.url + target) as response:
                    assert response.status == 200, (target, response.status)
                    await response.read()

                async def get(target: str = target) -> None:
                    async with client.get(server.url + target) as response:
                        await response.read()

                await timed(name, rounds, get)
            # Live: a run's messages stored, until the transcript's stream shows them.
            session = await store.get(newest.key)
            latencies = []
            for n in range(5):
                after = await sq.newest_message_id(store, newest.id)
                async with client.get(
                        f"{server.url}/ui/sessions/{newest.id}/events?after={after}") as stream:
                    await asyncio.sleep(0.3 + n * 0.1)
                    t0 = time.perf_counter()
                    await store.append_run(session, f"live{n}", [
                        ChatMessage("user", f"live {n}", sender_id="u")])
                    async for line in stream.content:
                        if line.startswith(b"event: messages"):
                            latencies.append((time.perf_counter() - t0) * 1000)
                            break
            print(f"live message shown after (ms): {', '.join(f'{x:.0f}' for x in latencies)}")
    finally:
        await app.close()


async def postgres(args: argparse.Namespace) -> None:
    """Seed a throw-away PostgreSQL server (``bot.testing.postgres``) and time the queries."""
    from bot.testing.postgres import PostgresCluster

    cluster = PostgresCluster(in_ram=False).start()
    try:
        url = await cluster.create_database()
        store = await SessionStore.open(url)
        try:
            t0 = time.perf_counter()
            await seed(store.db, store.lock, sessions=args.sessions, messages=args.messages,
                       runs=args.runs, errors=args.errors)
            await store.db.execute("ANALYZE")
            print(f"seeded PostgreSQL in {time.perf_counter() - t0:.0f} s", flush=True)
        finally:
            await store.close()
        await queries(url, args.rounds)
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=Path("/tmp/roost-ui-sessions-bench.db"))
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--errors", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--queries", action="store_true", help="time the query layer too")
    parser.add_argument("--postgres", action="store_true",
                        help="time the query layer on a seeded PostgreSQL instead")
    args = parser.parse_args()
    if args.postgres:
        asyncio.run(postgres(args))
        return
    if not args.db.exists():
        asyncio.run(seeded(args.db, args.sessions, args.messages, args.runs, args.errors))
    if args.queries:
        asyncio.run(queries(args.db, args.rounds))
    asyncio.run(pages(args.db, args.rounds))


if __name__ == "__main__":
    main()
