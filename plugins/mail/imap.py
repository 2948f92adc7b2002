"""The IMAP side: one connection to the mailbox, and the loop that watches it.

:class:`Mailbox` is one aioimaplib connection (login, select, UID search and fetch,
IDLE). :class:`MailWatcher` keeps one open while this replica leads, hands every
new mail to the core by UID order, and waits in IDLE (renewed every
``idle_seconds``, under the 29 minutes after which servers drop it). A dropped
connection or a failing server makes it reconnect after ``reconnect_min_seconds``,
doubling to ``reconnect_max_seconds``; meanwhile the channel reports not ready.

**Positions.** The mailbox's UIDVALIDITY and the last UID handled are kept in the
channel's durable notes (:class:`roost.channels.ChannelState`); the last UID moves
past a mail only once the core's handler returned for it (the mail is in the inbox,
or was deliberately skipped), so a restart neither loses nor repeats one. On the
first start the mailbox's present mail is left alone: the channel answers what
arrives from then on. When the UIDVALIDITY changes (the mailbox was rebuilt), UIDs
mean nothing any more: mail since the day before the last one handled (and after the
first start) is read again and the inbox drops what it already recorded (its key is
the sender and ``Message-ID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aioimaplib

from plugins.mail.config import MailSetup
from roost import ChannelHealth, InboundHandler, InboundMessage
from roost.channels import READY, ChannelState, Leadership, SetupError

log = logging.getLogger("roost.plugins.mail")

T = TypeVar("T")

CONNECTING = ChannelHealth(False, "connecting to IMAP")
STANDBY = ChannelHealth(True, "standby: another replica reads the mailbox")
UIDVALIDITY = "uidvalidity"
LAST_UID = "last_uid"
LAST_SEEN = "last_seen"
FIRST_START = "first_start"
"""Notes: the mailbox's UIDVALIDITY, the last UID handled, when a mail was last handled,
when the channel first read this mailbox (mail from before was left alone)."""
RESCAN_MARGIN = 86_400.0
"""After a UIDVALIDITY change, mail is read again from this long before the last one handled."""

_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)")
_UID = re.compile(rb"UID (\d+)")
_UIDNEXT = re.compile(rb"UIDNEXT (\d+)")
_INTERNALDATE = re.compile(rb'INTERNALDATE "\s?(\d{1,2}-\w{3}-\d{4} \d\d:\d\d:\d\d [+-]\d{4})"')
_FETCH_SIZE = re.compile(rb"UID (\d+).*RFC822\.SIZE (\d+)|RFC822\.SIZE (\d+).*UID (\d+)")

Translate = Callable[[bytes, int, int], Awaitable[InboundMessage | None]]
"""A raw mail, its UIDVALIDITY and UID → the core's message (``None``: not for Roost)."""


class MailboxError(Exception):
    """The server refused a command or the connection failed (reconnect)."""


class LoginRefused(MailboxError):
    """The server refused the credentials."""


_ANNOUNCED = re.compile(rb"(\* )?\d+ (EXISTS|RECENT)")


class _Protocol(aioimaplib.IMAP4ClientProtocol):  # type: ignore[misc]
    """aioimaplib's protocol, noting that the server announced new mail.

    aioimaplib drops an ``EXISTS`` that comes with the answer to a ``UID FETCH`` (it
    has no command waiting for it), and the server then does not announce that mail
    again when IDLE starts: without this note it would wait for the next mail.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.announced = False

    def looking(self) -> None:
        """A look for new mail starts: what was announced before is covered by it."""
        self.announced = False

    def _untagged_response(self, line: bytes) -> Any:
        if _ANNOUNCED.match(line):
            self.announced = True
        return super()._untagged_response(line)


class _Client(aioimaplib.IMAP4):  # type: ignore[misc]
    """aioimaplib's client on :class:`_Protocol` (TLS when given an SSL context)."""

    def create_client(self, host: str, port: int, loop: asyncio.AbstractEventLoop | None,
                      conn_lost_cb: Callable[[Exception | None], None] | None = None,
                      ssl_context: ssl.SSLContext | None = None) -> None:
        running = loop or asyncio.get_running_loop()
        self.protocol = _Protocol(running, conn_lost_cb)
        self._client_task = running.create_task(running.create_connection(
            lambda: self.protocol, host, port, ssl=ssl_context))


