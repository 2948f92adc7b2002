"""Plumbing shared by the fake API servers; the wire formats live in their own modules.

:class:`FakeServer` runs an aiohttp app on a free port of 127.0.0.1, keeps the
FIFO of scripted responses, records every request and counts clients that
hang up mid-stream. A protocol module subclasses it once, sets the route,
implements ``_handle`` and adds its own ``reply``/``fail`` helpers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar

from aiohttp import web

__all__ = [
    "DropConnection",
    "FakeServer",
    "ReceivedRequest",
    "drop_after",
    "json_error",
    "open_sse",
    "split_json",
    "split_words",
    "sse",
]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """What the fake received: path, headers (lower-cased names), JSON body, API key."""

    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]
    api_key: str | None


@dataclass(frozen=True, slots=True)
class DropConnection:
    """A stream that starts, emits ``text_before`` (if any), then loses its connection."""

    text_before: str = ""


class FakeServer(Generic[S]):
    """An aiohttp server on 127.0.0.1 answering ``POST route`` from a script of ``S`` items.

    ``api_key`` and ``model`` are kept for the subclass, which decides what a
    valid key is and which model to name in answers.
    """

    route: ClassVar[str]
    """The path served, e.g. ``/v1/messages``."""
    url_suffix: ClassVar[str] = ""
    """Appended to ``http://127.0.0.1:port`` in :attr:`base_url`, as the SDK expects."""
    max_body: ClassVar[int] = 32 * 1024 * 1024
    """The largest request body accepted: the real APIs take 32 MB (images, PDFs
    as base64), far over aiohttp's 1 MB default."""

    def __init__(self, *, api_key: str | None, model: str) -> None:
        self.api_key = api_key
        self.model = model
        self.requests: list[ReceivedRequest] = []
        """Every request received, in order (including rejected ones)."""
        self.disconnects = 0
        """How many streamed responses the client abandoned before they finished."""
        self.disconnected = asyncio.Event()
        """Set the first time a client abandons a streamed response."""
        self.request_received = asyncio.Event()
        """Set each time a request arrives; clear it to wait for the next one."""
        self._script: deque[S | DropConnection] = deque()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._port = 0

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(self.route, self._handle)
        # Cancel the handler when the client goes away so a disconnect is seen
        # at once, not at the next write.
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop serving and release the port."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://127.0.0.1:{self._port}{self.url_suffix}"

    # -- scripting ---------------------------------------------------------

    def enqueue(self, item: S | DropConnection) -> None:
        """Append any scripted response to the FIFO."""
        self._script.append(item)

    def drop_connection(self, *, text_before: str = "") -> None:
        """Enqueue a stream that sends ``text_before`` then closes the socket mid-body."""
        self.enqueue(DropConnection(text_before))

    @property
    def pending(self) -> int:
        """How many scripted responses are still queued."""
        return len(self._script)

    @property
    def last_request(self) -> ReceivedRequest:
        """The most recent request (raises if none arrived)."""
        if not self.requests:
            raise AssertionError(f"{type(self).__name__} received no request")
        return self.requests[-1]

    # -- serving -----------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        """Read and record the request's JSON body; wake :attr:`request_received`."""
        body: dict[str, Any] = await request.json()
        self.requests.append(
            ReceivedRequest(
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                api_key=api_key,
            )
        )
        self.request_received.set()
        return body

    def _next_item(self) -> S | DropConnection | None:
        """The next scripted response, or ``None`` if the test scripted too few."""
        return self._script.popleft() if self._script else None

    async def _send(
        self,
        response: web.StreamResponse,
        frames: Iterable[bytes],
        delay: float,
        *,
        trailer: bytes = b"",
    ) -> None:
        """Write ``frames`` (sleeping ``delay`` before each), then ``trailer``, then EOF.

        Counts a disconnect if the client leaves before the end.
        """
        try:
            for frame in frames:
                if delay:
                    await asyncio.sleep(delay)
                await response.write(frame)
            if trailer:
                await response.write(trailer)
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.disconnects += 1
            self.disconnected.set()
            raise


def split_words(text: str) -> list[str]:
    """``text`` as word-sized deltas, each word with its surrounding spaces."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def split_json(raw: str, size: int) -> list[str]:
    """``raw`` in ``size``-character pieces (none for an empty string)."""
    # Small pieces so a partial fragment is never valid JSON on its own: the
    # client must join them before parsing.
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def sse(data: Mapping[str, Any], event: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` as JSON, named ``event`` if given."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


async def open_sse(request: web.Request) -> web.StreamResponse:
    """Start a 200 ``text/event-stream`` response."""
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await response.prepare(request)
    return response


async def drop_after(request: web.Request, frames: Iterable[bytes]) -> web.StreamResponse:
    """Start a stream, write ``frames``, then close the socket without ending the body."""
    transport = request.transport
    response = await open_sse(request)
    for frame in frames:
        await response.write(frame)
    if transport is not None:
        transport.close()
    return response


def json_error(
    status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> web.Response:
    """An error answer with JSON ``payload`` (the API's own error envelope)."""
    return web.Response(
        status=status,
        body=json.dumps(payload).encode(),
        content_type="application/json",
        headers=dict(headers or {}),
    )
