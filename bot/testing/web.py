"""Local fakes for the web tools: a website, and the SearXNG, Brave and Tavily search APIs.

Each is an aiohttp server on a free port of 127.0.0.1 speaking the real thing's
HTTP, so the web tools run unchanged against it (with ``allow_private =
["127.0.0.1/32"]`` in the web plugin's table for the site, and the API bases pointed
at the fakes)::

    async with FakeSite() as site:
        site.page("/", "<html><head><title>Hi</title></head><body>...</body></html>")
        site.redirect("/old", "/")
        url = site.url("/old")

    async with FakeBrave(api_key="k") as brave:
        brave.results([Hit("Roost", "https://roost.example/", "an agent")])
        # [plugins."plugins.web"] brave_api_key = "k", brave_api_base = brave.base_url

:class:`FakeSite` records every request it serves (``requests``: path, Host
header...). ``page``, ``redirect``, ``fail``, ``fail_first`` (the next requests
fail, then the path answers as set up), ``hang`` (never answers) and ``endless``
(a body that never ends, without a length) set up its paths; with
``tls=`` (a :class:`TestCA` certificate) it serves https. The API fakes answer
each request from a FIFO script of hits or failures (``results``, ``fail``),
else with :attr:`default_hits` made from the query, check their key like the
real service, and answer errors in the service's own JSON shape.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

__all__ = [
    "ApiFailure",
    "FakeBrave",
    "FakeSearxng",
    "FakeSite",
    "FakeTavily",
    "Hit",
    "SeenRequest",
    "TestCA",
]


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """One request a fake received."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    """Lower-cased names."""
    body: bytes = b""

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class _Local:
    """An aiohttp app on a free port of 127.0.0.1, started and stopped as a context."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[SeenRequest] = []
        """Every request received, oldest first."""
        self._tls = tls
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._closing = asyncio.Event()

    def _routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Bind to a free port of 127.0.0.1 and serve."""
        app = web.Application()
        self._routes(app)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._tls)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Release hanging requests, stop serving and free the port."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port served."""
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http(s)://127.0.0.1:<port>``."""
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    async def _record(self, request: web.Request) -> SeenRequest:
        seen = SeenRequest(request.method, request.path, dict(request.query),
                           {k.lower(): v for k, v in request.headers.items()},
                           await request.read())
        self.requests.append(seen)
        return seen


# ----------------------------------------------------------------------- the website


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    mode: str = "plain"  # plain | hang | endless


