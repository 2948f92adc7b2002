"""The Graph API of the WhatsApp Cloud API over aiohttp: sends, uploads and media lookups.

Every call goes through :func:`roost.channels.deliver` with the errors translated:
130429 (the number's throughput) holds every send, 131056 (too many messages to one
person) holds that person's, 5xx answers (HTML pages during an incident included)
and dropped connections are retried, and 131047 (outside the 24-hour window)
becomes :class:`OutsideWindow`. Anything else is :class:`GraphError`, not retried.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from roost.channels import (
    BOT,
    DeliveryPolicy,
    InFlight,
    Limits,
    Rate,
    RateLimited,
    RateLimiter,
    Transient,
    deliver,
    short,
)

log = logging.getLogger("roost.plugins.whatsapp")

RATE_LIMIT = 130429
PAIR_RATE_LIMIT = 131056
SPAM_RATE_LIMIT = 131048
OUTSIDE_WINDOW = 131047

LIMITS = Limits(overall=Rate(80, 1.0))
"""A Cloud API number's default throughput: 80 messages a second."""


class GraphError(Exception):
    """The Graph API refused a call for good: ``code`` is its error code (0: none given)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"WhatsApp error {code}: {message}" if code else message)
        self.code = code


class OutsideWindow(GraphError):
    """131047: the person last wrote more than 24 hours ago; only a template may go."""


def error_of(status: int, body: bytes) -> tuple[int, str]:
    """The Graph error code and message of an answer (``(0, 'HTTP n')`` for non-JSON)."""
    try:
        error = json.loads(body).get("error") or {}
        code = int(error.get("code") or 0)
        details = (error.get("error_data") or {}).get("details") or error.get("message") or ""
        return code, short(str(details), 200)
    except (ValueError, AttributeError, TypeError):
        return 0, f"HTTP {status}"


class Graph:
    """Calls to ``{api_base}/...`` with the access token, paced and retried."""

    def __init__(self, api_base: str, token: str, phone_number_id: str, inflight: InFlight, *,
                 policy: DeliveryPolicy, limiter: RateLimiter, timeout: float,
                 rate_limit_wait: float, pair_rate_limit_wait: float) -> None:
        self.base = api_base.rstrip("/")
        self.phone = phone_number_id
        self.inflight = inflight
        self.policy = policy
        self.limiter = limiter
        self.timeout = timeout
        self.rate_limit_wait = rate_limit_wait
        self.pair_rate_limit_wait = pair_rate_limit_wait
        self._auth = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (made on first use, closed by :meth:`close`)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _raise_for(self, status: int, body: bytes, scope: str) -> None:
        if status < 400:
            return
        code, message = error_of(status, body)
        if code == RATE_LIMIT or status == 429:
            raise RateLimited(self.rate_limit_wait, BOT)
        if code in (PAIR_RATE_LIMIT, SPAM_RATE_LIMIT):
            raise RateLimited(self.pair_rate_limit_wait, scope)
        if code == OUTSIDE_WINDOW:
            raise OutsideWindow(code, message)
        if status >= 500:
            raise Transient(f"HTTP {status}" + (f" ({message})" if code else ""))
        raise GraphError(code, message)

    async def _request(self, method: str, url: str, scope: str, *, what: str,
                       urgent: bool = True, counted: bool = False,
                       json_body: dict[str, Any] | None = None,
                       form: Callable[[], aiohttp.FormData] | None = None,
                       ) -> dict[str, Any] | None:
        """One call, paced in ``scope`` and retried; its JSON, or ``None`` if skipped
        (a call that is not ``urgent`` gives way to a rate limit). ``form`` makes a
        multipart body afresh for each attempt."""
        async def attempt() -> dict[str, Any] | None:
            async with self.limiter.slot(scope, counted=counted, urgent=urgent) as go:
                if not go:
                    return None
                try:
                    async with self.session.request(
                            method, url, headers=self._auth, json=json_body,
                            data=None if form is None else form()) as response:
                        body = await response.read()
                        self._raise_for(response.status, body, scope)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    raise Transient(f"{type(exc).__name__}: {short(exc, 120)}") from exc
            try:
                answer = json.loads(body)
            except ValueError as exc:
                raise GraphError(0, f"unreadable answer to {what}") from exc
            return answer if isinstance(answer, dict) else {}

        async def tracked() -> dict[str, Any] | None:
            return await self.inflight.tracked(attempt())

        if not urgent:
            try:
                return await tracked()
            except (RateLimited, Transient) as exc:
                log.info("WhatsApp: %s skipped (%s)", what, exc)
                return None
        return await deliver(tracked, what=f"WhatsApp {what}", policy=self.policy)

    async def send(self, to: str, payload: dict[str, Any], *, what: str,
                   urgent: bool = True) -> str | None:
        """POST a message to ``to``; the ``wamid`` WhatsApp gave it (``None``: skipped)."""
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
                **payload}
        answer = await self._request("POST", f"{self.base}/{self.phone}/messages", to,
                                     what=what, urgent=urgent, counted=True, json_body=body)
        if answer is None:
            return None
        messages = answer.get("messages") or [{}]
        return str(messages[0].get("id") or "") or None

    async def mark_read(self, message_id: str, *, typing: bool) -> None:
        """The read receipt of ``message_id`` (with the typing indicator when ``typing``);
        never waits behind a rate limit, never raises for a refusal."""
        body: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read",
                                "message_id": message_id}
        if typing:
            body["typing_indicator"] = {"type": "text"}
        try:
            await self._request("POST", f"{self.base}/{self.phone}/messages", BOT,
                                what="read receipt", urgent=False, json_body=body)
        except GraphError as exc:
            log.info("WhatsApp: read receipt for a message refused (%s)", exc)

    async def upload(self, data: bytes, mime_type: str, name: str) -> str:
        """Upload a file to ``/{phone}/media``; its media id (a retried upload at worst leaves
        an unused copy, which WhatsApp deletes after 30 days)."""
        def form() -> aiohttp.FormData:
            fields = aiohttp.FormData()
            fields.add_field("messaging_product", "whatsapp")
            fields.add_field("type", mime_type)
            fields.add_field("file", data, filename=name, content_type=mime_type)
            return fields

        answer = await self._request("POST", f"{self.base}/{self.phone}/media", BOT,
                                     what=f"upload of {name}", form=form)
        media_id = str((answer or {}).get("id") or "")
        if not media_id:
            raise GraphError(0, f"no media id for {name}")
        return media_id

    async def media_url(self, media_id: str) -> dict[str, Any]:
        """``GET /{media_id}``: the short-lived download URL and what WhatsApp knows of it."""
        answer = await self._request("GET", f"{self.base}/{media_id}", BOT,
                                     what="media lookup")
        return answer or {}

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header a media download needs."""
        return dict(self._auth)
