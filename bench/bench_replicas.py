"""Replicas: ``roost run`` x 1, 2 and 3 on one PostgreSQL behind Telegram webhooks.

Run with ``.venv/bin/python bench/bench_replicas.py`` (about 2-3 minutes on 2 cores;
needs the PostgreSQL server binaries, as the tests do; ``--only throughput|trips|check``
runs one part). Every replica answers at once (scripted model, no streaming, Roost's own
Telegram send limits off: the fake enforces none).

* **throughput**: for 1, 2 and 3 replicas, ``ROUNDS`` rounds each (a fresh database and
  fresh processes every round): ``CHATS`` chats in closed loops, each posting its next
  update to a random replica once the previous one was answered, ``PER_CHAT`` messages
  each. Updates are POSTed by the bench itself, several at once (Telegram opens up to 40
  webhook connections; the fake's own webhook sends one at a time). Reported: replies/s,
  latency (POST to ``sendMessage`` at the fake) p50/p99 and the CPU per reply of the
  replicas, the PostgreSQL server and this process (fake Bot API and load) - the three
  share the machine's cores. Each round checks every chat got each answer once, in order.
* **trips**: the database work of one run, counted at the adapter (as in
  ``bench_storage.py``) with the apps in this process: one app, and two apps on one
  database with each message delivered to one of them at random (leases change hands).
* **check**: the load of ``tests/test_replicas_load.py`` at the issue's size, 50 chats x
  20 messages through the fake's webhook with ~30 % of updates also posted to a second
  replica: two replicas, then three with the busiest killed with SIGKILL halfway. Exits
  with status 1 and the chats that went wrong unless every message was answered exactly
  once and in order.

Figures are medians of the rounds. The local server runs with ``fsync=off`` (as in the
tests); the load average is printed with them (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table, progress
from bench.bench_storage import Counted
from bot.contracts.messages import InboundMessage
from bot.storage import postgres as pgmod
from bot.testing.app import ChatChannel, create_app, scripted
from bot.testing.postgres import PostgresCluster
from bot.testing.telegram import Call, FakeTelegram, user
from tests.replicas_helpers import (
    SECRET,
    Replica,
    close_replicas,
    postgres_cpu,
    run_load,
    start_replicas,
    stop_replicas,
)

ROUNDS = 3
CHATS = 50
PER_CHAT = 20
WARM = 3
"""Messages each replica answers before the timed part (first imports, caches)."""
TRIP_RUNS = 200


# -- throughput ---------------------------------------------------------------------------


@dataclass
class Round:
    """One timed round: the rate, latencies and CPU seconds per reply by process group."""

    rate: float
    latencies: list[float]
    cpu: dict[str, float] = field(default_factory=dict)


class Answers:
    """What the fake Bot API sent to each chat, and a waiter per chat for its next reply."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.texts: dict[int, list[str]] = defaultdict(list)
        self.waiters: dict[int, asyncio.Future[None]] = {}
        fake.record = False  # thousands of calls: keep only what this class keeps
        fake.on_call = self._on_call

    def _on_call(self, call: Call) -> None:
        if call.method != "sendMessage":
            return
        chat = int(call.params["chat_id"])
        self.texts[chat].append(str(call.params.get("text", "")))
        waiter = self.waiters.pop(chat, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expect(self, chat: int) -> asyncio.Future[None]:
        """A future done when ``chat``'s next reply arrives."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters[chat] = waiter
        return waiter


def _update(update_id: int, chat: int, text: str) -> bytes:
    """A private text message from ``chat``'s user, as Telegram POSTs it."""
    sender = user(chat, f"U{chat}")
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text, "from": sender,
        "chat": {"id": chat, "type": "private", "first_name": sender["first_name"]}}}).encode()


