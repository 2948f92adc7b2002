"""A streamed Messages API call without the ``anthropic`` SDK on the hot path.

``client.messages.create(stream=True)`` copies and walks the request body on
each call, builds its headers layer by layer, goes through ``httpx``/``httpcore``'s
pool and ``anyio`` streams, and validates every streamed event into pydantic
models; importing the SDK at all loads every beta type (bench/README.md has the
figures). :func:`open_stream` sends the request over
``aiohttp``, which the channels already use, and parses the server-sent events
itself into :class:`Event` dicts that read like the SDK's event models
(``event.delta.text``; a field the server left out reads ``None``).

It serves two kinds of target:

* a :class:`Route` built by :meth:`Route.direct` from a configured key (the
  usual deployment): the SDK is never imported. Failures are this module's
  :class:`StatusFailure`, :class:`ConnectFailure`, :class:`RequestTimeout`,
  :class:`ReadTimeout` and :class:`ReadFailure`.
* an ``anthropic.AsyncAnthropic`` client (credentials the SDK finds itself):
  the same request with the headers that client would send, and the SDK's
  own exception types (:class:`anthropic.APIStatusError` subclasses,
  :class:`anthropic.APIConnectionError`, its HTTP package's ``ReadTimeout``
  and ``ReadError``), so callers classify them as the SDK's. Clients this
  does not cover (middleware, custom auth, a subclass such as Bedrock or
  Vertex) go through ``messages.create`` unchanged.

Nothing here retries: :mod:`plugins.provider_retry` does. The connections are
closed by :func:`close_streams` (the provider's ``aclose``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from weakref import WeakKeyDictionary, ref

import aiohttp

# Built-in: the request body's JSON, with the images' base64 spliced in.
from plugins.anthropic_body import encode_json, encode_messages
from roost import client_tls

if TYPE_CHECKING:
    import anthropic

__all__ = ["ConnectFailure", "Event", "EventStream", "ReadFailure",
           "ReadTimeout", "RequestTimeout", "Route", "SSEParser", "StatusFailure",
           "close_streams", "open_stream"]

_MESSAGES_PATH: Final = "/v1/messages"
API_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header a direct route sends (the SDK's)."""
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 600.0
"""The SDK's default timeouts, which a direct route keeps."""
_MAX_CONNECTIONS: Final = 1000
"""As the SDK's pool allows."""


class Event(dict[str, Any]):
    """A JSON object of the stream whose keys also read as attributes (missing: ``None``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


class StatusFailure(Exception):
    """The API answered with an error status, or an ``event: error`` inside a stream.

    ``status`` is the HTTP status (200 for an error event in a stream), ``body``
    the parsed JSON body (or its text), ``headers`` the response headers (names
    case-insensitive).
    """

    def __init__(self, message: str, *, status: int, body: object,
                 headers: Mapping[str, str]) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.headers = headers


class ConnectFailure(Exception):
    """The request could not be sent (refused, reset, DNS, TLS); caused by the transport's error."""


class RequestTimeout(Exception):
    """No response (status and headers) within the route's timeouts."""


class ReadTimeout(Exception):
    """The streamed body stalled longer than the read timeout."""


class ReadFailure(Exception):
    """The connection failed while the streamed body was read."""


