"""Replicas on one PostgreSQL database: each session's messages run where its lease is.

Only on PostgreSQL (:mod:`bot.storage.claims`); on SQLite the dispatcher runs what
it receives and this module is not used. With several replicas:

* A message received by any replica is recorded in the shared inbox as
  *pending* (idempotent on the platform's id). The receiver then claims at
  once (fast path): if no live replica holds the session's lease, it takes it
  and runs the message; if it already holds it, the message joins its lane.
* Otherwise the entry stays open and the holder runs it: the insert's
  ``NOTIFY`` reaches every replica and wakes the holder, whose claim returns its
  session with the new entry (other replicas stay asleep: the receiver claims a
  session nobody holds itself). A replica whose holder died claims the session once the
  lease expired: on the next ``NOTIFY`` or the sweep every ``lease_seconds / 3``.
* Held leases are renewed by that same sweep, with the replica's heartbeat (which also
  counts the live replicas: :attr:`ReplicaWork.live` divides bot-wide send limits); a
  session's lease is released when its lane is idle (entries still open then are
  run, not abandoned).
* Replies: a replica sends the replies it commits. The sweep (and a claim that
  took a dead replica's session over, before that session's entries run) takes
  pending replies of replicas whose heartbeat expired and sends them
  (:meth:`bot.storage.claims.Claims.take_replies`; one taker per reply); one its
  dead owner was already sending is not sent again unless it replaces a draft.
  So a reply committed before a replica died goes out within about
  ``lease_seconds * 4/3`` of the death.
* Shutdown: :func:`close_quietly` (the dispatcher's close) stops claiming but
  keeps renewing while runs finish; :meth:`ReplicaWork.hand_over` then releases
  every lease and the heartbeat and wakes the others, which take the sessions and
  replies left at once instead of after the lease.
* Claims are bounded (``limit`` entries, ``PER_SESSION`` per session): a session
  with more open entries gets the rest when its lease would be released.
* A run's commit checks the lease (:meth:`bot.storage.claims.Claims.lease_check`): a replica
  that lost the lease cannot record or deliver an answer the new holder also
  produces.
* Commands (``/stop``, ...) stay with the replica that received them (it may reach
  runs elsewhere through :mod:`bot.storage.control`); a command entry another
  replica sees in the inbox is closed, never run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import aiosqlite

from bot.storage.claims import PER_SESSION, Claimed, Claims, LeaseLost, Listener, TakenReply, listen
from bot.storage.db import Statements
from bot.storage.inbox import Inbox, InboxEntry, OutboxEntry, decode_outbound

log = logging.getLogger("roost.dispatch.replicas")

Admit = Callable[[list[InboxEntry]], Awaitable[None]]
"""Runs claimed entries (the dispatcher's lanes, in order per session)."""
Resend = Callable[[list[OutboxEntry]], Awaitable[None]]
"""Sends replies this replica took over from dead ones (the dispatcher's redeliveries)."""


class ReplicaWork:
    """This replica's share of the inbox: claims, renewals, releases, fencing."""

    def __init__(self, inbox: Inbox, claims: Claims, *, admit: Admit,
                 busy: Callable[[str], bool], resend: Resend | None = None) -> None:
        """``admit`` runs entries this replica claimed; ``busy(key)`` says whether the
        session still has local work (a run, a queued message or a command);
        ``resend`` sends replies taken over from dead replicas."""
        self.inbox = inbox
        self.claims = claims
        self.admit = admit
        self.busy = busy
        self.resend = resend
        self.held: set[str] = set()
        """Sessions whose lease this replica holds."""
        self.lost_runs: set[str] = set()
        """Runs whose commit failed its lease check (the dispatcher skips their reply)."""
        self._seen: dict[str, set[int]] = {}
        # Entries admitted while the session's lease is held: a claim that still
        # reads them open (its snapshot predates their commit) must not run them twice.
        self._lock = asyncio.Lock()
        self._poked = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._releases: set[asyncio.Task[None]] = set()
        self._listener: Listener | None = None
        self._halted = False
        self._stopping = False
        self._orphans = asyncio.Event()
        self._working = 0
        """Sweeps and claims of the loops under way."""
        self._quiet = asyncio.Event()
        """Set whenever one of them ends (:meth:`claims_done` checks again)."""
        self._dirty: set[str] = set()
        """Held sessions with entries recorded since they were last read (the next
        claim reads them: held sessions are not in a claim's read otherwise)."""
        self._backlogged: set[str] = set()
        # Held sessions whose last claim did not return all open entries: a new entry
        # waits for the older ones (read when the lane is idle) instead of jumping them.
        self.period = claims.lease_seconds / 3
        """Seconds between sweeps: renew held leases, claim expired ones, take dead
        replicas' replies."""

    async def start(self, db: aiosqlite.Connection) -> None:
        """Record this replica's heartbeat, LISTEN for new entries and start the claim
        and sweep loops (the first sweep, at once, takes replies dead replicas left)."""
        await self.claims.renew(())
        self._listener = await listen(db, self._woken)
        self._orphans.set()
        self._tasks = [asyncio.ensure_future(self._claiming()),
                       asyncio.ensure_future(self._sweeping())]

    def _woken(self, key: str) -> None:
        # Only the holder needs waking: a session nobody holds is claimed by the
        # replica that recorded the entry (or, if it died meanwhile, by the sweep).
        # "" is a reconnect or a replica handing over: anything may be free now.
        if not key:
            self._orphans.set()
            self._dirty |= self.held
        elif key in self.held:
            self._dirty.add(key)
        if not key or key in self.held:
            self._poked.set()

    async def halt(self) -> None:
        """Stop claiming, renewing and listening; held leases are left to expire."""
        self._halted = True
        for task in (*self._tasks, *self._releases):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._releases, return_exceptions=True)
        self._tasks = []
        self._quiet.set()
        await self._unlisten()

    async def stop_claiming(self) -> None:
        """Take no new work (shutdown): no claims, no replies taken over; held leases
        and the heartbeat are still renewed while the runs here finish."""
        self._stopping = True
        for task in self._tasks[:1]:  # the claim loop; the sweep goes on renewing
            task.cancel()
        await asyncio.gather(*self._tasks[:1], return_exceptions=True)
        self._quiet.set()
        await self._unlisten()

    async def hand_over(self) -> None:
        """After the runs here ended (shutdown): release every lease and the heartbeat
        and wake the other replicas, which take the sessions and replies left at once."""
        if self._halted:
            return
        await self.halt()
        # Runs cancelled here put their entries back (queued writes): committed before
        # another replica may claim and start them.
        await self.inbox.writer.write(_nothing, what="finishing before a hand-over")
        released = await self.claims.hand_over()
        self.held.clear()
        self._seen.clear()
        if released:
            log.info("handed %d session lease(s) over to the other replicas", released)

    async def _unlisten(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None

    async def releases_done(self) -> None:
        """Wait for the releases under way (tests, shutdown)."""
        while self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    async def claims_done(self) -> None:
        """Wait until no sweep or claim of this replica's own loops is under way or due
        (tests: from then on it claims only what it receives, or what a ``NOTIFY`` for a
        session it holds or the next sweep brings)."""
        while self._tasks and not self._tasks[0].done() and (
                self._working or self._poked.is_set() or self._orphans.is_set()):
            self._quiet.clear()
            await self._quiet.wait()

    # -- intake ----------------------------------------------------------------

    async def submitted(self, entry: InboxEntry) -> None:
        """A message this replica recorded (pending): run it here if the session's
        lease is or can be ours, else leave it to the holder."""
        if self._stopping:
            return  # recorded: the replica that takes the session over runs it
        if entry.session_key in self.held and entry.session_key not in self._backlogged:
            async with self._lock:
                seen = self._seen.setdefault(entry.session_key, set())
                if entry.id in seen:
                    return
                # An older entry another replica recorded, whose wake-up has not come yet,
                # runs first: the claim below reads them all in order.
                if entry.session_key in self.held and seen.issuperset(
                        await self.claims.open_before(entry.session_key, entry.id)):
                    seen.add(entry.id)
                    await self.admit([entry])
                    return
        if entry.session_key in self.held:
            self._dirty.add(entry.session_key)  # a backlog: read after the older entries
        await self.claim()

    async def claim(self) -> None:
        """Claim open work: new sessions, expired leases, new entries of held sessions."""
        async with self._lock:
            mine, self._dirty = sorted(self._dirty & self.held), set()
            claimed = await self.claims.claim(mine=mine)
            if any(s.taken_from is not None for s in claimed):
                # A dead replica's session: the replies it committed go out before
                # the answers to what it left.
                await self.take_replies()
            fresh: dict[int, str] = {}
            for session in claimed:
                self._hold(session)
                seen = self._seen.setdefault(session.session_key, set())
                fresh.update((i, session.session_key) for i in session.entry_ids
                             if i not in seen)
            if fresh:
                await self._admit_ids(fresh)
        for session in claimed:
            if not self.busy(session.session_key):
                self.idle(session.session_key)  # nothing to run here (closed commands)

    def _hold(self, session: Claimed) -> None:
        self.held.add(session.session_key)
        if session.complete:
            self._backlogged.discard(session.session_key)
        else:
            self._backlogged.add(session.session_key)

    async def take_replies(self) -> None:
        """Take over the pending replies of dead replicas and send them (oldest first)."""
        while True:
            taken = await self.claims.take_replies()
            if not taken:
                return
            await self._resend(taken)

    async def _resend(self, taken: list[TakenReply]) -> None:
        kept = [t for t in taken if not t.send]
        for t in kept:
            log.warning("reply %d was being sent by a replica that died; not sent again "
                        "(it may have been shown: at most once)", t.id)
        to_send = [OutboxEntry(t.id, decode_outbound(t.message), t.draft_id, t.attempts)
                   for t in taken if t.send]
        if to_send:
            log.info("sending %d reply(ies) a dead replica committed", len(to_send))
            if self.resend is not None:
                await self.resend(to_send)

    async def _admit_ids(self, ids: dict[int, str]) -> None:
        """Run entries ``ids`` (id -> session); called holding the lock."""
        entries = await self.inbox.unfinished(list(ids))
        for entry in entries:
            self._seen.setdefault(entry.session_key, set()).add(entry.id)
        commands = [e.id for e in entries if e.kind == "command"]
        if commands:
            # The receiving replica runs its commands; this one only sees them open.
            self.inbox.close(commands)
        messages = [e for e in entries if e.kind == "message"]
        if messages:
            await self.admit(messages)

    # -- holding and letting go ---------------------------------------------------

    def lease_check(self, key: str, run_id: str) -> Statements:
        """Statements for run ``run_id``'s commit: refused unless ``key`` is still ours."""
        check = self.claims.lease_check(key)

        async def body(db: aiosqlite.Connection) -> None:
            try:
                await check(db)
            except LeaseLost:
                self.lost_runs.add(run_id)
                self.held.discard(key)
                raise
        return body

    def idle(self, key: str) -> None:
        """Session ``key`` has no local work left: release its lease (in the background;
        while stopping too, so another replica may take the session at once)."""
        if key not in self.held or self._halted:
            return
        task = asyncio.ensure_future(self._release(key))
        self._releases.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releases.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("releasing a session lease failed: %s", task.exception())

    async def _release(self, key: str) -> None:
        async with self._lock:
            if self.busy(key) or key not in self.held:
                return
            # Closes queued for later (a command, /stop, a refusal) must be committed
            # first, or the release would find their entries still open.
            await self.inbox.writer.write(_nothing, what="finishing before a release")
            left = await self.claims.release(key)
            if not left:
                self._forget(key)
                return
            if key not in await self.claims.renew([key]):
                self._forget(key)  # taken over meanwhile: the new holder runs them
                return
            if self._stopping:
                return  # the hand-over gives them to another replica
            # Still ours and open with nothing running here: arrived meanwhile, a
            # run that ended without closing them, or the rest of a backlog. Run
            # them (in order); a full batch may have more behind it.
            self._seen[key] = set()
            self._hold(Claimed(key, left, len(left) < PER_SESSION))
            await self._admit_ids(dict.fromkeys(left, key))

    def _forget(self, key: str) -> None:
        self.held.discard(key)
        self._seen.pop(key, None)
        self._backlogged.discard(key)

    async def _claiming(self) -> None:
        while True:
            await self._poked.wait()
            self._poked.clear()
            self._working += 1
            try:
                await self.claim()
            except Exception as exc:  # a lost connection: the sweep tries again
                log.warning("claiming inbox work failed: %s", exc)
            finally:
                self._ended_work()

    async def _sweeping(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period):
                    await self._orphans.wait()  # or at once, when woken
            self._working += 1
            try:
                await self._sweep()
            finally:
                self._ended_work()

    async def _sweep(self) -> None:
        try:
            await self.renew()
        except Exception as exc:
            log.warning("renewing session leases failed: %s", exc)
        self._orphans.clear()
        if self._stopping:
            return  # renewing only, until the hand-over
        try:
            async with self._lock:
                await self.take_replies()  # of replicas that died
        except Exception as exc:
            log.warning("taking over the replies of dead replicas failed: %s", exc)
        self._poked.set()  # and claim leases that expired (a replica died)

    def _ended_work(self) -> None:
        self._working -= 1
        self._quiet.set()

    @property
    def live(self) -> int:
        """Replicas alive at this one's last heartbeat, itself included (at least 1): the
        app gives channels this object (:attr:`bot.contracts.channel.Channel.replicas`)
        so they divide bot-wide send limits among the replicas."""
        return self.claims.live

    async def renew(self) -> None:
        """Extend the heartbeat and the held leases; forget those another replica holds now."""
        keys: Sequence[str] = sorted(self.held)
        kept = await self.claims.renew(keys)
        for key in set(keys) - kept:
            log.warning("lost the lease on %s to another replica", key)
            self._forget(key)


async def _nothing(db: aiosqlite.Connection) -> None:
    return None


async def close_quietly(work: ReplicaWork | None) -> None:
    """Stop ``work`` claiming if there is any (shutdown: leases are still renewed until
    :meth:`ReplicaWork.hand_over`); never raises."""
    if work is not None:
        with contextlib.suppress(Exception):
            await work.stop_claiming()
