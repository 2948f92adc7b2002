"""``/whatsapp/webhook`` on Roost's HTTP server: the verification handshake and deliveries.

``GET`` answers Meta's subscription check (``hub.mode=subscribe``, the verify
token, ``hub.challenge`` echoed). ``POST`` must carry ``X-Hub-Signature-256``
(HMAC-SHA256 of the raw body with the app secret), else 401 before anything
parses it. A signed delivery is answered 200 only after each of its messages was
handed to the core and the handler returned (it is stored then); if the handler
raised, 500, and WhatsApp delivers it again. While Roost shuts down, 503.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time

from aiohttp import web

from plugins.whatsapp.graph import OUTSIDE_WINDOW
from plugins.whatsapp.inbound import changes, event_of, failed_statuses, names
from plugins.whatsapp.window import CustomerWindow
from roost import InboundHandler, InboundMessage
from roost.channels import ButtonPress, InboundEvent, WebRoutes

log = logging.getLogger("roost.plugins.whatsapp")

PATH = "/whatsapp/webhook"

_SHAPE_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)
"""What reading a delivery of a shape Roost does not know raises."""


def signature(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class Webhook:
    """The endpoint; events go to ``handler`` in the order of the delivery."""

    def __init__(self, handler: InboundHandler, window: CustomerWindow, *,
                 app_secret: str, verify_token: str) -> None:
        self.handler = handler
        self.window = window
        self.secret = app_secret.encode()
        self.verify_token = verify_token
        self.open = True
        """Whether deliveries are taken (503 once shutdown began)."""
        self.routes: WebRoutes | None = None
        self._last_refusal = 0.0

    def mount(self, routes: WebRoutes) -> None:
        """Serve ``GET`` and ``POST`` :data:`PATH` on ``routes``."""
        routes.add_get(PATH, self.verify)
        routes.add_post(PATH, self.receive)
        self.routes = routes

    def close_intake(self) -> None:
        """Answer deliveries 503 from now on (shutdown began)."""
        self.open = False

    def unmount(self) -> None:
        """Stop serving (404 from then on)."""
        if self.routes is not None:
            routes, self.routes = self.routes, None
            routes.remove_get(PATH)
            routes.remove_post(PATH)

    async def verify(self, request: web.Request) -> web.Response:
        """Meta's subscription check: the challenge back if the verify token matches."""
        query = request.query
        token = query.get("hub.verify_token", "")
        if query.get("hub.mode") == "subscribe" and self.verify_token and \
                hmac.compare_digest(token.encode(), self.verify_token.encode()):
            log.info("WhatsApp: webhook verified")
            return web.Response(text=query.get("hub.challenge", ""))
        self._refused("a webhook verification with a wrong verify token", request)
        return web.Response(status=403, text="verification failed")

    def _refused(self, what: str, request: web.Request) -> None:
        """Log a refused request, a line a minute at most (anyone can send these)."""
        now = time.monotonic()
        if now - self._last_refusal >= 60.0:
            self._last_refusal = now
            log.warning("WhatsApp: refused %s from %s", what, request.remote)

    async def receive(self, request: web.Request) -> web.Response:
        """One delivery: signature, then every message to the core, then 200."""
        if not self.open:
            return web.Response(status=503, text="shutting down")
        raw = await request.read()
        given = request.headers.get("X-Hub-Signature-256", "")
        if not hmac.compare_digest(given.encode(), signature(self.secret, raw).encode()):
            self._refused("a webhook delivery with a bad signature", request)
            return web.Response(status=401, text="invalid signature")
        try:
            payload = json.loads(raw)
        except ValueError:
            log.warning("WhatsApp: a signed delivery that is not JSON was skipped")
            return web.Response(status=200)
        try:
            events, closed = self._events(payload)
        except _SHAPE_ERRORS as exc:
            # Signed, so Meta's: a shape Roost does not know. Redelivering cannot help.
            log.warning("WhatsApp: a delivery of an unknown shape was skipped (%s)",
                        type(exc).__name__)
            return web.Response(status=200)
        try:
            for recipient, at in closed:
                await self.window.closed(recipient, at)
            for event, timestamp in events:
                await self._note(event, timestamp)
                await self.handler(event)
        except Exception:
            log.exception("WhatsApp: a delivery was not recorded; answered 500 so "
                          "WhatsApp delivers it again")
            return web.Response(status=500, text="not recorded")
        return web.Response(status=200)

    def _events(self, payload: object) -> tuple[list[tuple[InboundEvent, object]],
                                                list[tuple[str, float]]]:
        """The delivery's events with their timestamps, in order, and the people whose
        window WhatsApp said was closed (131047 in a failed status) with its time; every
        failed status logged."""
        events: list[tuple[InboundEvent, object]] = []
        closed: list[tuple[str, float]] = []
        for value in changes(payload):
            for line, recipient, code, at in failed_statuses(value):
                log.warning("WhatsApp: %s", line)
                if code == OUTSIDE_WINDOW and recipient and at:
                    closed.append((recipient, at))
            profiles = names(value)
            for message in value.get("messages") or ():
                if not isinstance(message, dict):
                    continue
                try:
                    event = event_of(message, profiles.get(str(message.get("from")), ""))
                except _SHAPE_ERRORS as exc:
                    event = None
                    log.warning("WhatsApp: a message of an unknown shape (%s)",
                                type(exc).__name__)
                if event is None:
                    log.info("WhatsApp: skipped a %s message", str(message.get("type"))[:40])
                    continue
                events.append((event, message.get("timestamp")))
        return events, closed

    async def _note(self, event: InboundEvent, timestamp: object) -> None:
        """The person wrote: their 24-hour window is open again from then."""
        if not isinstance(event, InboundMessage | ButtonPress):
            return  # a reaction does not open the window
        person = event.sender_id if isinstance(event, InboundMessage) else event.user_id
        try:
            at = float(str(timestamp))
        except ValueError:
            at = time.time()
        await self.window.wrote(person, at)