class Route:
    """What every call of one target shares: URL, headers, timeouts, the HTTP session.

    Built by :meth:`direct` from a key (no SDK) or by :meth:`of_client` from an
    SDK client (its URL, headers and timeouts).
    """

    __slots__ = ("_client", "headers", "loop", "proxy", "session", "timeout", "url")

    def __init__(self, url: str, headers: dict[str, str], *, connect: float | None,
                 read: float | None, client: anthropic.AsyncAnthropic | None = None) -> None:
        self.url = url
        self.headers = headers
        self.timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)
        # Weak: the route is the value of ``_routes``, weakly keyed by this client.
        self._client = None if client is None else ref(client)
        self.session: aiohttp.ClientSession | None = None
        self.proxy = _env_proxy(url)
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def direct(cls, *, api_key: str | None = None, auth_token: str | None = None,
               base_url: str | None = None, user_agent: str = "roost") -> Route:
        """A route for a key (``X-Api-Key``) or a bearer token, as the SDK would send them."""
        headers = {"accept": "application/json", "content-type": "application/json",
                   "anthropic-version": API_VERSION, "user-agent": user_agent}
        if api_key is not None:
            headers["x-api-key"] = api_key
        if auth_token is not None:
            headers["authorization"] = f"Bearer {auth_token}"
        base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        return cls(base + _MESSAGES_PATH, headers, connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)

    @classmethod
    def of_client(cls, client: anthropic.AsyncAnthropic) -> Route:
        """The request ``client.messages.create`` would send on a first attempt."""
        httpx = _sdk_httpx()
        timeout = client.timeout
        if isinstance(timeout, httpx.Timeout):
            read, connect = timeout.read, timeout.connect
        else:
            read = connect = timeout
        # Values the caller ``Omit``-ted are left out.
        headers = {"x-stainless-retry-count": "0", "x-stainless-timeout": str(read)}
        if read is not None:
            headers["x-stainless-read-timeout"] = str(read)
        headers.update((k, v) for k, v in client.default_headers.items() if isinstance(v, str))
        return cls(str(client._prepare_url(_MESSAGES_PATH)), headers, connect=connect,
                   read=read, client=client)

    @property
    def client(self) -> anthropic.AsyncAnthropic | None:
        """The SDK client whose exception types failures take (``None``: this module's)."""
        return None if self._client is None else self._client()

    def session_for(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        session = self.session
        if session is None or session.closed or self.loop is not loop:
            # Not trust_env: aiohttp then reads the proxy variables and
            # ~/.netrc again for every request, in a worker thread.
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, ssl=client_tls()),
                timeout=self.timeout, skip_auto_headers=("User-Agent",))
            self.session, self.loop = session, loop
        return session

    async def close(self) -> None:
        """Close this route's connections."""
        session, self.session = self.session, None
        if session is not None and not session.closed:
            await session.close()

    # -- failures, as this module's types or (with a client) the SDK's ----------------

    def timed_out(self) -> Exception:
        if self.client is None:
            return RequestTimeout(f"no response from {self.url}")
        import anthropic
        return anthropic.APITimeoutError(request=self._sdk_request())

    def unreachable(self) -> Exception:
        if self.client is None:
            return ConnectFailure(f"could not connect to {self.url}")
        import anthropic
        return anthropic.APIConnectionError(request=self._sdk_request())

    def status_failure(self, response: aiohttp.ClientResponse, content: bytes) -> Exception:
        if self.client is not None:
            return self.client._make_status_error_from_response(
                self._sdk_response(response, content))
        body: object
        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = content.decode(errors="replace")
        message = f"Error code: {response.status}" + (f" - {body}" if body else "")
        return StatusFailure(message, status=response.status, body=body,
                             headers=response.headers)

    def stream_failure(self, response: aiohttp.ClientResponse, data: bytes) -> Exception:
        """An ``event: error`` of a stream: the status error its body describes."""
        body: object
        try:
            body = json.loads(data)
            message = f"{body}"
        except ValueError:
            body = data.decode(errors="replace")
            message = str(body) or f"Error code: {response.status}"
        if self.client is not None:
            return self.client._make_status_error(
                message, body=body, response=self._sdk_response(response, b""))
        return StatusFailure(message, status=response.status, body=body,
                             headers=response.headers)

    def read_timeout(self, text: str) -> Exception:
        return _sdk_httpx().ReadTimeout(text) if self.client is not None else ReadTimeout(text)

    def read_failure(self, text: str) -> Exception:
        return _sdk_httpx().ReadError(text) if self.client is not None else ReadFailure(text)

    def _sdk_request(self) -> Any:
        """The request as the SDK's exceptions carry it (they name its method and URL)."""
        return _sdk_httpx().Request("POST", self.url)

    def _sdk_response(self, response: aiohttp.ClientResponse, content: bytes) -> Any:
        """``response`` as the ``httpx`` response the SDK's status errors carry."""
        return _sdk_httpx().Response(
            response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            content=content, request=self._sdk_request())


