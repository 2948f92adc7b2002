"""A streamed Messages API call over the ``anthropic`` SDK's HTTP client, minus its per-call work.

``client.messages.create(stream=True)`` costs about as much CPU as the rest of a
chat turn together: each call copies and walks the request body, builds its
headers layer by layer, and validates every streamed event into pydantic
models. :func:`open_stream` sends the same request through the same
``httpx`` client (its connection pool, timeouts, proxies and any custom auth)
with the headers the SDK would send, computed once per client, and parses the
server-sent events itself into :class:`Event` dicts that read like the SDK's
event models (``event.delta.text``; a field the server left out reads
``None``).

Failures keep the SDK's types, so callers classify them as before: a failure
to send is :class:`anthropic.APIConnectionError` or
:class:`anthropic.APITimeoutError` (caused by the transport's exception), an
error status or an ``event: error`` in the stream is the SDK's own
:class:`anthropic.APIStatusError` subclass for it, and errors while reading
the body come from the HTTP stack unwrapped, as with the SDK. Nothing here
retries: :mod:`plugins.provider_retry` does.

Clients this does not cover (middleware, a subclass such as Bedrock or
Vertex) go through ``messages.create`` unchanged.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Final
from weakref import WeakKeyDictionary

import anthropic
import httpx2

__all__ = ["Event", "EventStream", "SSEParser", "open_stream"]

_MESSAGES_PATH: Final = "/v1/messages"


class Event(dict[str, Any]):
    """A JSON object of the stream whose keys also read as attributes (missing: ``None``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def _jsonable(value: object) -> object:
    """What the C encoder cannot take itself: mappings and sequences of other types."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                           default=_jsonable).encode


class _Route:
    """What every call of one client shares: URL, headers, timeout, auth."""

    __slots__ = ("auth", "client", "headers", "http", "timeout", "url")

    def __init__(self, client: anthropic.AsyncAnthropic) -> None:
        self.client = client
        self.http: httpx2.AsyncClient = client._client
        self.url = client._prepare_url(_MESSAGES_PATH)
        timeout = client.timeout
        self.timeout = timeout
        read = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
        # The headers ``messages.create`` sends on a first attempt, values the
        # caller ``Omit``-ted left out.
        headers = {"x-stainless-retry-count": "0", "x-stainless-timeout": str(read)}
        if read is not None:
            headers["x-stainless-read-timeout"] = str(read)
        headers.update((k, v) for k, v in client.default_headers.items() if isinstance(v, str))
        self.headers = headers
        self.auth = client.custom_auth


_routes: WeakKeyDictionary[anthropic.AsyncAnthropic, _Route | None] = WeakKeyDictionary()


def _route(client: anthropic.AsyncAnthropic) -> _Route | None:
    """The shared request parts for ``client``, or ``None`` when the SDK must send the call."""
    try:
        return _routes[client]
    except KeyError:
        pass
    route = None
    if type(client) is anthropic.AsyncAnthropic and not client.middleware:
        route = _Route(client)
    _routes[client] = route
    return route


async def open_stream(
    client: anthropic.AsyncAnthropic,
    *,
    model: str,
    max_tokens: int,
    system: list[Any],
    messages: list[Any],
    tools: list[Any],
) -> EventStream | anthropic.AsyncStream[Any]:
    """Send a streamed Messages API call; ``system`` and ``tools`` are left out when empty.

    The response has begun (status and headers read) when this returns; an
    error status raises here. Use the result with ``async with`` so the
    response is closed on every exit.
    """
    route = _route(client)
    if route is None:
        return await client.messages.create(
            model=model, max_tokens=max_tokens, system=system or anthropic.omit,
            messages=messages, tools=tools or anthropic.omit, stream=True)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = tools
    body["stream"] = True
    request = route.http.build_request(
        "POST", route.url, headers=route.headers, content=_encode(body).encode(),
        timeout=route.timeout)
    try:
        if route.auth is not None:
            response = await route.http.send(request, stream=True, auth=route.auth)
        else:
            response = await route.http.send(request, stream=True)
    except httpx2.TimeoutException as exc:
        raise anthropic.APITimeoutError(request=request) from exc
    except Exception as exc:
        raise anthropic.APIConnectionError(request=request) from exc
    if not response.is_success:
        try:
            await response.aread()
        finally:
            await response.aclose()
        raise client._make_status_error_from_response(response)
    return EventStream(client, response)


class SSEParser:
    """Splits a server-sent event stream into ``(event, data)`` pairs, chunk by chunk.

    Lines may end in LF, CRLF or CR; ``data`` lines of one event are joined
    with LF; comments and other fields are ignored.
    """

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        """The events completed by ``chunk``."""
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buffer:
            # A CR at the very end may be the first half of a CRLF.
            tail = buffer.endswith(b"\r")
            if tail:
                buffer = buffer[:-1]
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if tail:
                buffer += b"\r"
        *blocks, self._buffer = buffer.split(b"\n\n")
        return [event for block in blocks if (event := _event(block)) is not None]

    def close(self) -> list[tuple[str | None, bytes]]:
        """The event the stream ended in without a blank line, if any."""
        rest, self._buffer = self._buffer.rstrip(b"\r"), b""
        event = _event(rest) if rest.strip() else None
        return [event] if event is not None else []


def _event(block: bytes) -> tuple[str | None, bytes] | None:
    name: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            value = line[7:] if line[6:7] == b" " else line[6:]
            name = value.decode()
    if name is None and not data:
        return None
    return name, b"\n".join(data)


class EventStream:
    """The events of one streamed response, as :class:`Event` dicts; closes the response on exit."""

    __slots__ = ("_chunks", "_client", "_done", "_parser", "_pending", "response")

    def __init__(self, client: anthropic.AsyncAnthropic, response: httpx2.Response) -> None:
        self._client = client
        self.response = response
        self._chunks: AsyncIterator[bytes] | None = None
        self._parser = SSEParser()
        self._pending: deque[Event] = deque()
        self._done = False

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.response.aclose()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        pending = self._pending
        while not pending:
            if self._done:
                raise StopAsyncIteration
            if self._chunks is None:
                self._chunks = self.response.aiter_bytes()
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._done = True
                self._take(self._parser.close())
            else:
                self._take(self._parser.feed(chunk))
        return pending.popleft()

    def _take(self, events: list[tuple[str | None, bytes]]) -> None:
        for name, data in events:
            # As the SDK's AsyncStream: pings and unnamed events are skipped,
            # an error event raises the status error its body describes.
            if name is None or name == "ping":
                continue
            if name == "error":
                body: object
                try:
                    body = json.loads(data)
                    message = f"{body}"
                except ValueError:
                    body = data.decode(errors="replace")
                    message = str(body) or f"Error code: {self.response.status_code}"
                raise self._client._make_status_error(message, body=body, response=self.response)
            if data:
                self._pending.append(json.loads(data, object_hook=Event))
