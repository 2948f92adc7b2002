"""The Events API endpoint: signed HTTP requests from Slack, answered once recorded.

:class:`EventsEndpoint` serves ``POST /slack/events`` (on Roost's own HTTP
server when ``slack_port`` is its port, else on a listener of its own),
refuses a bad signature with 401 before anything parses the body, and hands
the rest to :class:`Inbound`.
"""

from __future__ import annotations

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

from bot.config.settings import Settings
from bot.contracts.channel import WebRoutes
from bot.resilience.listener import Limits, Listener, Throttle
from channels.logline import short as _short
from channels.slack.common import (
    EVENTS_PATH,
    SIGNATURE,
    SIGNATURE_TIMESTAMP,
    NotRecorded,
    body_problem,
    caused_by,
    log,
)
from channels.slack.inbound import Inbound


class EventsEndpoint:
    """``POST /slack/events``: verify, screen, hand to :class:`Inbound`, answer."""

    def __init__(self, settings: Settings, inbound: Inbound, *, host: str) -> None:
        """``host`` is the address a listener of its own binds."""
        self.settings = settings
        self.inbound = inbound
        self.host = host
        self.port: int | None = None
        """The HTTP port actually bound (``slack_port`` may be 0 in tests)."""
        self._verifier: SignatureVerifier | None = None
        self._listener: Listener | None = None
        """The endpoint's own listener (HTTP mode on a port of its own)."""
        self._refusals = Throttle()
        """Paces the log line about requests with a bad signature."""
        self._shared: WebRoutes | None = None
        """Roost's HTTP server, when the endpoint is mounted there."""

    @property
    def listening(self) -> bool:
        """Whether the endpoint is served now."""
        return self._listener is not None or self._shared is not None

    async def listen(self, secret: str, http_routes: WebRoutes | None) -> None:
        """Serve the endpoint, on ``http_routes`` if ``slack_port`` is its port."""
        self._verifier = SignatureVerifier(secret)
        shared = http_routes
        if shared is not None and shared.port == self.settings.slack_port:
            # slack_port is Roost's own HTTP port: the endpoint is mounted on that server.
            shared.add_post(EVENTS_PATH, self._http_request)
            self._shared = shared
            self.port = shared.port
            return
        listener = Listener(self.host, self.settings.slack_port,
                            Limits.from_settings(self.settings), name="Slack events")
        listener.app.router.add_post(EVENTS_PATH, self._http_request)
        await listener.start()
        self._listener = listener
        self.port = listener.port

    async def close(self) -> None:
        """Stop serving the endpoint."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()
        if self._shared is not None:
            shared, self._shared = self._shared, None
            shared.remove_post(EVENTS_PATH)

    async def _http_request(self, request: web.Request) -> web.StreamResponse:
        """One Events API request: verify, screen, hand to bolt."""
        assert self._verifier is not None
        if not self.inbound.open:
            # Shutting down: Slack retries a 5xx later, when Roost is back.
            return web.Response(status=503, text="shutting down")
        raw = await request.read()
        # Bolt parses the body before verifying it and answers junk with a 500
        # and a traceback, so unsigned requests are refused here first.
        if not self._signed(raw, request.headers.get("X-Slack-Request-Timestamp"),
                            request.headers.get("X-Slack-Signature")):
            # Anyone can send these: one line a minute at most, so they cannot flood the log.
            skipped = self._refusals.ready()
            if skipped is not None:
                log.warning("Slack: refused a request with a bad signature from %s%s",
                            request.remote, f" ({skipped} more since the last such line)"
                            if skipped else "")
            return web.Response(status=401, text="invalid signature")
        try:
            bolt_request = AsyncBoltRequest(
                body=raw.decode("utf-8", errors="replace"), query=request.query_string,
                headers={k.lower(): request.headers.getall(k) for k in request.headers})
            problem = body_problem(bolt_request.body)
        except Exception as exc:
            # Bolt reads ids out of the body while building the request.
            problem = f"unparseable body ({type(exc).__name__}: {_short(exc)})"
        if problem:
            log.warning("Slack: request skipped: %s", problem)
            return web.Response(status=200)
        try:
            response = await self.inbound.dispatch(bolt_request)
        except Exception as exc:
            if caused_by(exc, NotRecorded):
                # Nothing was recorded: a 5xx makes Slack deliver it again.
                log.exception("Slack: the core did not record a request; answered 500 so "
                              "Slack retries it")
                return web.Response(status=500, text="not recorded")
            # Bolt itself choked on the payload: a redelivery would too.
            log.warning("Slack: malformed request skipped (%s: %s)", type(exc).__name__,
                        _short(exc))
            return web.Response(status=200)
        # A 5xx from bolt means the core did not record the event (the listener
        # raised): it goes back to Slack as is, and Slack redelivers.
        return await to_aiohttp_response(response)

    def _signed(self, body: bytes, timestamp: str | None, signature: str | None) -> bool:
        """Whether the request carries Slack's valid, fresh signature."""
        assert self._verifier is not None
        if (timestamp is None or signature is None
                or not SIGNATURE_TIMESTAMP.fullmatch(timestamp)
                or not SIGNATURE.fullmatch(signature)):
            return False
        try:
            return self._verifier.is_valid(body, timestamp, signature)
        except (TypeError, ValueError):  # the SDK's own parsing; refused all the same
            return False

