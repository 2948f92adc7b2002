"""Roost's one HTTP server: ``/healthz``, ``/readyz``, ``/metrics`` and the Control UI.

Off unless ``http_port`` (``ROOST_HTTP_PORT``) is set; bound to ``http_host``
(``ROOST_HTTP_HOST``, 127.0.0.1 by default: put it on 0.0.0.0 only where the
network in front is trusted, as in a container). ``roost run`` starts it before
the channels, so ``/healthz`` answers while they connect.

* ``/healthz``: 200 ``ok`` while the process is alive and its event loop turns,
  whatever the platforms do.
* ``/readyz``: 200 ``ready`` once every expected channel reports itself ready
  (:meth:`~bot.contracts.channel.Channel.health`), so does every part a plugin reports
  (``roost_health``) and the store accepts a write
  (``BEGIN IMMEDIATE`` … ``COMMIT`` with nothing in it, under the store's lock);
  otherwise 503 with one line per failing part, ``telegram: getUpdates failing
  (…)``, ``store: …``.
* ``/metrics``: the app's Prometheus registry in text format
  (:mod:`bot.observability.metrics`).
* ``/ui``: the Control UI (:mod:`bot.ui`), loaded on its first request
  (:mod:`bot.app.ui_mount`).

Webhooks can share it: a channel whose own listener's port setting
(``slack_port``, ``telegram_webhook_port``) equals ``http_port`` mounts its
``POST`` endpoint here (:class:`~bot.contracts.channel.WebRoutes`) instead of
binding a second server.

Every connection goes through :class:`~bot.resilience.listener.Listener`'s guard:
header and body timeouts, connection caps, body size limits (``http_*`` settings).

aiohttp is imported only when the server starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from bot.config.settings import SetupError
from bot.contracts.channel import WebHandler
from bot.observability.logring import LogRing
from bot.observability.metrics import CONTENT_TYPE, Gauges
from bot.observability.redact import redact
from bot.resilience.breaker import CircuitBreaker
from bot.resilience.listener import Limits, Listener
from bot.storage.db import transaction

if TYPE_CHECKING:
    from aiohttp import web

    from bot.app.roost import Roost

log = logging.getLogger("roost.app.http")

STORE_TIMEOUT = 2.0
"""Seconds the readiness check waits for the store's write lock before calling it failing."""