def _sdk_httpx() -> Any:
    """The SDK's HTTP package (httpx2 in SDK 1.x/2.x, httpx in 0.x): its requests and
    responses go into the SDK's exceptions, and its transport errors are what the
    providers recognise as a failed stream. Imported only for an SDK client."""
    import anthropic._base_client
    return (getattr(anthropic._base_client, "httpx2", None)
            or getattr(anthropic._base_client, "httpx"))  # noqa: B009


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


_routes: WeakKeyDictionary[anthropic.AsyncAnthropic, Route | None] = WeakKeyDictionary()


def _route(client: anthropic.AsyncAnthropic) -> Route | None:
    """The shared request parts for ``client``, or ``None`` when the SDK must send the call."""
    try:
        return _routes[client]
    except KeyError:
        pass
    import anthropic
    route = None
    if (type(client) is anthropic.AsyncAnthropic and not client.middleware
            and client.custom_auth is None):
        route = Route.of_client(client)
    _routes[client] = route
    return route


async def close_streams(target: Route | anthropic.AsyncAnthropic) -> None:
    """Close the connections :func:`open_stream` opened for ``target``."""
    route = target if isinstance(target, Route) else _routes.get(target)
    if route is not None:
        await route.close()


async def open_stream(
    target: Route | anthropic.AsyncAnthropic,
    *,
    model: str,
    max_tokens: int,
    system: list[Any],
    messages: list[Any],
    tools: list[Any],
    encoded: tuple[str, str] | None = None,
) -> EventStream | anthropic.AsyncStream[Any]:
    """Send a streamed Messages API call; ``system`` and ``tools`` are left out when empty.

    ``encoded`` is ``system`` and ``tools`` already JSON-encoded (by
    :func:`encode_json`; ``""`` for an empty one), which the same agent sends
    unchanged with every call. The response has begun (status and headers read)
    when this returns; an error status raises here. Use the result with
    ``async with`` so the response is closed on every exit.
    """
    route = target if isinstance(target, Route) else _route(target)
    if route is None:
        import anthropic
        assert not isinstance(target, Route)
        return await target.messages.create(
            model=model, max_tokens=max_tokens, system=system or anthropic.omit,
            messages=messages, tools=tools or anthropic.omit, stream=True)
    system_json, tools_json = encoded if encoded is not None else (
        encode_json(system) if system else "", encode_json(tools) if tools else "")
    # The body the SDK sends, with the parts encoded once spliced in.
    head = "".join(('{"model":', encode_json(model), ',"max_tokens":', encode_json(max_tokens),
                    ',"messages":'))
    tail = "".join((*((',"system":', system_json) if system_json else ()),
                    *((',"tools":', tools_json) if tools_json else ()),
                    ',"stream":true}'))
    data = b"".join((head.encode(), *encode_messages(messages), tail.encode()))
    session = route.session_for(asyncio.get_running_loop())
    try:
        response = await session.post(route.url, data=data, headers=route.headers,
                                      proxy=route.proxy)
    except TimeoutError as exc:
        raise route.timed_out() from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise route.unreachable() from exc
    if response.status >= 300:
        try:
            content = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            content = b""
        finally:
            response.release()
        raise route.status_failure(response, content)
    return EventStream(route, response)


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

    __slots__ = ("_done", "_failed", "_parser", "_pending", "_route", "response")

    def __init__(self, route: Route, response: aiohttp.ClientResponse) -> None:
        self._route = route
        self.response = response
        self._parser = SSEParser()
        self._pending: deque[Event] = deque()
        self._done = False
        self._failed: Exception | None = None

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
                raise self._route.read_timeout(str(exc) or "timed out reading the stream") \
                    from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise self._route.read_failure(_describe(exc)) from exc
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
                # Raised once the events before it were handed out.
                self._failed = self._route.stream_failure(self.response, data)
                return
            if data:
                self._pending.append(json.loads(data, object_hook=Event))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
