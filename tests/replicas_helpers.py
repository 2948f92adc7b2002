"""``roost run`` replicas on one PostgreSQL behind Telegram webhooks, under load.

Shared by ``tests/test_replicas_load.py`` (a small load, within the CI's CPU budget) and
``bench/bench_replicas.py`` (the issue's 50 chats x 20 messages, and throughput):
starting and stopping the replicas, the load itself (:func:`run_load`, which checks
that every message was answered exactly once and in order per chat) and the CPU the
PostgreSQL server spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg  # type: ignore[import-untyped]
import psutil  # type: ignore[import-untyped]

from bot.testing.postgres import PostgresCluster
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram.wire import user
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env
from tests.test_replicas_dispatch import _via
from tests.test_run_all_channels import free_port

SECRET = "s3cret"
"""The webhook secret every replica checks (required on PostgreSQL in webhook mode)."""


@dataclass
class Replica:
    """One ``roost run`` and the log lines read from it (a full pipe would block it)."""

    name: str
    url: str
    proc: RoostProcess
    log: list[bytes] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.log.append(line)

    def tail(self, lines: int = 30) -> str:
        """The end of its log (for failures)."""
        return b"".join(self.log[-lines:]).decode(errors="replace")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far."""
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)


async def start_replicas(root: Path, database_url: str, fake: FakeTelegram, count: int, *,
                         lease: float = 3, started: list[Replica] | None = None,
                         ) -> list[Replica]:
    """``count`` replicas in webhook mode on ``database_url``, each on a port of its own,
    answering ``re:<text>`` at once (scripted model, no streaming); returns once all are
    ready. Roost's own Telegram send limits are off: the fake enforces none, and 1 message/s
    per chat would measure nothing but the limiter. Each is also appended to ``started`` as
    soon as it is spawned (for a cleanup that must not depend on this call returning)."""
    script = await asyncio.to_thread(_echo_script, root)
    base = dict(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script),
                ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
                ROOST_DATABASE_URL=database_url, ROOST_TELEGRAM_WEBHOOK_SECRET=SECRET,
                ROOST_LEASE_SECONDS=str(lease), ROOST_TELEGRAM_RATE_LIMITS="false",
                TELEGRAM_BOT_TOKEN=fake.token, TELEGRAM_API_BASE=fake.base_url)
    replicas = []
    try:
        for k in range(count):
            port = free_port()
            url = f"http://127.0.0.1:{port}/telegram"
            proc = await start_roost(root / f"r{k}", clean_env(
                **base, ROOST_TELEGRAM_WEBHOOK_URL=url, ROOST_TELEGRAM_WEBHOOK_PORT=str(port)))
            replicas.append(Replica(f"r{k}", url, proc))
            if started is not None:
                started.append(replicas[-1])
        for replica in replicas:
            replica.log += await until_logged(replica.proc, b"roost ready")
            replica.reader = asyncio.ensure_future(replica._read())
    except BaseException:
        await close_replicas(replicas)
        raise
    return replicas


