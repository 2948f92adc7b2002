"""HTTP listeners that hold up against hostile clients; every port Roost opens is one.

A :class:`Listener` serves an aiohttp application behind a guard:

* a client has ``header_timeout`` seconds from connecting (or from its previous
  response) to finish a request's headers, and ``body_timeout`` seconds to send
  the body; otherwise the connection is cut (a slow-loris holds nothing for long);
* at most ``max_connections`` connections at once, ``max_per_address`` from one
  address; past the address cap a newcomer is refused at once (``429``) and closed.
  At the connection cap, a newcomer from an address holding fewer connections than
  the address holding the most closes that address's longest wait for request
  headers and takes its place; otherwise it is refused at once (``503``). So a
  flood never holds more descriptors than the cap, and a client with few
  connections (a health probe, a platform's webhook) gets in while a few
  addresses hold the rest;
* ``GET`` and ``HEAD`` take no body, other routes at most ``max_body`` bytes (``413``);
* ``accept()`` failing for lack of descriptors is logged at most once a minute,
  and so is the count of refused and cut connections.

aiohttp is imported only when a listener starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["LimitSettings", "Limits", "Listener", "Throttle", "raise_open_files"]

log = logging.getLogger("roost.http")

REPORT_EVERY = 60.0
"""Seconds between two log lines about refused or cut connections or failed accepts."""

BACKLOG = 1024
"""Connections the kernel queues before Roost accepts them: room for a burst (no
descriptor is used until accepted)."""

ACCEPT_BATCH = 128
"""Connections accepted in one turn of the event loop before other work gets its turn."""

MAX_DERIVED = 4096
"""The most connections a listener takes when ``max_connections`` is derived."""

_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""``accept()`` errors that mean "no descriptor or memory now": accepting pauses a second."""

_WAITING, _BODY, _BUSY = "waiting", "body", "busy"