class Mailbox:
    """One IMAP connection to the configured mailbox."""

    def __init__(self, setup: MailSetup) -> None:
        self.setup = setup
        self.lost = asyncio.Event()
        self.client: Any = None
        self.idle_supported = True
        """Whether the server offers IDLE after login (else :meth:`idle` polls)."""
        self.uidnext: int | None = None
        """The UID the next mail will get, as the server said at :meth:`open`."""

    async def open(self) -> int:
        """Connect, log in and select the mailbox; its UIDVALIDITY."""
        endpoint, config = self.setup.imap, self.setup.config
        context = ssl.create_default_context() if endpoint.tls else None
        self.client = _Client(host=endpoint.host, port=endpoint.port, timeout=config.timeout,
                              conn_lost_cb=lambda _exc: self.lost.set(), ssl_context=context)
        await self.call(self.client.wait_hello_from_server())
        user, password = self.setup.imap_login
        response = await self.call(self.client.login(user, password))
        if response.result != "OK":
            raise LoginRefused(f"IMAP login refused ({_text(response)})")
        # What the server offers may change with the login (RFC 3501): ask again.
        await self.call(self.client.protocol.capability())
        self.idle_supported = self.client.has_capability("IDLE")
        response = await self.call(self.client.select(config.mailbox))
        if response.result != "OK":
            raise MailboxError(f"cannot select {config.mailbox!r} ({_text(response)})")
        validity = None
        for line in response.lines:
            found, upcoming = _UIDVALIDITY.search(bytes(line)), _UIDNEXT.search(bytes(line))
            if found:
                validity = int(found.group(1))
            if upcoming:
                self.uidnext = int(upcoming.group(1))
        if validity is None:
            raise MailboxError("the server named no UIDVALIDITY")
        return validity

    async def highest_uid(self) -> int:
        """The highest UID in the mailbox now (0: none): from UIDNEXT where the server
        gave it, else by asking for every mail's UID."""
        if self.uidnext is not None:
            return self.uidnext - 1
        present = await self.new_mail(0)
        return present[-1][0] if present else 0

    async def call(self, call: Awaitable[T]) -> T:
        """``await call``, cut short (:class:`MailboxError`) when the connection drops."""
        task = asyncio.ensure_future(call)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({task, lost}, timeout=self.setup.config.timeout + 5,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise MailboxError("the IMAP connection dropped" if self.lost.is_set()
                               else "the IMAP server did not answer")
        try:
            return task.result()
        except (aioimaplib.AioImapException, OSError, TimeoutError) as exc:
            raise MailboxError(f"IMAP: {exc or type(exc).__name__}") from exc

    async def new_mail(self, after: int) -> list[tuple[int, int]]:
        """``(uid, size)`` of every mail with a UID above ``after``, in UID order."""
        self.client.protocol.looking()  # what is announced from now on is looked for again
        response = await self.call(self.client.uid("fetch", f"{after + 1}:*",
                                                   "(UID RFC822.SIZE)"))
        return self._sizes(response, after)

    async def since(self, when: float, after: float) -> list[tuple[int, int]]:
        """``(uid, size)`` of every mail the server received since the day of ``when``,
        and not before the second of ``after`` (its INTERNALDATE has whole seconds: one
        of that second is kept, as it may have come after)."""
        day = datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%d-%b-%Y")
        response = await self.call(self.client.uid_search("SINCE", day, charset=None))
        if response.result != "OK":
            raise MailboxError(f"UID SEARCH failed ({_text(response)})")
        uids = sorted({int(n) for line in response.lines for n in bytes(line).split()
                       if n.isdigit()})
        if not uids:
            return []
        fetched = await self.call(self.client.uid("fetch", ",".join(map(str, uids)),
                                                  "(UID RFC822.SIZE INTERNALDATE)"))
        sizes = dict(self._sizes(fetched, 0))
        arrived: dict[int, float] = {}
        for line in fetched.lines:
            uid_of, date = _UID.search(bytes(line)), _INTERNALDATE.search(bytes(line))
            if uid_of and date:
                stamp = datetime.datetime.strptime(date.group(1).decode(),
                                                   "%d-%b-%Y %H:%M:%S %z").timestamp()
                arrived[int(uid_of.group(1))] = stamp
        return [(uid, size) for uid, size in sorted(sizes.items())
                if arrived.get(uid, after) >= int(after)]

    def _sizes(self, response: Any, after: int) -> list[tuple[int, int]]:
        if response.result != "OK":
            raise MailboxError(f"UID FETCH failed ({_text(response)})")
        found: dict[int, int] = {}
        for line in response.lines:
            match = _FETCH_SIZE.search(bytes(line))
            if match:
                uid = int(match.group(1) or match.group(4))
                size = int(match.group(2) or match.group(3))
                if uid > after:  # "n:*" names the last mail even below n
                    found[uid] = size
        return sorted(found.items())

    async def fetch(self, uid: int) -> bytes | None:
        """The whole mail ``uid`` (``None`` if it is gone), leaving it unread."""
        response = await self.call(self.client.uid("fetch", str(uid), "(BODY.PEEK[])"))
        if response.result != "OK":
            raise MailboxError(f"UID FETCH failed ({_text(response)})")
        for line in response.lines:
            if isinstance(line, bytearray):
                return bytes(line)
        return None

    async def idle(self, seconds: float, stopping: asyncio.Event,
                   idling: asyncio.Event) -> None:
        """Wait in IDLE until the server reports a change, ``seconds`` pass or ``stopping``;
        ``idling`` is set while the server has IDLE under way. A server without IDLE is
        polled instead: this waits ``poll_seconds`` (``idling`` set meanwhile)."""
        client = self.client
        if client.protocol.announced:
            return  # new mail was announced since the last look: look again first
        if not self.idle_supported:
            await self._pause(min(seconds, self.setup.config.poll_seconds), stopping, idling)
            return
        while not client.protocol.idle_queue.empty():
            client.protocol.idle_queue.get_nowait()
        command = asyncio.ensure_future(client.idle())
        try:
            await self.call(client.protocol.wait_for_idle_response())
            idling.set()
            push = asyncio.ensure_future(client.wait_server_push(timeout=seconds))
            waits = {push, asyncio.ensure_future(self.lost.wait()),
                     asyncio.ensure_future(stopping.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            if self.lost.is_set():
                raise MailboxError("the IMAP connection dropped")
            if push.done() and not push.cancelled() \
                    and isinstance(push.exception(), TimeoutError):
                log.debug("email: IDLE renewed after %.0fs", seconds)
            client.idle_done()
            await self.call(command)
        finally:
            idling.clear()
            if not command.done():
                command.cancel()
                await asyncio.gather(command, return_exceptions=True)

    async def _pause(self, seconds: float, stopping: asyncio.Event,
                     idling: asyncio.Event) -> None:
        waits = {asyncio.ensure_future(self.lost.wait()),
                 asyncio.ensure_future(stopping.wait())}
        idling.set()
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idling.clear()
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if self.lost.is_set():
            raise MailboxError("the IMAP connection dropped")

    async def close(self) -> None:
        """Log out (best effort) and drop the connection."""
        client, self.client = self.client, None
        if client is None:
            return
        if not self.lost.is_set():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.logout(), 5)
        transport = getattr(client.protocol, "transport", None)
        if transport is not None:
            transport.close()


def _text(response: Any) -> str:
    lines = getattr(response, "lines", None) or [b""]
    return bytes(lines[-1]).decode("utf-8", "replace")[:200]


class MailWatcher:
    """Reads new mail by UID and hands it to the core while this replica leads."""

    def __init__(self, setup: MailSetup, translate: Translate, *,
                 mailbox: Callable[[MailSetup], Mailbox] = Mailbox) -> None:
        self.setup = setup
        self.translate = translate
        self.mailbox = mailbox
        self.health = CONNECTING
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.idling = asyncio.Event()
        """Set while the server has an IDLE under way (mail arriving now is reported)."""
        self.reading = asyncio.Lock()
        """Held while a mail is handed over: :meth:`stop` lets that finish."""

    def start(self, handler: InboundHandler, state: ChannelState,
              leadership: Leadership | None) -> None:
        """Begin watching (in turns with other replicas under ``leadership``)."""
        self.task = asyncio.create_task(self._lead(handler, state, leadership))

    async def stop(self) -> None:
        """Stop reading: an IDLE is left at once; a mail being handed over finishes."""
        self.stopping.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 10)
            except (TimeoutError, asyncio.CancelledError):
                self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _until_stopped(self, awaitable: Awaitable[Any]) -> bool:
        """Wait for ``awaitable`` unless stopping first; whether it finished."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, stop):
            pending.cancel()
        await asyncio.gather(task, stop, return_exceptions=True)
        return not self.stopping.is_set()

    async def _lead(self, handler: InboundHandler, state: ChannelState,
                    lead: Leadership | None) -> None:
        if lead is None:
            await self._watch(handler, state)
            return
        while not self.stopping.is_set():
            if not lead.is_leader:
                self.health = STANDBY
                log.info("email: another replica reads the mailbox; this one takes over "
                         "if it stops")
                if not await self._until_stopped(lead.wait_leading()):
                    return
            log.info("email: this replica leads: reading the mailbox")
            watching = asyncio.ensure_future(self._watch(handler, state))
            lost = asyncio.ensure_future(lead.wait_lost())
            try:
                await asyncio.wait({watching, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                if not watching.done():
                    # A mail being handed over is finished first (the lock), then cut.
                    async with self.reading:
                        watching.cancel()
                await asyncio.gather(lost, watching, return_exceptions=True)
            if watching.cancelled():
                continue
            await watching
            return

    async def _watch(self, handler: InboundHandler, state: ChannelState) -> None:
        """Connect, catch up, IDLE; on failure reconnect with back-off."""
        first = backoff = self.setup.config.reconnect_min_seconds
        while not self.stopping.is_set():
            box = self.mailbox(self.setup)
            try:
                uidvalidity = await box.open()
                log.info("email: connected to %s:%d (%s)%s", self.setup.imap.host,
                         self.setup.imap.port, self.setup.config.mailbox,
                         "" if box.idle_supported else "; the server has no IDLE: polling "
                         f"every {self.setup.config.poll_seconds:g}s")
                self.health = READY
                backoff = first
                await self._catch_up(box, uidvalidity, handler, state)
                while not self.stopping.is_set():
                    await box.idle(self.setup.config.idle_seconds, self.stopping, self.idling)
                    if not self.stopping.is_set():
                        await self._read_new(box, uidvalidity, handler, state)
            except LoginRefused as exc:
                self.health = ChannelHealth(False, "IMAP login refused")
                log.error("email: %s: check EMAIL_USERNAME and EMAIL_PASSWORD", exc)
            except MailboxError as exc:
                self.health = ChannelHealth(False, f"IMAP failing ({str(exc)[:80]})")
                log.warning("email: %s; reconnecting in %.0fs", exc, backoff)
            except Exception as exc:  # the handler failed: nothing was acknowledged
                self.health = ChannelHealth(False, "handing mail over failed")
                log.warning("email: %s; reading again in %.0fs", exc, backoff)
            finally:
                await box.close()
            if self.stopping.is_set():
                return
            if not await self._until_stopped(asyncio.sleep(backoff)):
                return
            backoff = min(backoff * 2, self.setup.config.reconnect_max_seconds)

    async def _catch_up(self, box: Mailbox, uidvalidity: int, handler: InboundHandler,
                        state: ChannelState) -> None:
        known = await state.get(UIDVALIDITY)
        if known == str(uidvalidity):
            await self._read_new(box, uidvalidity, handler, state)
            return
        # Everything up to the UID the server named at SELECT is covered here; what
        # arrived since has a higher UID and is read as new mail below.
        last = await box.highest_uid()
        if known is None:
            await state.put(FIRST_START, repr(time.time()))
            log.info("email: first start on this mailbox: the mail there (UIDs up to %d) "
                     "is left alone", last)
        else:
            seen = float(await state.get(LAST_SEEN) or 0.0)
            log.warning("email: the mailbox's UIDVALIDITY changed (%s to %d): reading mail "
                        "again since %s; what was handled already is dropped", known,
                        uidvalidity, time.strftime("%Y-%m-%d", time.gmtime(seen - RESCAN_MARGIN)))
            # Mail left alone at the first start stays alone (to the second).
            first = float(await state.get(FIRST_START) or 0.0)
            candidates = await box.since(max(0.0, seen - RESCAN_MARGIN), first)
            await self._hand_over(box, uidvalidity, [c for c in candidates if c[0] <= last],
                                  handler, state)
            if self.stopping.is_set():
                return  # cut short: the next start reads them again (the inbox dedupes)
        await state.put(UIDVALIDITY, str(uidvalidity))
        await state.put(LAST_UID, str(last))
        await self._read_new(box, uidvalidity, handler, state)

    async def _read_new(self, box: Mailbox, uidvalidity: int, handler: InboundHandler,
                        state: ChannelState) -> None:
        last = int(await state.get(LAST_UID) or 0)
        await self._hand_over(box, uidvalidity, await box.new_mail(last), handler, state,
                              note=True)

    async def _hand_over(self, box: Mailbox, uidvalidity: int, mails: list[tuple[int, int]],
                         handler: InboundHandler, state: ChannelState, *,
                         note: bool = False) -> None:
        """Hand ``mails`` over in UID order (with ``note``, noting each UID as it goes)."""
        for uid, size in mails:
            if self.stopping.is_set():
                break
            async with self.reading:
                if size > self.setup.config.max_mail_bytes:
                    log.warning("email: mail %d is %d bytes, over max_mail_bytes: skipped",
                                uid, size)
                else:
                    raw = await box.fetch(uid)
                    inbound = None if raw is None else \
                        await self.translate(raw, uidvalidity, uid)
                    if inbound is not None:
                        await handler(inbound)
                await state.put(LAST_SEEN, repr(time.time()))
                if note:
                    await state.put(LAST_UID, str(uid))


def check_setup(setup: MailSetup) -> None:
    """Refuse settings that cannot work before connecting (:class:`SetupError`)."""
    if not setup.config.mailbox.strip() or any(c in setup.config.mailbox for c in "\r\n\""):
        raise SetupError(f"mailbox {setup.config.mailbox!r} is not a folder name")
