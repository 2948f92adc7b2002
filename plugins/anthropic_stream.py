"""A streamed Messages API call without the ``anthropic`` SDK's per-call work.

``client.messages.create(stream=True)`` costs about as much CPU as the rest of a
chat turn together: each call copies and walks the request body, builds its
headers layer by layer, goes through ``httpx``/``httpcore``'s pool and
``anyio`` streams, and validates every streamed event into pydantic models.
:func:`open_stream` sends the same request (the headers the SDK would send,
computed once per client; its base URL and timeouts) over ``aiohttp``, which
the channels already use and which costs a fraction per call, and parses the
server-sent events itself into :class:`Event` dicts that read like the SDK's
event models (``event.delta.text``; a field the server left out reads
``None``).

Failures keep the SDK's types, so callers classify them as before: a failure
to send is :class:`anthropic.APIConnectionError` or
:class:`anthropic.APITimeoutError` (caused by the transport's exception), an
error status or an ``event: error`` in the stream is the SDK's own
:class:`anthropic.APIStatusError` subclass for it, and a failure while reading
the body is a transport error of the SDK's HTTP package (``ReadTimeout``,
``ReadError``), as the SDK's stream raises. Nothing here retries: :mod:`plugins.provider_retry`
does.

Clients this does not cover (middleware, custom auth, a subclass such as
Bedrock or Vertex) go through ``messages.create`` unchanged. The connections
are closed by :func:`close_streams` (the provider's ``aclose``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final
from weakref import WeakKeyDictionary

import aiohttp
import anthropic
import anthropic._base_client
import certifi

__all__ = ["Event", "EventStream", "SSEParser", "close_streams", "open_stream"]

# The SDK's HTTP package (httpx2 in SDK 1.x/2.x, httpx in 0.x): its requests and
# responses go into the SDK's exceptions, and its transport errors are what the
# providers recognise as a failed stream.
httpx: Any = (getattr(anthropic._base_client, "httpx2", None)
              or getattr(anthropic._base_client, "httpx"))  # noqa: B009

_MESSAGES_PATH: Final = "/v1/messages"
_MAX_CONNECTIONS: Final = 1000
"""As the SDK's pool allows."""


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


@functools.cache
def tls_context() -> ssl.SSLContext:
    """certifi's CA bundle, as the SDK's httpx client takes it (a slim image may have
    no system CAs); one per process.

    Loading the bundle takes ~20 ms: the provider builds it when it is built
    (in ``roost run``'s warm-up thread), not inside the first reply.
    """
    return ssl.create_default_context(cafile=certifi.where())


class _Route:
    """What every call of one client shares: URL, headers, timeouts, the HTTP session."""

    __slots__ = ("headers", "loop", "proxy", "session", "timeout", "url")

    def __init__(self, client: anthropic.AsyncAnthropic) -> None:
        self.url = str(client._prepare_url(_MESSAGES_PATH))
        timeout = client.timeout
        if isinstance(timeout, httpx.Timeout):
            read, connect = timeout.read, timeout.connect
        else:
            read = connect = timeout
        self.timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)
        # The headers ``messages.create`` sends on a first attempt, values the
        # caller ``Omit``-ted left out.
        headers = {"x-stainless-retry-count": "0", "x-stainless-timeout": str(read)}
        if read is not None:
            headers["x-stainless-read-timeout"] = str(read)
        headers.update((k, v) for k, v in client.default_headers.items() if isinstance(v, str))
        self.headers = headers
        self.session: aiohttp.ClientSession | None = None
        self.proxy = _env_proxy(self.url)
        self.loop: asyncio.AbstractEventLoop | None = None

    def session_for(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        session = self.session
        if session is None or session.closed or self.loop is not loop:
            # Not trust_env: aiohttp then reads the proxy variables and
            # ~/.netrc again for every request, in a worker thread.
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, ssl=tls_context()),
                timeout=self.timeout, skip_auto_headers=("User-Agent",))
            self.session, self.loop = session, loop
        return session


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``...), read once."""
    proxies = urllib.request.getproxies_environment()
    parts = urllib.parse.urlsplit(url)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    # (In urllib.request on every platform, though not in its type stubs.)
    bypass = getattr(urllib.request, "proxy_bypass_environment")  # noqa: B009
    if proxy is None or bypass(parts.hostname or "", proxies):
        return None
    return proxy


_routes: WeakKeyDictionary[anthropic.AsyncAnthropic, _Route | None] = WeakKeyDictionary()


def _route(client: anthropic.AsyncAnthropic) -> _Route | None:
    """The shared request parts for ``client``, or ``None`` when the SDK must send the call."""
    try:
        return _routes[client]
    except KeyError:
        pass
    route = None
    if (type(client) is anthropic.AsyncAnthropic and not client.middleware
            and client.custom_auth is None):
        route = _Route(client)
    _routes[client] = route
    return route


async def close_streams(client: anthropic.AsyncAnthropic) -> None:
    """Close the connections :func:`open_stream` opened for ``client``."""
    route = _routes.get(client)
    if route is not None and route.session is not None:
        session, route.session = route.session, None
        if not session.closed:
            await session.close()


def _request(route: _Route) -> httpx.Request:
    """The request as the SDK's exceptions carry it (they name its method and URL)."""
    return httpx.Request("POST", route.url)


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
    data = _encode(body).encode()
    session = route.session_for(asyncio.get_running_loop())
    try:
        response = await session.post(route.url, data=data, headers=route.headers,
                                      proxy=route.proxy)
    except TimeoutError as exc:
        raise anthropic.APITimeoutError(request=_request(route)) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise anthropic.APIConnectionError(request=_request(route)) from exc
    if response.status >= 300:
        try:
            content = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            content = b""
        finally:
            response.release()
        raise client._make_status_error_from_response(_as_httpx(route, response, content))
    return EventStream(client, route, response)


def _as_httpx(route: _Route, response: aiohttp.ClientResponse, content: bytes) -> httpx.Response:
    """``response`` as the ``httpx`` response the SDK's status errors carry (headers, body)."""
    return httpx.Response(
        response.status,
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
        content=content, request=_request(route))


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

    __slots__ = ("_client", "_done", "_failed", "_parser", "_pending", "_route", "response")

    def __init__(self, client: anthropic.AsyncAnthropic, route: _Route,
                 response: aiohttp.ClientResponse) -> None:
        self._client = client
        self._route = route
        self.response = response
        self._parser = SSEParser()
        self._pending: deque[Event] = deque()
        self._done = False
        self._failed: anthropic.APIStatusError | None = None

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._done:
            self.response.release()  # read to the end: the connection serves the next call
        else:
            self.response.close()  # left mid-stream (cancelled, failed): drop the connection

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        pending = self._pending
        while not pending:
            if self._failed is not None:
                raise self._failed
            if self._done:
                raise StopAsyncIteration
            try:
                chunk = await self.response.content.readany()
            except TimeoutError as exc:
                raise httpx.ReadTimeout(str(exc) or "timed out reading the stream") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise httpx.ReadError(_describe(exc)) from exc
            if chunk:
                self._take(self._parser.feed(chunk))
            else:
                self._done = True
                self._take(self._parser.close())
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
                    message = str(body) or f"Error code: {self.response.status}"
                # Raised once the events before it were handed out.
                response = _as_httpx(self._route, self.response, b"")
                self._failed = self._client._make_status_error(
                    message, body=body, response=response)
                return
            if data:
                self._pending.append(json.loads(data, object_hook=Event))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