class LimitSettings(Protocol):
    """The settings a :class:`Limits` is read from (``bot.config.settings.Settings``)."""

    @property
    def http_header_timeout(self) -> float: ...
    @property
    def http_body_timeout(self) -> float: ...
    @property
    def http_max_connections(self) -> int: ...
    @property
    def http_max_per_address(self) -> int: ...
    @property
    def http_max_body(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """What one listener allows; ``max_connections`` 0 derives it from the descriptor limit,
    ``max_per_address`` 0 turns the address cap off."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 0
    max_per_address: int = 64
    max_body: int = 1 << 20

    @classmethod
    def from_settings(cls, settings: LimitSettings) -> Limits:
        """The limits the ``http_*`` settings give."""
        return cls(settings.http_header_timeout, settings.http_body_timeout,
                   settings.http_max_connections, settings.http_max_per_address,
                   settings.http_max_body)

    def connections(self) -> int:
        """The connection cap: as set, or a quarter of the open-file soft limit (32 to 4,096)."""
        if self.max_connections > 0:
            return self.max_connections
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return MAX_DERIVED
        return max(32, min(MAX_DERIVED, soft // 4))


def raise_open_files() -> tuple[int, int]:
    """Raise this process's open-file soft limit to its hard limit; (before, after).

    An unlimited hard limit is met with the kernel's own ceiling (``fs.nr_open``); a
    refusal leaves the soft limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as ceiling:
                target = int(ceiling.read().strip())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, target
    return soft, soft


class _Connection(asyncio.Protocol):
    """One accepted connection: admitted by the guard, then served by aiohttp's protocol."""

    __slots__ = ("address", "factory", "guard", "inner", "since", "state", "transport")

    def __init__(self, guard: _Guard, factory: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.factory = factory
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.state = _WAITING
        self.since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.guard.admit(self):
            self.inner = self.factory()
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)


def _refusal(status: int, reason: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


_BUSY_REPLY = _refusal(503, "Service Unavailable", "too many connections\n")
_ADDRESS_REPLY = _refusal(429, "Too Many Requests", "too many connections from your address\n")


class _Guard:
    """The books of one listener: connections by transport and address, oldest waiting first."""

    def __init__(self, limits: Limits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.cap = limits.connections()
        self.open: dict[asyncio.BaseTransport, _Connection] = {}
        self.waiting: dict[_Connection, None] = {}
        """Connections waiting for request headers, the longest-waiting first."""
        self.waiting_from: dict[str, dict[_Connection, None]] = {}
        """The same by address."""
        self.per_address: Counter[str] = Counter()
        self.refused = self.evicted = self.timed_out = 0

    def screen(self, address: str) -> bytes | None:
        """Make room for a connection from ``address`` (closing another address's waiting
        one at the cap); ``None`` when it may come in, else the answer refusing it."""
        most = self.limits.max_per_address
        if most > 0 and self.per_address[address] >= most:
            self.refused += 1
            return _ADDRESS_REPLY
        if len(self.open) >= self.cap and not self._evict_for(address):
            self.refused += 1
            return _BUSY_REPLY
        return None

    def admit(self, conn: _Connection) -> bool:
        """Take ``conn`` on, or refuse it at once (see :meth:`screen`)."""
        assert conn.transport is not None
        reply = self.screen(conn.address)
        if reply is not None:
            conn.transport.write(reply)
            conn.transport.close()
            return False
        self.open[conn.transport] = conn
        self.per_address[conn.address] += 1
        self.wait(conn, time.monotonic())
        return True

    def _evict_for(self, address: str) -> bool:
        """Close the longest-waiting connection of the address holding the most connections,
        if it holds more than ``address``; whether one was closed."""
        victim, most = "", self.per_address[address]
        for other in self.waiting_from:
            held = self.per_address[other]
            if held > most:
                victim, most = other, held
        if not victim:
            return False
        self.evicted += 1
        self.drop(next(iter(self.waiting_from[victim])))
        return True

    def wait(self, conn: _Connection, now: float) -> None:
        """``conn`` waits for a request's headers from ``now`` on."""
        self._unwait(conn)
        conn.state, conn.since = _WAITING, now
        self.waiting[conn] = None
        self.waiting_from.setdefault(conn.address, {})[conn] = None

    def step(self, conn: _Connection, state: str) -> None:
        """``conn`` got its headers: it reads a body (``_BODY``) or is handled (``_BUSY``)."""
        conn.state, conn.since = state, time.monotonic()
        self._unwait(conn)

    def _unwait(self, conn: _Connection) -> None:
        if self.waiting.pop(conn, 0) is None:
            mine = self.waiting_from[conn.address]
            del mine[conn]
            if not mine:
                del self.waiting_from[conn.address]

    def drop(self, conn: _Connection) -> None:
        """Forget ``conn`` and cut it at once."""
        self.release(conn)
        if conn.transport is not None:
            conn.transport.abort()

    def release(self, conn: _Connection) -> None:
        """Forget ``conn`` (idempotent)."""
        if conn.transport is None or self.open.get(conn.transport) is not conn:
            return
        del self.open[conn.transport]
        self._unwait(conn)
        left = self.per_address[conn.address] - 1
        if left > 0:
            self.per_address[conn.address] = left
        else:
            del self.per_address[conn.address]

    def expire(self, now: float) -> None:
        """Cut every connection that waited longer than the header timeout."""
        limit = self.limits.header_timeout
        while self.waiting:
            conn = next(iter(self.waiting))
            if now - conn.since < limit:
                return
            self.timed_out += 1
            self.drop(conn)


class Throttle:
    """Lets a log line through at most once per ``every`` seconds and counts the ones held
    back, for the next line to say."""

    def __init__(self, every: float = REPORT_EVERY) -> None:
        self.every = every
        self.last = -every
        self.skipped = 0

    def ready(self) -> int | None:
        """``None`` when the line is to be held back; otherwise how many were since the last."""
        now = time.monotonic()
        if now - self.last < self.every:
            self.skipped += 1
            return None
        self.last = now
        skipped, self.skipped = self.skipped, 0
        return skipped


Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]


class Listener:
    """An aiohttp application served on ``host:port`` behind the guard; ``name`` labels its
    log lines. Add routes to :attr:`app` before :meth:`start`; :meth:`close` ends it."""

    def __init__(self, host: str | None, port: int, limits: Limits, *, name: str = "HTTP") -> None:
        from aiohttp import web

        self.host = host
        self.port = port
        """The port asked for; once started, the one bound (``0`` picks a free one)."""
        self.limits = limits
        self.name = name
        self.guard = _Guard(limits, name)

        @web.middleware
        async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self._middleware(request, handler)

        self.app = web.Application(client_max_size=limits.max_body, middlewares=[guarded])
        self._runner: web.AppRunner | None = None
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._sockets: list[socket.socket] = []
        self._opening: set[asyncio.Task[Any]] = set()
        self._accept_errors = Throttle()
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and serve; raises :class:`OSError` when the address cannot be bound."""
        from aiohttp import web

        # lingering_time=0: a body left unread (a 413) closes the connection at once
        # instead of being read for another 10 s.
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                               lingering_time=0)
        await runner.setup()
        factory = runner.server
        assert factory is not None
        self._factory = factory
        loop = asyncio.get_running_loop()
        try:
            self._sockets = await _bind(loop, self.host, self.port)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(self._sockets[0].getsockname()[1])
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        self._ticker = asyncio.create_task(self._tick(), name=f"{self.name} listener guard")
        log.info("%s: at most %d connections (%s per address), headers within %gs, "
                 "bodies within %gs and %d bytes", self.name, self.guard.cap,
                 self.limits.max_per_address or "no cap", self.limits.header_timeout,
                 self.limits.body_timeout, self.limits.max_body)

    async def close(self) -> None:
        """Stop accepting, cut waiting connections and end aiohttp's (in-flight ones are cut)."""
        loop = asyncio.get_running_loop()
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            loop.remove_reader(sock.fileno())
            sock.close()
        for task in list(self._opening):
            task.cancel()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        for conn in list(self.guard.waiting):
            self.guard.drop(conn)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def _accept(self, sock: socket.socket) -> None:
        """Accept what the kernel queued: refused connections are answered and closed on the
        raw socket (no transport is made for them), the others served."""
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    skipped = self._accept_errors.ready()
                    if skipped is not None:
                        log.warning("%s: accept() failed (%s): new connections wait in the "
                                    "backlog (%d more such failures since the last such "
                                    "line)", self.name, exc, skipped)
                    loop.remove_reader(sock.fileno())
                    loop.call_later(1.0, self._resume, sock)
                    return
                continue  # the client gave up while queued (ECONNABORTED and the like)
            address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            reply = self.guard.screen(address)
            if reply is not None:
                with contextlib.suppress(OSError):
                    conn.setblocking(False)
                    conn.send(reply)
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _serve(self, conn: socket.socket) -> None:
        factory = self._factory
        assert factory is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Connection(self.guard, factory), conn)
        except BaseException:
            conn.close()
            raise

    def _resume(self, sock: socket.socket) -> None:
        if sock in self._sockets:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock)

    async def _tick(self) -> None:
        """Cut connections past the header timeout; report refusals once a minute."""
        every = max(0.05, min(1.0, self.limits.header_timeout / 4))
        reported = time.monotonic()
        seen = (0, 0, 0)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            guard = self.guard
            guard.expire(now)
            counts = (guard.refused, guard.evicted, guard.timed_out)
            if counts != seen and now - reported >= REPORT_EVERY:
                log.warning("%s on port %d: %d connections refused at a cap, %d closed to "
                            "make room, %d cut for not sending headers in time (since the "
                            "last such line); %d open", self.name, self.port,
                            counts[0] - seen[0], counts[1] - seen[1], counts[2] - seen[2],
                            len(guard.open))
                seen, reported = counts, now

    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Enforce the body's size and time limits, and keep the guard's books per request."""
        from aiohttp import web

        guard = self.guard
        transport = request.transport
        conn = guard.open.get(transport) if transport is not None else None
        if conn is not None:
            guard.step(conn, _BODY)
        try:
            limit = 0 if request.method in ("GET", "HEAD") else self.limits.max_body
            length = request.content_length
            if length is not None and length > limit:
                return _closing(web.Response(status=413, text="request body too large\n"))
            if request.body_exists:
                try:
                    async with asyncio.timeout(self.limits.body_timeout):
                        body = await request.read()
                except TimeoutError:
                    return _closing(web.Response(status=408, text="request body too slow\n"))
                except ConnectionError:  # the client went away mid-body: nothing to answer
                    return _closing(web.Response(status=400, text="connection lost\n"))
                except web.HTTPRequestEntityTooLarge:
                    body = None
                if body is None or len(body) > limit:
                    return _closing(web.Response(status=413, text="request body too large\n"))
            if conn is not None:
                guard.step(conn, _BUSY)
            return await handler(request)
        finally:
            if conn is not None and transport is not None and guard.open.get(transport) is conn:
                guard.wait(conn, time.monotonic())


def _closing(response: web.Response) -> web.Response:
    response.force_close()
    return response


async def _bind(loop: asyncio.AbstractEventLoop, host: str | None,
                port: int) -> list[socket.socket]:
    """Listening, non-blocking sockets on every address ``host`` names (``None`` or ``""``:
    all of this host's)."""
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # a family this host lacks (IPv6 in some containers)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address "
                                         f"{address!r}: {exc.strerror}") from None
            sock.listen(BACKLOG)
            sock.setblocking(False)
        if not sockets:
            raise OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host!r}")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