class FakeSite(_Local):
    """A website on 127.0.0.1 whose paths the test sets up; others answer 404.

    ``abandoned`` is set when a client stops reading an :meth:`endless` body.
    """

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls=tls)
        self._paths: dict[str, _Answer] = {}
        self._failures: dict[str, deque[int]] = {}
        self.abandoned = asyncio.Event()
        self.sent_bytes = 0
        """Bytes of :meth:`endless` bodies written so far."""

    def url(self, path: str = "/", host: str | None = None) -> str:
        """The URL of ``path``, on ``host`` (a name for an injected resolver) if given."""
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{host or '127.0.0.1'}:{self.port}{path}"

    def page(self, path: str, body: str | bytes, *,
             content_type: str = "text/html; charset=utf-8", status: int = 200,
             headers: Mapping[str, str] | None = None) -> None:
        """Serve ``body`` at ``path`` (with a ``Content-Length``)."""
        data = body.encode("utf-8") if isinstance(body, str) else body
        self._paths[path] = _Answer(status, data, {"Content-Type": content_type,
                                                   **(headers or {})})

    def redirect(self, path: str, location: str, *, status: int = 302) -> None:
        """Answer ``path`` with a redirect to ``location`` (relative or absolute)."""
        self._paths[path] = _Answer(status, b"", {"Location": location})

    def fail(self, path: str, status: int, *, headers: Mapping[str, str] | None = None) -> None:
        """Answer ``path`` with an HTML error page of ``status``."""
        self.page(path, f"<html><body><h1>Error {status}</h1></body></html>", status=status,
                  headers=headers)

    def fail_first(self, path: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests for ``path`` with ``status``, then as set up."""
        self._failures.setdefault(path, deque()).extend([status] * times)

    def hang(self, path: str) -> None:
        """Accept requests for ``path`` and never answer them (until the site stops)."""
        self._paths[path] = _Answer(mode="hang")

    def endless(self, path: str, *, content_type: str = "text/plain") -> None:
        """Stream a body at ``path`` that never ends, without a ``Content-Length``."""
        self._paths[path] = _Answer(headers={"Content-Type": content_type}, mode="endless")

    def hosts(self) -> list[str]:
        """The ``Host`` header of each request, oldest first."""
        return [r.headers.get("host", "") for r in self.requests]

    def _routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._serve)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        failures = self._failures.get(request.path)
        if failures:
            status = failures.popleft()
            return web.Response(status=status, text=f"<html><body>{status}</body></html>",
                                content_type="text/html")
        answer = self._paths.get(request.path)
        if answer is None:
            return web.Response(status=404, text="<html><body>Not Found</body></html>",
                                content_type="text/html")
        if answer.mode == "hang":
            await self._closing.wait()
            return web.Response(status=503)
        if answer.mode == "endless":
            return await self._endless(request, answer)
        return web.Response(status=answer.status, body=answer.body, headers=dict(answer.headers))

    async def _endless(self, request: web.Request, answer: _Answer) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=dict(answer.headers))
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"x" * 65_536
        try:
            while not self._closing.is_set():
                await response.write(chunk)
                self.sent_bytes += len(chunk)
        except (ConnectionError, asyncio.CancelledError):
            self.abandoned.set()
            raise
        return response


class TestCA:
    """A throwaway certificate authority for https fakes (EC keys: quick to make).

    ``server_context(*names)`` is an ``ssl.SSLContext`` serving a certificate for
    ``names`` signed by this CA; ``client_context()`` trusts only this CA.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Roost test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._name = name
        self._cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))

    def _pem(self) -> str:
        from cryptography.hazmat.primitives import serialization

        return self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA alone (hostnames checked)."""
        return ssl.create_default_context(cadata=self._pem())

    def server_context(self, *names: str) -> ssl.SSLContext:
        """A server context with a certificate for ``names`` (DNS names or IPs)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self._name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as folder:
            cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                                  + self._pem().encode("ascii"))
            key_file.write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()))
            context.load_cert_chain(cert_file, key_file)
        return context


# ----------------------------------------------------------------------- search APIs


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result a fake API returns."""

    title: str
    url: str
    snippet: str = ""


@dataclass(frozen=True, slots=True)
class ApiFailure:
    """A scripted error answer: ``status`` and the service's message."""

    status: int
    message: str = "scripted failure"
    headers: Mapping[str, str] = field(default_factory=dict)


class _SearchApi(_Local):
    """A search API answering from a FIFO of hit lists and failures."""

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key
        self._script: deque[Sequence[Hit] | ApiFailure] = deque()

    def results(self, hits: Sequence[Hit]) -> None:
        """Answer the next search with ``hits``."""
        self._script.append(list(hits))

    def fail(self, status: int, message: str = "scripted failure", *,
             headers: Mapping[str, str] | None = None) -> None:
        """Answer the next search with an error ``status`` in the service's JSON shape."""
        self._script.append(ApiFailure(status, message, dict(headers or {})))

    @staticmethod
    def default_hits(query: str, count: int = 10) -> list[Hit]:
        """What an unscripted search returns: ``count`` hits naming ``query``."""
        return [Hit(f"{query} — result {i}", f"https://example.com/{i}",
                    f"Page {i} about {query}.") for i in range(1, count + 1)]

    def _next(self, query: str) -> Sequence[Hit] | ApiFailure:
        return self._script.popleft() if self._script else self.default_hits(query)


