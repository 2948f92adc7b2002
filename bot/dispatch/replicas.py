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
* Held leases are renewed by that same sweep; a session's lease is released
  when its lane is idle (entries still open then are run, not abandoned).
* A run's commit is fenced (:meth:`bot.storage.claims.Claims.fence`): a replica
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

from bot.storage.claims import Claims, LeaseLost, Listener, listen
from bot.storage.db import Statements
from bot.storage.inbox import Inbox, InboxEntry

log = logging.getLogger("roost.dispatch.replicas")

Admit = Callable[[list[InboxEntry]], Awaitable[None]]
"""Runs claimed entries (the dispatcher's lanes, in order per session)."""


class ReplicaWork:
    """This replica's share of the inbox: claims, renewals, releases, fencing."""

    def __init__(self, inbox: Inbox, claims: Claims, *, admit: Admit,
                 busy: Callable[[str], bool]) -> None:
        """``admit`` runs entries this replica claimed; ``busy(key)`` says whether the
        session still has local work (a run, a queued message or a command)."""
        self.inbox = inbox
        self.claims = claims
        self.admit = admit
        self.busy = busy
        self.held: set[str] = set()
        """Sessions whose lease this replica holds."""
        self.lost_runs: set[str] = set()
        """Runs whose commit was refused by the fence (the dispatcher skips their reply)."""
        self._seen: dict[str, set[int]] = {}
        # Entries admitted while the session's lease is held: a claim that still
        # reads them open (its snapshot predates their commit) must not run them twice.
        self._lock = asyncio.Lock()
        self._poked = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._releases: set[asyncio.Task[None]] = set()
        self._listener: Listener | None = None
        self._halted = False
        self.period = claims.lease_seconds / 3
        """Seconds between sweeps: renew held leases, claim expired ones."""

    async def start(self, db: aiosqlite.Connection) -> None:
        """LISTEN for new entries and start the claim and sweep loops."""
        self._listener = await listen(db, self._woken)
        self._tasks = [asyncio.ensure_future(self._claiming()),
                       asyncio.ensure_future(self._sweeping())]

    def _woken(self, key: str) -> None:
        # Only the holder needs waking: a session nobody holds is claimed by the
        # replica that recorded the entry (or, if it died meanwhile, by the sweep).
        # "" is a reconnect: anything may have been missed.
        if not key or key in self.held:
            self._poked.set()

    async def halt(self) -> None:
        """Stop claiming, renewing and listening; held leases are left to expire."""
        self._halted = True
        for task in (*self._tasks, *self._releases):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._releases, return_exceptions=True)
        self._tasks = []
        if self._listener is not None:
            await self._listener.close()
            self._listener = None

    async def settled(self) -> None:
        """Wait for the releases under way (tests, shutdown)."""
        while self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    # -- intake ----------------------------------------------------------------

    async def submitted(self, entry: InboxEntry) -> None:
        """A message this replica recorded (pending): run it here if the session's
        lease is or can be ours, else leave it to the holder."""
        if entry.session_key in self.held:
            async with self._lock:
                seen = self._seen.setdefault(entry.session_key, set())
                if entry.session_key in self.held and entry.id not in seen:
                    seen.add(entry.id)
                    await self.admit([entry])
                    return
                if entry.id in seen:
                    return
        await self.claim()

    async def claim(self) -> None:
        """Claim open work: new sessions, expired leases, new entries of held sessions."""
        async with self._lock:
            claimed = await self.claims.claim()
            fresh: dict[int, str] = {}
            for session in claimed:
                self.held.add(session.session_key)
                seen = self._seen.setdefault(session.session_key, set())
                fresh.update((i, session.session_key) for i in session.entry_ids
                             if i not in seen)
            if fresh:
                await self._admit_ids(fresh)
        for session in claimed:
            if not self.busy(session.session_key):
                self.idle(session.session_key)  # nothing to run here (closed commands)

    async def _admit_ids(self, ids: dict[int, str]) -> None:
        """Run entries ``ids`` (id -> session); called holding the lock."""
        entries = [e for e in await self.inbox.unfinished() if e.id in ids]
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

    def fence(self, key: str, run_id: str) -> Statements:
        """Statements for run ``run_id``'s commit: refused unless ``key`` is still ours."""
        check = self.claims.fence(key)

        async def body(db: aiosqlite.Connection) -> None:
            try:
                await check(db)
            except LeaseLost:
                self.lost_runs.add(run_id)
                self.held.discard(key)
                raise
        return body

    def idle(self, key: str) -> None:
        """Session ``key`` has no local work left: release its lease (in the background)."""
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
                self.held.discard(key)
                self._seen.pop(key, None)
                return
            if key not in await self.claims.renew([key]):
                self.held.discard(key)  # taken over meanwhile: the new holder runs them
                self._seen.pop(key, None)
                return
            # Still ours and open with nothing running here: arrived meanwhile, or a
            # run that ended without closing them. Run them (in order).
            self._seen[key] = set()
            await self._admit_ids(dict.fromkeys(left, key))

    async def _claiming(self) -> None:
        while True:
            await self._poked.wait()
            self._poked.clear()
            try:
                await self.claim()
            except Exception as exc:  # a lost connection: the sweep tries again
                log.warning("claiming inbox work failed: %s", exc)

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.renew()
            except Exception as exc:
                log.warning("renewing session leases failed: %s", exc)
            self._poked.set()  # and claim leases that expired (a replica died)

    async def renew(self) -> None:
        """Extend the held leases; forget those another replica holds now."""
        keys: Sequence[str] = sorted(self.held)
        if not keys:
            return
        kept = await self.claims.renew(keys)
        for key in set(keys) - kept:
            log.warning("lost the lease on %s to another replica", key)
            self.held.discard(key)
            self._seen.pop(key, None)


async def _nothing(db: aiosqlite.Connection) -> None:
    return None


async def close_quietly(work: ReplicaWork | None) -> None:
    """Halt ``work`` if there is any; never raises (shutdown)."""
    if work is not None:
        with contextlib.suppress(Exception):
            await work.halt()