class Driver:
    """Closed loops: each chat posts to a random replica, waits for the answer, repeats."""

    def __init__(self, replicas: list[Replica], answers: Answers,
                 http: aiohttp.ClientSession, seed: int) -> None:
        self.replicas = replicas
        self.answers = answers
        self.http = http
        self.rng = random.Random(seed)
        self.ids = iter(range(1, 10**9))
        self.latencies: list[float] = []

    async def one(self, chat: int, text: str, to: Replica) -> float:
        """Post ``text`` from ``chat`` to ``to``; seconds until its answer arrived."""
        began = time.perf_counter()
        answered = self.answers.expect(chat)
        async with self.http.post(to.url, data=_update(next(self.ids), chat, text), headers={
                "Content-Type": "application/json",
                "X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp:
            if resp.status != 200:
                raise SystemExit(f"{to.name} answered the webhook with {resp.status}")
        await asyncio.wait_for(answered, 60)
        return time.perf_counter() - began

    async def loop(self, chat: int, count: int) -> None:
        for n in range(count):
            self.latencies.append(await self.one(chat, f"m{n}", self.rng.choice(self.replicas)))


def _check(texts: dict[int, list[str]], chats: Iterable[int], count: int) -> None:
    wrong = {c: texts.get(c) for c in chats if texts.get(c) != [f"re:m{n}" for n in range(count)]}
    if wrong:
        raise SystemExit(f"FAILED: not answered exactly once in order: {wrong}")


async def throughput_round(cluster: PostgresCluster, root: Path, count: int,
                           seed: int) -> Round:
    async with FakeTelegram() as fake, aiohttp.ClientSession() as http:
        replicas = await start_replicas(root, await cluster.create_database(), fake, count)
        try:
            answers = Answers(fake)
            driver = Driver(replicas, answers, http, seed)
            for k, replica in enumerate(replicas):  # warm each one up
                for n in range(WARM):
                    await driver.one(k + 1, f"m{n}", replica)
            chats = [1000 + i for i in range(CHATS)]
            me, pg = resource.getrusage(resource.RUSAGE_SELF), postgres_cpu(cluster)
            roost = sum(r.cpu_seconds() for r in replicas)
            began = time.perf_counter()
            await asyncio.gather(*(driver.loop(c, PER_CHAT) for c in chats))
            elapsed = time.perf_counter() - began
            roost = sum(r.cpu_seconds() for r in replicas) - roost
            pg = postgres_cpu(cluster) - pg
            after = resource.getrusage(resource.RUSAGE_SELF)
            replies = CHATS * PER_CHAT
            _check(answers.texts, chats, PER_CHAT)
            await stop_replicas(replicas)
        finally:
            await close_replicas(replicas)
    bench = after.ru_utime + after.ru_stime - me.ru_utime - me.ru_stime
    return Round(replies / elapsed, driver.latencies[-replies:],
                 {"roost": roost / replies, "postgres": pg / replies,
                  "bench": bench / replies})


async def throughput(cluster: PostgresCluster, root: Path) -> None:
    rows = []
    for count in (1, 2, 3):
        load = os.getloadavg()[0]
        rounds = []
        for r in range(ROUNDS):
            progress(f"throughput: {count} replica(s), round {r + 1}/{ROUNDS}")
            rounds.append(await throughput_round(cluster, root / f"t{count}-{r}", count,
                                                 seed=r))
        lat = [statistics.median(percentile(x.latencies, q) for x in rounds) for q in (50, 99)]
        cpu = {k: statistics.median(x.cpu[k] for x in rounds) * 1000 for k in rounds[0].cpu}
        rate = statistics.median(x.rate for x in rounds)
        rows.append([str(count), f"{rate:,.0f}",
                     f"{min(x.rate for x in rounds):,.0f}-{max(x.rate for x in rounds):,.0f}",
                     f"{lat[0] * 1000:.0f}", f"{lat[1] * 1000:.0f}",
                     f"{cpu['roost']:.2f}", f"{cpu['postgres']:.2f}", f"{cpu['bench']:.2f}",
                     f"{sum(cpu.values()):.2f}", f"{rate * sum(cpu.values()) / 1000:.2f}",
                     f"{load:.2f}"])
    print(f"\nreplies/s: {CHATS} chats in closed loops, {PER_CHAT} messages each, "
          f"medians of {ROUNDS} rounds; CPU in ms per reply; cores: replies/s x CPU total; "
          "load: 1-minute load average as the rounds began")
    print_table(["replicas", "replies/s", "range", "p50 ms", "p99 ms", "CPU roost",
                 "CPU postgres", "CPU fake+load", "CPU total", "cores", "load"], rows,
                numbers_right=True)


# -- round trips ---------------------------------------------------------------------------


class Tally(Counted):
    """:class:`Counted`, and the rows each kind of statement touched (INSERT, UPDATE...)."""

    def __init__(self) -> None:
        super().__init__()
        self.verbs: dict[str, int] = defaultdict(int)

    def __enter__(self) -> Tally:
        super().__enter__()
        statement, many = pgmod.PgConnection._statement, pgmod.PgConnection.executemany

        async def tallied(conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
            self.verbs[sql.split(None, 1)[0].upper()] += 1
            return await statement(conn, sql, params)

        async def tallied_many(conn: Any, sql: str, seq: Iterable[Any]) -> Any:
            rows = list(seq)
            self.verbs[sql.split(None, 1)[0].upper()] += len(rows)
            return await many(conn, sql, rows)

        pgmod.PgConnection._statement = tallied  # type: ignore[method-assign, assignment]
        pgmod.PgConnection.executemany = tallied_many  # type: ignore[method-assign, assignment]
        return self


async def trips(cluster: PostgresCluster, root: Path, apps: int) -> Tally:
    """The adapter's work over :data:`TRIP_RUNS` runs, one at a time in 20 chats, each
    message delivered to one of ``apps`` apps on one database at random."""
    url = await cluster.create_database()
    made = []
    try:
        for k in range(apps):
            app, log = await create_app(scripted({"reply": "ok"}, loop=True),
                                        data_dir=root / f"trips{apps}-{k}", database_url=url)
            made.append(app)
            await ChatChannel("test", sender="u1").attach(app, log)
            await app.recover()  # claims: LISTEN and the sweep, as in roost run
        rng = random.Random(apps)

        async def run(i: int, event: str) -> None:
            app = rng.choice(made)
            await app.dispatcher.submit(InboundMessage(
                "test", f"u{i % 20}", "direct", f"u{i % 20}", f"m{i}", event_id=event))
            for each in made:
                await each.dispatcher.drain()
                assert each.dispatcher.replicas is not None
                await each.dispatcher.replicas.releases_done()

        for i in range(20):  # every session exists before counting
            await run(i, f"w{i}")
        tally = Tally()
        with tally:
            for i in range(TRIP_RUNS):
                await run(i, f"e{i}")
            for app in made:
                await app.store.writer.close()  # what is queued is written, and counted
        return tally
    finally:
        for app in made:
            await app.close()


async def round_trips(cluster: PostgresCluster, root: Path) -> None:
    rows = []
    for apps in (1, 2):
        progress(f"round trips: {apps} app(s)")
        t = await trips(cluster, root, apps)
        per = TRIP_RUNS
        writes = sum(n for verb, n in t.verbs.items() if verb in ("INSERT", "UPDATE", "DELETE"))
        rows.append([str(apps), f"{t.statements / per:.1f}", f"{t.batches / per:.1f}",
                     f"{t.transactions / per:.1f}",
                     f"{(t.statements + t.batches + 2 * t.transactions) / per:.1f}",
                     f"{writes / per:.1f}", f"{t.bytes / per:,.0f}"])
        print(f"  {apps} app(s), statements by kind per run: "
              + ", ".join(f"{v} {n / per:.1f}" for v, n in sorted(t.verbs.items())),
              file=sys.stderr)
    print(f"\ndatabase work per run ({TRIP_RUNS} runs one at a time in 20 chats, counted at "
          "the adapter)")
    print_table(["apps", "statements", "batches", "transactions", "round trips",
                 "rows written", "bytes"], rows, numbers_right=True)


# -- the load, checked --------------------------------------------------------------


async def check(cluster: PostgresCluster, root: Path) -> None:
    print(f"\nexactly once and in order, 50 chats x {PER_CHAT} messages via the fake's webhook")
    for count, kill in ((2, False), (3, True)):
        progress(f"check: {count} replicas{', kill -9 halfway' if kill else ''}")
        async with FakeTelegram() as fake:
            url = await cluster.create_database()
            replicas = await start_replicas(root / f"check{count}", url, fake, count)
            began = time.perf_counter()
            try:
                result = await run_load(fake, replicas, url, chats=50, per_chat=PER_CHAT,
                                        kill=kill)
            except AssertionError as exc:
                raise SystemExit(f"FAILED ({count} replicas): {exc}") from None
            finally:
                await close_replicas(replicas)
        line = (f"  {count} replicas: {50 * PER_CHAT} messages answered once each, in order; "
                f"{result.twice} also posted to a second replica; "
                f"{time.perf_counter() - began:.1f} s")
        if kill:
            line += (f"; killed {result.killed} holding {len(result.due)} chats with "
                     f"unanswered messages, all answered {result.takeover:.2f} s after the kill")
        print(line)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("throughput", "trips", "check"))
    only = parser.parse_args().only
    began = time.perf_counter()
    load = os.getloadavg()
    cluster = PostgresCluster(in_ram=False).start()
    try:
        with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
            root = Path(tmp)
            if only in (None, "throughput"):
                await throughput(cluster, root)
            if only in (None, "trips"):
                await round_trips(cluster, root)
            if only in (None, "check"):
                await check(cluster, root)
    finally:
        cluster.stop()
    print(f"\nload average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{os.cpu_count()} CPUs; {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())
