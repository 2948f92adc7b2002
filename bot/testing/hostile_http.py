"""Hostile HTTP clients for tests and benchmarks: slow-loris connections, held bodies.

Loopback only: every connection goes to ``127.0.0.1`` from a chosen ``127.0.0.x``
source address (Linux routes all of ``127.0.0.0/8`` to the loopback device), so one
process can stand in for many clients. Callers close what they opened
(:func:`close_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import random
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass

_PORTS = itertools.count(random.randrange(22_000))
"""Source ports below Linux's ephemeral range (32768-60999): thousands of connections
never take a port another test was just handed as free (and is about to bind)."""

SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: roost\r\nX-Slow: "
"""The start of a request whose headers never end."""


@dataclass(slots=True)
class Held:
    """One connection the client keeps open."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: str


def raise_own_open_files(need: int) -> None:
    """Raise this process's open-file soft limit to at least ``need`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        top = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


async def hold(port: int, address: str, head: bytes = SLOW_HEAD) -> Held | None:
    """Connect to ``127.0.0.1:port`` from ``address`` and send ``head``; ``None`` when the
    connection could not be made or was cut at once."""
    try:
        async with asyncio.timeout(10):  # a hang guard: a full backlog retries SYNs
            reader, writer = await _connect(port, address)
            writer.write(head)
            await writer.drain()
    except (OSError, TimeoutError):
        return None
    return Held(reader, writer, address)


async def _connect(port: int, address: str) -> tuple[asyncio.StreamReader,
                                                      asyncio.StreamWriter]:
    for _ in range(4):
        source = 10_000 + next(_PORTS) % 22_000
        try:
            return await asyncio.open_connection("127.0.0.1", port,
                                                 local_addr=(address, source))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free source port")


async def flood(port: int, count: int, addresses: Sequence[str], *, head: bytes = SLOW_HEAD,
                parallel: int = 100) -> list[Held | None]:
    """Open ``count`` connections sending ``head``, round-robin over ``addresses``."""
    gate = asyncio.Semaphore(parallel)

    async def one(i: int) -> Held | None:
        async with gate:
            return await hold(port, addresses[i % len(addresses)], head)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def outcome(held: Held, limit: float) -> bytes | None:
    """What the server sent before it closed ``held`` (``b""`` when it sent nothing or reset
    it), or ``None`` if it was still open after ``limit`` seconds."""
    received = b""
    try:
        async with asyncio.timeout(limit):
            while chunk := await held.reader.read(65536):
                received += chunk
    except TimeoutError:
        return None
    except OSError:
        pass
    return received


def close_all(helds: Sequence[Held | None]) -> None:
    """Close every connection in ``helds``."""
    for held in helds:
        if held is not None:
            with contextlib.suppress(Exception):
                held.writer.transport.abort()


async def request(port: int, raw: bytes, *, address: str = "127.0.0.1",
                  limit: float = 30.0) -> tuple[bytes, float]:
    """Send ``raw`` (one whole request, ``Connection: close``) and read the answer to its end;
    the answer (``b""`` when the server reset the connection) and the seconds it took from
    connecting."""
    began = time.perf_counter()
    async with asyncio.timeout(limit):  # a hang guard
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(address, 0))
        try:
            writer.write(raw)
            answer = await reader.read()
        except ConnectionResetError:
            answer = b""  # refused: closed with the request unread, so reset
        finally:
            writer.transport.abort()
    return answer, time.perf_counter() - began


def get(path: str) -> bytes:
    """A whole ``GET path`` request that closes its connection."""
    return f"GET {path} HTTP/1.1\r\nHost: roost\r\nConnection: close\r\n\r\n".encode()


def status(answer: bytes) -> int:
    """The status code of a raw HTTP answer (0 when there is none)."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