class FakeSearxng(_SearchApi):
    """SearXNG's ``GET /search``: ``format=json`` answers JSON unless ``json_enabled`` is
    false (then 403, as an instance without json in ``search.formats``)."""

    def __init__(self, *, json_enabled: bool = True) -> None:
        super().__init__()
        self.json_enabled = json_enabled

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/search", self._search)

    async def _search(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        query = seen.query.get("q", "")
        if seen.query.get("format") != "json":
            return web.Response(text="<html><body>results</body></html>",
                                content_type="text/html")
        if not self.json_enabled:
            return web.Response(status=403, text="Forbidden", content_type="text/plain")
        if not query:
            return web.Response(status=400, text="Bad Request", content_type="text/plain")
        item = self._next(query)
        if isinstance(item, ApiFailure):
            return web.Response(status=item.status, text=item.message,
                                content_type="text/plain", headers=dict(item.headers))
        results = [{"url": h.url, "title": h.title, "content": h.snippet, "engine": "duckduckgo",
                    "engines": ["duckduckgo", "brave"], "positions": [i], "score": 1.0 / i,
                    "category": "general", "template": "default.html"}
                   for i, h in enumerate(item, 1)]
        return web.json_response({"query": query, "number_of_results": 0, "results": results,
                                  "answers": [], "corrections": [], "infoboxes": [],
                                  "suggestions": [], "unresponsive_engines": []})


class FakeBrave(_SearchApi):
    """Brave Search's ``GET /res/v1/web/search`` (``X-Subscription-Token``; ``count`` ≤ 20).

    Descriptions mark the query's words with ``<strong>``, as Brave does.
    """

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/res/v1/web/search", self._search)

    async def _search(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        token = seen.headers.get("x-subscription-token")
        if self.api_key is not None and token != self.api_key:
            return _brave_error(401, "SUBSCRIPTION_TOKEN_INVALID",
                                "The provided subscription token is invalid.")
        query = seen.query.get("q", "")
        count = seen.query.get("count", "20")
        if not query or not count.isdigit() or not 1 <= int(count) <= 20:
            return _brave_error(422, "VALIDATION", "Unable to validate request parameter(s).")
        item = self._next(query)
        if isinstance(item, ApiFailure):
            code = "RATE_LIMITED" if item.status == 429 else "ERROR"
            return _brave_error(item.status, code, item.message, item.headers)
        results = [{"type": "search_result", "title": h.title, "url": h.url,
                    "description": _strong(h.snippet, query), "is_source_local": False,
                    "family_friendly": True, "language": "en", "subtype": "generic"}
                   for h in list(item)[: int(count)]]
        return web.json_response({
            "type": "search", "query": {"original": query, "more_results_available": False},
            "mixed": {"type": "mixed", "main": [{"type": "web", "index": i, "all": False}
                                                for i in range(len(results))]},
            "web": {"type": "search", "results": results, "family_friendly": True},
        })


def _brave_error(status: int, code: str, detail: str,
                 headers: Mapping[str, str] | None = None) -> web.Response:
    body = {"type": "ErrorResponse", "time": 1_700_000_000,
            "error": {"id": "00000000-0000-0000-0000-000000000000", "status": status,
                      "code": code, "detail": detail, "meta": {"component": "api"}}}
    return web.json_response(body, status=status, headers=dict(headers or {}))


def _strong(text: str, query: str) -> str:
    for word in set(query.split()):
        text = text.replace(word, f"<strong>{word}</strong>")
    return text


class FakeTavily(_SearchApi):
    """Tavily's ``POST /search`` (``Authorization: Bearer``, or ``api_key`` in the body;
    ``max_results`` 0..20); errors as ``{"detail": {"error": ...}}``."""

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/search", self._search)

    async def _search(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        try:
            body = seen.json()
        except ValueError:
            return _tavily_error(400, "Invalid JSON body.")
        if not isinstance(body, dict):
            return _tavily_error(400, "Invalid JSON body.")
        auth = seen.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else body.get("api_key")
        if self.api_key is not None and key != self.api_key:
            return _tavily_error(401, "Unauthorized: missing or invalid API key.")
        query = body.get("query")
        if not isinstance(query, str) or not query:
            return _tavily_error(400, "Query is missing.")
        count = body.get("max_results", 5)
        if not isinstance(count, int) or not 0 <= count <= 20:
            return _tavily_error(400, "max_results must be between 0 and 20.")
        item = self._next(query)
        if isinstance(item, ApiFailure):
            return _tavily_error(item.status, item.message, item.headers)
        results = [{"title": h.title, "url": h.url, "content": h.snippet,
                    "score": round(1.0 - i / 100, 2), "raw_content": None}
                   for i, h in enumerate(list(item)[:count])]
        return web.json_response({"query": query, "follow_up_questions": None, "answer": None,
                                  "images": [], "results": results, "response_time": 0.42,
                                  "request_id": "00000000-0000-0000-0000-000000000000"})


def _tavily_error(status: int, message: str,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"detail": {"error": message}}, status=status,
                             headers=dict(headers or {}))
