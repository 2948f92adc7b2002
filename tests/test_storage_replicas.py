"""Replicas sharing one PostgreSQL inbox (bot/storage/claims.py): each message committed
once, in order per session, whichever replica received it; a dead replica's sessions
taken over once its leases expire; idle replicas woken by NOTIFY."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from bot.contracts.messages import InboundMessage
from bot.storage.claims import Claims, LeaseLost, Listener, listen
from bot.storage.db import Statements
from bot.storage.inbox import Inbox
from bot.storage.sessions import SessionStore

LEASE = 30.0


@dataclass
class Replica:
    """One process's view: its own pool, inbox and leases, woken by its own LISTEN."""

    name: str
    store: SessionStore
    inbox: Inbox
    claims: Claims
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    listener: Listener | None = None
    committed: list[int] = field(default_factory=list)
    """Inbox entry ids this replica committed, in order."""
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)
    """Shared by the replicas of a test: notified at every commit."""
    everyone: list[int] = field(default_factory=list)
    """Shared too: every replica's commits in the order they happened."""


def _both(first: Statements, second: Statements) -> Statements:
    async def body(db: object) -> None:
        await first(db)  # type: ignore[arg-type]
        await second(db)  # type: ignore[arg-type]
    return body  # type: ignore[return-value]


async def _open(url: str, name: str, clock: list[float],
                progress: asyncio.Condition, everyone: list[int]) -> Replica:
    store = await SessionStore.open(url, pool_size=3)
    replica = Replica(name, store, Inbox(store.db, store.lock, store.writer),
                      Claims(store.db, store.lock, name, lease_seconds=LEASE,
                             clock=lambda: clock[0]), progress=progress, everyone=everyone)
    replica.listener = await listen(store.db, lambda key: replica.wake.set())
    return replica


@pytest.fixture
async def clock() -> list[float]:
    return [1_000_000.0]


@pytest.fixture
async def replicas(pg_url: str, clock: list[float]) -> AsyncIterator[list[Replica]]:
    progress, everyone = asyncio.Condition(), []
    pair = [await _open(pg_url, name, clock, progress, everyone) for name in ("A", "B")]
    try:
        yield pair
    finally:
        for replica in pair:
            if replica.listener is not None:
                await replica.listener.close()
            with contextlib.suppress(Exception):
                await replica.store.close()


async def _work(replica: Replica, hang_after: int | None = None) -> None:
    """Claim, run (commit with the lease check) and release, until cancelled."""
    while True:
        await replica.wake.wait()
        replica.wake.clear()
        while claimed := await replica.claims.claim():
            for session in claimed:
                pending = list(session.entry_ids)
                while pending:
                    for entry_id in pending:
                        if hang_after is not None and len(replica.committed) >= hang_after:
                            await asyncio.Event().wait()  # stalls (then killed) holding leases
                        try:
                            await replica.store.writer.write(_both(
                                replica.inbox.finish([entry_id], None),
                                replica.claims.lease_check(session.session_key)))
                        except LeaseLost:
                            pending = []
                            break
                        replica.committed.append(entry_id)
                        replica.everyone.append(entry_id)
                        async with replica.progress:
                            replica.progress.notify_all()
                    else:
                        pending = list(await replica.claims.release(session.session_key))


async def _until(replicas: list[Replica], count: int) -> None:
    """Wait until the replicas committed ``count`` entries in all."""
    progress = replicas[0].progress
    async with progress:
        await asyncio.wait_for(progress.wait_for(
            lambda: sum(len(r.committed) for r in replicas) >= count), 60)


async def _deliver(replicas: list[Replica], sessions: int, per_session: int,
                   seq_of: dict[int, tuple[str, int]], rng: random.Random) -> None:
    """Every message to a random replica, some also to the other (a redelivery)."""
    for seq in range(per_session):
        for s in range(sessions):
            message = InboundMessage("telegram", f"c{s}", "direct", f"u{s}", f"{seq}",
                                     event_id=f"{s}-{seq}")
            first, other = rng.sample(replicas, 2)
            entry = await first.inbox.add(message, f"k{s}")
            assert entry is not None
            seq_of[entry.id] = (f"k{s}", seq)
            if rng.random() < 0.3:
                assert await other.inbox.add(message, f"k{s}") is None


async def test_two_replicas_commit_every_message_once_in_order(
        replicas: list[Replica]) -> None:
    seq_of: dict[int, tuple[str, int]] = {}
    workers = [asyncio.ensure_future(_work(r)) for r in replicas]
    try:
        await _deliver(replicas, 20, 10, seq_of, random.Random(7))
        await _until(replicas, 200)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    committed = [seq_of[i] for i in replicas[0].committed + replicas[1].committed]
    assert sorted(committed) == sorted(seq_of.values())  # each exactly once
    for key in {k for k, _ in committed}:
        # In order per session, across replicas (a session has one holder at a time).
        seqs = [seq_of[i][1] for i in replicas[0].everyone if seq_of[i][0] == key]
        assert seqs == list(range(10))
    assert replicas[0].committed and replicas[1].committed  # both did work
    assert await replicas[0].inbox.unfinished() == []


async def test_a_dead_replicas_sessions_are_taken_over_after_the_lease(
        replicas: list[Replica], clock: list[float]) -> None:
    a, b = replicas
    seq_of: dict[int, tuple[str, int]] = {}
    await _deliver([b, b], 5, 4, seq_of, random.Random(1))  # all received by B
    b.wake.set()
    dead = asyncio.ensure_future(_work(b, hang_after=3))
    await _until([b], 3)
    held = await a.claims.holders()
    assert held and set(held.values()) == {"B"}
    # While B's leases are live, A takes none of its sessions.
    assert await a.claims.claim() == []
    dead.cancel()  # B dies: no release, no renewal
    await asyncio.gather(dead, return_exceptions=True)

    clock[0] += LEASE + 1
    worker = asyncio.ensure_future(_work(a))
    a.wake.set()
    try:
        await _until([a, b], 20)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    assert sorted(a.committed + b.committed) == sorted(seq_of)
    assert await a.inbox.unfinished() == []


async def test_a_stalled_replica_cannot_commit_after_its_lease_was_taken(
        replicas: list[Replica], clock: list[float]) -> None:
    a, b = replicas
    entry = await b.inbox.add(InboundMessage("telegram", "c", "direct", "u", "hi",
                                             event_id="1"), "k")
    assert entry is not None
    assert [c.session_key for c in await b.claims.claim()] == ["k"]
    clock[0] += LEASE + 1
    assert [c.entry_ids for c in await a.claims.claim()] == [(entry.id,)]
    with pytest.raises(LeaseLost):
        await b.store.writer.write(_both(b.inbox.finish([entry.id], None),
                                         b.claims.lease_check("k")))
    assert [e.id for e in await a.inbox.unfinished()] == [entry.id]  # nothing recorded
    await a.store.writer.write(_both(a.inbox.finish([entry.id], None),
                                     a.claims.lease_check("k")))
    assert await a.claims.release("k") == ()
    assert await a.claims.holders() == {}


async def test_an_idle_replica_is_woken_by_another_replicas_insert(
        replicas: list[Replica]) -> None:
    a, b = replicas
    b.wake.clear()
    await a.inbox.add(InboundMessage("telegram", "c", "direct", "u", "hi", event_id="9"), "k9")
    await asyncio.wait_for(b.wake.wait(), 10)
    assert [c.session_key for c in await b.claims.claim()] == ["k9"]