class HealthServer:
    """The HTTP server of one app; :meth:`start` binds it, :meth:`close` ends it.

    ``expected`` names the channels that must be ready besides the ones
    already running (``roost run`` passes those it is about to start, so
    ``/readyz`` says ``telegram: not started`` until it is). ``limits`` defaults
    to the app's ``http_*`` settings.
    """

    def __init__(self, app: Roost, host: str, port: int, *, expected: Iterable[str] = (),
                 store_timeout: float = STORE_TIMEOUT, limits: Limits | None = None) -> None:
        self.app = app
        self.host = host
        self.port = port
        """The port asked for; once started, the one bound (``0`` picks a free one)."""
        self.expected = list(expected)
        self.store_timeout = store_timeout
        self._closing = asyncio.Event()
        self.limits = limits if limits is not None else Limits.from_settings(app.settings)
        """Timeouts, connection caps and body sizes (:mod:`bot.resilience.listener`)."""
        self.logs = LogRing()
        """This process's last log records, for the Control UI's live tail (kept while serving)."""
        self._listener: Listener | None = None
        self._posts: dict[str, WebHandler] = {}
        self._gets: dict[str, WebHandler] = {}

    async def wait_closing(self) -> None:
        """Return once shutdown has begun (what ends the UI's Server-Sent Events streams)."""
        await self._closing.wait()

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve; raises :class:`SetupError` when the address cannot be bound."""
        try:
            import aiohttp  # noqa: F401  (named in the error below when missing)
        except ImportError:  # pragma: no cover - aiohttp ships with Roost
            raise SetupError("ROOST_HTTP_PORT needs aiohttp: pip install aiohttp") from None
        listener = Listener(self.host, self.port, self.limits, name="HTTP")
        router = listener.app.router
        router.add_get("/healthz", self._healthz)
        router.add_get("/readyz", self._readyz)
        router.add_get("/metrics", self._metrics)
        # The Control UI (/ui): built on its first request (bot.app.ui_mount).
        from bot.app.ui_mount import UiMount, check_accounts, secure_ui_answers

        router.register_resource(UiMount(self.app))
        listener.app.on_response_prepare.append(secure_ui_answers)
        # aiohttp's router is frozen once serving; channels mount webhooks later.
        router.add_post("/{path:.*}", self._post)
        router.add_get("/{path:.*}", self._get)
        try:
            await listener.start()
        except OSError as exc:
            raise SetupError(f"cannot serve health and metrics on {self.host}:{self.port} "
                             f"({exc.strerror or exc}); set ROOST_HTTP_PORT to a free port "
                             "or 0 to turn it off") from None
        self._listener = listener
        self.port = listener.port
        self.logs.attach()
        log.info("health and metrics on http://%s:%d (/healthz, /readyz, /metrics, /ui)",
                 self.host, self.port)
        await check_accounts(self.app)

    def add_post(self, path: str, handler: WebHandler) -> None:
        """Answer ``POST path`` with ``handler`` (a channel's webhook)."""
        if path in self._posts:
            raise SetupError(f"two channels want POST {path} on port {self.port}")
        self._posts[path] = handler
        log.info("POST %s served on port %d", path, self.port)

    def remove_post(self, path: str) -> None:
        """Stop answering ``POST path``."""
        self._posts.pop(path, None)

    def add_get(self, path: str, handler: WebHandler) -> None:
        """Answer ``GET path`` with ``handler`` (a webhook's verification handshake)."""
        if path in self._gets or path in ("/healthz", "/readyz", "/metrics") \
                or path == "/ui" or path.startswith("/ui/"):
            raise SetupError(f"GET {path} is taken on port {self.port}")
        self._gets[path] = handler
        log.info("GET %s served on port %d", path, self.port)

    def remove_get(self, path: str) -> None:
        """Stop answering ``GET path``."""
        self._gets.pop(path, None)

    @property
    def closing(self) -> bool:
        """Whether shutdown began: ``/readyz`` answers 503 and live views end from then on."""
        return self._closing.is_set()

    def begin_shutdown(self) -> None:
        """Answer ``/readyz`` with 503 from now on; ``/healthz`` answers to the end."""
        self._closing.set()

    async def close(self) -> None:
        """Stop serving (requests in flight are cut)."""
        self._closing.set()
        listener, self._listener = self._listener, None
        self.logs.detach()
        if listener is not None:
            await listener.close()

    async def problems(self) -> list[str]:
        """One line per part that is not ready; empty when ready."""
        if self.closing:
            return ["roost: shutting down"]
        lines: list[str] = []
        channels = self.app.channels
        for name in dict.fromkeys([*self.expected, *channels]):
            channel = channels.get(name)
            if channel is None:
                lines.append(f"{name}: not started")
                continue
            try:
                health = channel.health()
            except Exception as exc:
                lines.append(f"{name}: health check failed ({type(exc).__name__})")
                continue
            if not health.ready:
                # Redacted: an adapter's detail may quote a platform error verbatim.
                lines.append(redact(f"{name}: {health.detail or 'not ready'}"))
        # Parts plugins vouch for (the exec sandbox's canary): roost_health.
        lines.extend(redact(f"{report.part}: {report.detail or 'not ready'}")
                     for report in await self.app.host.hooks.roost_health(app=self.app.runtime)
                     if not report.ready)
        problem = await self._store_problem()
        if problem:
            lines.append(f"store: {problem}")
        return lines

    async def _store_problem(self) -> str | None:
        store = self.app.store

        async def nothing(_db: Any) -> None:
            return None

        try:
            # An empty write transaction: takes SQLite's write lock and commits, so a
            # read-only, locked or closed database shows here. Not via the writer's
            # queue, so a backlog there is not mistaken for a broken store.
            async with asyncio.timeout(self.store_timeout):
                await transaction(store.db, store.lock, nothing)
        except TimeoutError:
            return f"no write within {self.store_timeout:g}s"
        except Exception as exc:
            return f"write failed ({type(exc).__name__}: {str(exc)[:120]})"
        return None

    # -- handlers ---------------------------------------------------------------------

    async def _healthz(self, _request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        from aiohttp import web

        lines = await self.problems()
        if lines:
            return web.Response(status=503, text="".join(f"{line}\n" for line in lines))
        return web.Response(text="ready\n")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        handler = self._posts.get(request.path)
        if handler is None:
            return web.Response(status=404, text="not found\n")
        response: web.StreamResponse = await handler(request)
        return response

    async def _get(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        handler = self._gets.get(request.path)
        if handler is None:
            return web.Response(status=404, text="not found\n")
        response: web.StreamResponse = await handler(request)
        return response

    async def _metrics(self, _request: web.Request) -> web.Response:
        from aiohttp import web

        body = self.app.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def instrument(app: Roost) -> None:
    """Let ``app.metrics`` read the gauges from ``app`` when scraped.

    Spans, deliveries and scheduler fires reach the metrics through the
    constructors :meth:`bot.app.roost.Roost.create` passes them to.
    """
    app.metrics.set_gauges(lambda: gauges(app))


def gauges(app: Roost) -> Gauges:
    """Breaker states (tools', the provider's), messages queued and runs active, now."""
    states = {f"tool:{name}": str(snap["state"])
              for name, snap in app.engine.breakers.snapshot().items()}
    provider = app.engine.provider
    breaker = getattr(provider, "breaker", None)
    if isinstance(breaker, CircuitBreaker):
        states[f"provider:{provider.name}"] = breaker.state
    queued = app.dispatcher.lanes.waiting()
    return Gauges(states, queued, app.engine.active_runs)