def _echo_script(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "script.yaml"
    script.write_text("turns:\n  - reply: 're:{message}'\nloop: true\n")
    return script


async def stop_replicas(replicas: list[Replica]) -> None:
    """SIGTERM every replica still running; each must exit with 0 within 30 s."""
    running = [r for r in replicas if r.proc.returncode is None]
    for replica in running:
        replica.proc.send_signal(signal.SIGTERM)
    for replica in running:
        async with asyncio.timeout(30):
            code = await replica.proc.wait()
        assert code == 0, f"{replica.name} exited with {code}:\n{replica.tail()}"


async def close_replicas(replicas: list[Replica]) -> None:
    """Kill whatever is still running and finish reading the logs (cleanup)."""
    for replica in replicas:
        if replica.proc.returncode is None:
            replica.proc.kill()
            await replica.proc.wait()
        if replica.reader is not None:
            await replica.reader


def postgres_cpu(cluster: PostgresCluster) -> float:
    """CPU seconds the server spent so far: the postmaster, its ended backends (reaped into
    its children's times) and the live ones."""
    pid = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # u/s, cu/cs
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system
    return float(total)


class Replies:
    """``sendMessage`` calls per chat as they reach the fake, each counted once (a check
    that rescans every call on every wake-up costs seconds of CPU at this size)."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake
        self.read = 0
        self.per_chat: Counter[int] = Counter()

    def count(self, chat: int) -> int:
        """Replies that reached ``chat`` so far."""
        self._update()
        return self.per_chat[chat]

    def total(self) -> int:
        """Replies that reached any chat so far."""
        self._update()
        return self.per_chat.total()

    def _update(self) -> None:
        calls = self.fake.calls
        for call in calls[self.read:]:
            if call.method == "sendMessage":
                self.per_chat[int(call.params["chat_id"])] += 1
        self.read = len(calls)


@dataclass
class LoadResult:
    """What :func:`run_load` saw besides the replies being right."""

    killed: str | None = None
    """The replica killed halfway."""
    due: dict[int, int] = field(default_factory=dict)
    """Its chats with messages acknowledged and not yet answered at its death (it held
    their leases): how many that chat had acknowledged."""
    takeover: float | None = None
    """Seconds from the kill until every one of those was answered."""
    twice: int = 0
    """Updates also posted to a second replica."""
    spared: int = 0
    """Kills put off because the replica had committed a reply it had not sent yet."""


class _Load:
    """The chats' senders: one update at a time through the fake's webhook (as Telegram
    sends by default), each chat's next message only after its previous one was
    acknowledged with a 2xx (the platform contract); some updates also to another replica."""

    def __init__(self, fake: FakeTelegram, replicas: list[Replica], http: aiohttp.ClientSession,
                 database_url: str, *, per_chat: int, twice: float, kill_at: int | None,
                 spare_unsent: bool, limit: float, seed: int) -> None:
        self.fake = fake
        self.live = list(replicas)
        self.http = http
        self.database_url = database_url
        self.per_chat = per_chat
        self.twice = twice
        self.kill_at = kill_at
        self.spare_unsent = spare_unsent
        self.limit = limit
        self.rng = random.Random(seed)
        self.turn = asyncio.Lock()  # the fake has one webhook URL: it is set per update
        self.acked: Counter[int] = Counter()
        self.sent = 0
        self.result = LoadResult()
        self.takeover: asyncio.Task[None] | None = None
        self.pg: Any = None
        """A connection to read the leases (opened before the load: at the kill it must be
        quick, or the replica's runs are over)."""

    async def chat(self, chat: int) -> None:
        sender = user(chat, f"U{chat}")
        for n in range(self.per_chat):
            async with self.turn:
                to = self.rng.choice(self.live)
                update = await _via(self.fake, to.url, f"m{n}", sender)
                if len(self.live) > 1 and self.rng.random() < self.twice:
                    other = self.rng.choice([r for r in self.live if r is not to])
                    async with self.http.post(other.url, data=json.dumps(update), headers={
                            "Content-Type": "application/json",
                            "X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp:
                        assert resp.status == 200, f"{other.name} answered {resp.status}"
                    self.result.twice += 1
                self.acked[chat] += 1
                self.sent += 1
                if self.kill_at is not None and self.result.killed is None \
                        and self.sent >= self.kill_at:
                    await self._kill_busiest()

    async def _kill_busiest(self) -> None:
        """SIGKILL the replica holding the most chats with acknowledged, unanswered messages,
        between two deliveries (no update is in flight to it); if none holds one, try again
        after the next delivery."""
        assert self.pg is not None
        rows = await self.pg.fetch("SELECT session_key, owner FROM session_leases"
                                   " WHERE expires_at > $1", time.time())
        replies = Replies(self.fake)
        held: dict[str, set[int]] = defaultdict(set)  # owner -> chats with unanswered ones
        for row in rows:
            chat = int(str(row["session_key"]).rsplit(":", 1)[1])
            if replies.count(chat) < self.acked[chat]:
                held[str(row["owner"])].add(chat)
        if not held:
            return
        owner, chats = max(held.items(), key=lambda kv: len(kv[1]))
        pid = owner.rsplit("-", 2)[-2]  # hostname-pid-random
        victim = next(r for r in self.live if str(r.proc.pid) == pid)
        if self.spare_unsent:
            victim.proc.send_signal(signal.SIGSTOP)  # frozen: its outbox cannot change now
            if await self.pg.fetchval("SELECT count(*) FROM outbox WHERE owner = $1"
                                      " AND state = 'pending' AND sending = 1", owner):
                victim.proc.send_signal(signal.SIGCONT)
                self.result.spared += 1
                return
        victim.proc.kill()
        killed_at = time.perf_counter()
        self.live.remove(victim)
        due = {chat: self.acked[chat] for chat in chats}
        self.result.killed, self.result.due = victim.name, due

        async def answered() -> None:
            await self.fake.wait_until(
                lambda: all(replies.count(c) >= k for c, k in due.items()), limit=self.limit)
            self.result.takeover = time.perf_counter() - killed_at

        self.takeover = asyncio.ensure_future(answered())


async def run_load(fake: FakeTelegram, replicas: list[Replica], database_url: str, *,
                   chats: int, per_chat: int, kill: bool, lease: float = 3,
                   twice: float = 0.3, spare_unsent: bool = False,
                   seed: int = 19) -> LoadResult:
    """``chats`` private chats send ``per_chat`` messages each, all chats at once, to random
    replicas (a share ``twice`` of them to a second one as well). With ``kill``, after half
    the messages, the replica holding the most chats with unanswered messages is killed
    with SIGKILL, and those messages must be answered within ``lease`` + 30 s.
    ``spare_unsent`` puts the kill off (to the next delivery) while that replica is
    handing a reply to the platform (marked ``sending``, not yet recorded as sent): one it
    dies sending is never sent again (at most once, ``bot/storage/claims.py``). A reply
    committed and not yet being sent is killed over on purpose: another replica sends it.

    Then the replicas left are stopped (exit code 0) and every chat must have been answered
    exactly once per message, in order; an :class:`AssertionError` says which chats were
    not (with the end of each replica's log).
    """
    async with aiohttp.ClientSession() as http:
        load = _Load(fake, replicas, http, database_url, per_chat=per_chat, twice=twice,
                     kill_at=chats * per_chat // 2 if kill else None,
                     spare_unsent=spare_unsent, limit=lease + 30, seed=seed)
        ids = [1000 + i for i in range(chats)]
        if kill:
            load.pg = await asyncpg.connect(database_url)
        try:
            await asyncio.gather(*(load.chat(c) for c in ids))
        finally:
            if load.pg is not None:
                await load.pg.close()
    result = load.result
    if kill:
        assert load.takeover is not None, \
            "after halfway, no replica ever held a chat with unanswered messages"
        await load.takeover
    replies = Replies(fake)
    with contextlib.suppress(AssertionError):  # the per-chat comparison below says what
        await fake.wait_until(lambda: replies.total() >= chats * per_chat, limit=60)
    await stop_replicas(load.live)
    expected = [f"re:m{n}" for n in range(per_chat)]
    wrong = {c: fake.sent_texts(c) for c in ids if fake.sent_texts(c) != expected}
    assert not wrong, (f"chats not answered exactly once in order: {wrong}; killed "
                       f"{result.killed} holding {result.due}\n"
                       + "\n".join(f"--- {r.name}\n{r.tail()}" for r in replicas))
    assert len(fake.sent_texts()) == chats * per_chat
    if kill:
        assert result.takeover is not None
    return result
