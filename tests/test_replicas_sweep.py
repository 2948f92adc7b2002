"""What replicas leave behind (bot/storage/claims.py): bounded claims that skip the
backlog of held sessions, replies of dead replicas taken over once each (and not sent
again when their owner died sending them), leases handed over at shutdown, and replica
ids that survive PostgreSQL's 63-byte names."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.storage.claims import REPLICA_ID_MAX, Claims, TakenReply, fit_replica_id, listen
from bot.storage.control import APPLICATION, open_control
from bot.storage.inbox import Inbox
from bot.storage.leader import replica_id
from bot.storage.sessions import SessionStore

LEASE = 30.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SessionStore]:
    opened = await SessionStore.open(database_url)
    yield opened  # closed after the test, if it passed or failed
    await opened.close()


def _claims(store: SessionStore, owner: str, clock: list[float]) -> Claims:
    return Claims(store.db, store.lock, owner, lease_seconds=LEASE, clock=lambda: clock[0])


async def _record(inbox: Inbox, key: str, n: int) -> int:
    entry = await inbox.add(InboundMessage("telegram", key, "direct", "u", f"m{n}",
                                           event_id=f"{key}:{n}"), key)
    assert entry is not None
    return entry.id


# -- bounded claims ---------------------------------------------------------------------


async def test_a_claim_reads_at_most_its_bound_and_never_the_backlog_of_held_sessions(
        store: SessionStore) -> None:
    clock = [time.time()]
    inbox = Inbox(store.db, store.lock, store.writer)
    a, b = _claims(store, "A", clock), _claims(store, "B", clock)
    busy = [await _record(inbox, "busy", n) for n in range(120)]  # the oldest entries
    [held] = await b.claim(limit=10, per_session=50)
    assert (held.session_key, held.entry_ids, held.complete) == ("busy", tuple(busy[:50]), False)
    keys = [f"s{n:03}" for n in range(70)]
    for key in keys:
        await _record(inbox, key, 0)

    rounds = []
    while claimed := await a.claim(limit=30):
        assert len(claimed) <= 30 and all(len(c.entry_ids) == 1 and c.complete
                                         for c in claimed)
        rounds.append([c.session_key for c in claimed])
    # The free sessions in order of their first entry, 30 at a time; B's backlog (and
    # A's own held sessions) never take a place in the read.
    assert rounds == [keys[:30], keys[30:60], keys[60:]]
    # The holder reads its session again when asked to, still bounded.
    [again] = await b.claim(limit=10, mine=["busy"])
    assert again.entry_ids == tuple(busy[:50]) and not again.complete
    # A release gives the next entries of a backlog, at most per_session of them.
    assert await b.release("busy", per_session=40) == tuple(busy[:40])


# -- replies of dead replicas --------------------------------------------------------------


async def _reply(inbox: Inbox, text: str, draft: str | None = None) -> int:
    outbox_id: int = await inbox.writer.write(
        inbox.finish([], OutboundMessage("telegram", "c1", text), draft))
    return outbox_id


async def test_replies_of_a_dead_replica_are_taken_over_and_not_resent_once_tried(
        store: SessionStore) -> None:
    clock = [time.time()]
    a, b = _claims(store, "A", clock), _claims(store, "B", clock)
    inbox_b = Inbox(store.db, store.lock, store.writer)
    inbox_b.owner = "B"
    await a.renew(())
    await b.renew(())
    failed = await _reply(inbox_b, "platform said 500")  # sent, refused: B retries later
    inbox_b.not_delivered(failed, final=False)
    sending = await _reply(inbox_b, "under way when B died")
    await inbox_b.sending(sending)  # B was handing it to the platform
    unsent = await _reply(inbox_b, "committed, B died before sending it")
    draft = await _reply(inbox_b, "finishing a draft", draft="d7")
    delivered = await _reply(inbox_b, "shown")
    inbox_b.delivered(delivered, "p1")
    legacy = await _reply(Inbox(store.db, store.lock, store.writer), "from one process")

    assert await a.take_replies() == [
        TakenReply(legacy, _encoded("from one process"), None, 0, True)]  # no owner
    clock[0] += 2 * LEASE + 1  # B stopped renewing; A goes on
    await a.renew(())
    taken = await a.take_replies()
    assert [(t.id, t.send) for t in taken] == [
        (failed, True), (sending, False), (unsent, True), (draft, True)]
    assert taken[3].draft_id == "d7"
    rows = dict(await store.db.execute_fetchall(
        "SELECT id, owner || ':' || state || ':' || sending FROM outbox"))
    # Taken replies wait unmarked until A itself hands them to the platform.
    assert rows == {failed: "A:pending:0", sending: "A:failed:0", unsent: "A:pending:0",
                    draft: "A:pending:0", delivered: "B:delivered:0", legacy: "A:pending:0"}
    # A is alive: nobody takes them from it, A included.
    assert await b.take_replies() == [] and await a.take_replies() == []
    # B's heartbeat, expired a whole lease ago, is gone.
    assert [r[0] for r in await store.db.execute_fetchall("SELECT id FROM replicas")] == ["A"]


def _encoded(text: str) -> str:
    from bot.storage.inbox import encode_outbound
    return encode_outbound(OutboundMessage("telegram", "c1", text))


async def test_two_live_replicas_never_take_the_same_reply(pg_url: str) -> None:
    stores = [await SessionStore.open(pg_url, pool_size=3) for _ in range(3)]
    try:
        clock = [time.time()]
        dead = Inbox(stores[0].db, stores[0].lock, stores[0].writer)
        dead.owner = "dead"
        ids = [await _reply(dead, f"r{n}") for n in range(120)]
        takers = [_claims(s, name, clock) for s, name in zip(stores[1:], "AB", strict=True)]
        for taker in takers:
            await taker.renew(())

        async def sweep(claims: Claims) -> list[int]:
            got: list[int] = []
            while taken := await claims.take_replies(limit=7):
                got += [t.id for t in taken]
                await asyncio.sleep(0)
            return got

        got_a, got_b = await asyncio.gather(*(sweep(t) for t in takers))
        assert sorted(got_a + got_b) == ids  # each taken once
        assert got_a and got_b  # both took part
    finally:
        for s in stores:
            await s.close()


# -- hand-over ---------------------------------------------------------------------------


async def test_a_hand_over_frees_the_leases_and_wakes_the_others(pg_url: str) -> None:
    stores = [await SessionStore.open(pg_url, pool_size=3) for _ in range(2)]
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = await listen(stores[1].db, woken.put_nowait)
    try:
        clock = [time.time()]
        inbox = Inbox(stores[0].db, stores[0].lock, stores[0].writer)
        a, b = _claims(stores[0], "A", clock), _claims(stores[1], "B", clock)
        await a.renew(())
        await _record(inbox, "k1", 0)
        assert [c.session_key for c in await a.claim()] == ["k1"]
        assert await b.claim() == []  # A holds it, for a whole lease
        assert await a.hand_over() == 1

        async def anything_free() -> None:
            # k1's own notice (from recording it) may arrive late, before or after this.
            while await woken.get() != "":
                pass

        await asyncio.wait_for(anything_free(), 30)  # "anything may be free"
        assert [c.session_key for c in await b.claim()] == ["k1"]  # before the lease ends
        assert list(await stores[1].db.execute_fetchall("SELECT id FROM replicas")) == []
    finally:
        assert listener is not None
        await listener.close()
        for s in stores:
            await s.close()


# -- replica ids --------------------------------------------------------------------------


def test_replica_ids_fit_in_postgres_names_and_stay_unique() -> None:
    short = replica_id()
    assert fit_replica_id(short) == short or len(short) > REPLICA_ID_MAX
    pod = "roost-deployment-with-a-rather-long-name-that-goes-on-7d9f8b6c4-x2k9p"
    first, second = (fit_replica_id(f"{pod}-{os.getpid()}-{tail}") for tail in ("a1b2c3",
                                                                               "d4e5f6"))
    for fitted in (first, second):
        assert len(fitted) <= REPLICA_ID_MAX and len(APPLICATION + fitted) <= 63
        assert fitted.startswith("roost-deploy") and "x2k9p" in fitted  # both ends readable
    assert first.endswith(f"-{os.getpid()}-a1b2c3") and first != second
    assert fit_replica_id("hôte-éphémère-12-abcdef").isascii()
    assert fit_replica_id("x" * 200) != fit_replica_id("x" * 199 + "y")


async def test_a_replica_with_a_long_host_name_finds_itself_among_the_replicas(
        pg_url: str) -> None:
    store = await SessionStore.open(pg_url, pool_size=2)
    replica = fit_replica_id("a-very-long-kubernetes-pod-name-" * 3 + f"-{os.getpid()}-0a0b0c")

    def no_stop(command: str, key: str) -> tuple[int, int]:
        return 0, 0

    async def no_reload(what: str, name: str) -> None:
        return None

    control = await open_control(store.db, replica, no_stop, no_reload)
    try:
        names: Any = await store.db.execute_fetchall(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE ?",
            (APPLICATION + "%",))
        # Whole, so the replica tells itself from the others when it counts them.
        assert [r[0] for r in names] == [APPLICATION + replica]
    finally:
        assert control is not None
        await control.close()
        await store.close()
