"""The fake's server: Graph API routes, faults and the webhook sender (see the package)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
import pytest_asyncio
from aiohttp import web

VERSION = "v21.0"
PHONE_ID = "106540352242922"
WINDOW = 24 * 3600.0

ERRORS: dict[str, tuple[int, int, str, str]] = {
    "131047": (400, 131047, "Re-engagement message",
               "Message failed to send because more than 24 hours have passed since the "
               "customer last replied to this number."),
    "130429": (429, 130429, "Rate limit hit",
               "Cloud API message throughput has been reached."),
    "131056": (429, 131056, "(Business Account, Consumer Account) pair rate limit hit",
               "Message failed to send because there were too many messages sent from this "
               "phone number to the same phone number in a short period of time."),
    "131009": (400, 131009, "Parameter value is not valid", ""),
    "190": (401, 190, "Invalid OAuth access token - Cannot parse access token", ""),
    "100": (400, 100, "Invalid parameter", ""),
}
HTML_502 = ("<html><head><title>502 Bad Gateway</title></head><body><center>"
            "<h1>502 Bad Gateway</h1></center></body></html>")


def graph_error(name: str, details: str = "") -> web.Response:
    """A Graph API error answer as WhatsApp gives it."""
    status, code, title, default = ERRORS[name]
    error: dict[str, Any] = {"message": f"(#{code}) {title}", "type": "OAuthException",
                             "code": code, "fbtrace_id": "AfakeTrace"}
    if details or default:
        error["error_data"] = {"messaging_product": "whatsapp", "details": details or default}
    return web.json_response({"error": error}, status=status)


@dataclass(frozen=True, slots=True)
class Call:
    """One Graph API request: method, path (after the version), JSON body or form fields."""

    method: str
    path: str
    body: dict[str, Any]
    result: str = ""
    """``ok``, or the fault or error it got."""


@dataclass(slots=True)
class Sent:
    """A message the business sent, as the person's phone shows it."""

    to: str
    wamid: str
    type: str
    payload: dict[str, Any]

    @property
    def text(self) -> str:
        """Its text: the body of a text or button message, a template's parameter."""
        if self.type == "text":
            return str(self.payload["text"]["body"])
        if self.type == "interactive":
            return str(self.payload["interactive"]["body"]["text"])
        if self.type == "template":
            return str(self.payload["template"]["components"][0]["parameters"][0]["text"])
        return ""


@dataclass(slots=True)
class _Media:
    data: bytes
    mime: str
    name: str = ""


@dataclass(slots=True)
class FakeWhatsApp:
    """The fake; ``async with`` starts it on a free port of 127.0.0.1."""

    token: str = "EAAGfaketoken"
    app_secret: str = "fake-app-secret"
    verify_token: str = "fake-verify-token"
    phone_number_id: str = PHONE_ID
    webhook_url: str = ""
    """Where deliveries go (Roost's ``/whatsapp/webhook``)."""
    skew: float = 0.0
    """Seconds added to the real time: :attr:`clock` (to step past the 24-hour window)."""
    calls: list[Call] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    reads: list[dict[str, Any]] = field(default_factory=list)
    """Read receipts (with ``typing_indicator`` where asked), in order."""
    media_store: dict[str, _Media] = field(default_factory=dict)
    deliveries: list[int] = field(default_factory=list)
    """The HTTP status of every webhook POST, in order."""
    last_inbound: dict[str, float] = field(default_factory=dict)
    port: int = 0
    _faults: dict[str, list[str]] = field(default_factory=dict)
    expiring: int = 0
    """How many of the next download URLs handed out are expired before they are used."""
    _urls: dict[str, tuple[str, bool]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Condition | None = None
    _runner: web.AppRunner | None = None
    _client: aiohttp.ClientSession | None = None
    held: list[asyncio.Future[None]] = field(default_factory=list)

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=200 << 20)
        app.router.add_post(f"/{VERSION}/{{phone}}/messages", self._messages)
        app.router.add_post(f"/{VERSION}/{{phone}}/media", self._upload)
        app.router.add_get(f"/{VERSION}/{{media_id}}", self._lookup)
        app.router.add_get("/download/{token}", self._download)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._changed = asyncio.Condition()
        self._client = aiohttp.ClientSession()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for future in self.held:
            if not future.done():
                future.set_result(None)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        """``WHATSAPP_API_BASE`` for Roost."""
        return f"http://127.0.0.1:{self.port}/{VERSION}"

    def env(self, webhook_port: int) -> dict[str, str]:
        """The environment of a ``roost run`` talking to this fake."""
        self.webhook_url = f"http://127.0.0.1:{webhook_port}/whatsapp/webhook"
        return {"WHATSAPP_PHONE_NUMBER_ID": self.phone_number_id,
                "WHATSAPP_ACCESS_TOKEN": self.token, "WHATSAPP_APP_SECRET": self.app_secret,
                "WHATSAPP_VERIFY_TOKEN": self.verify_token, "WHATSAPP_API_BASE": self.base_url,
                "ROOST_HTTP_PORT": str(webhook_port)}

    def clock(self) -> float:
        """The fake's time (seconds since the epoch)."""
        return time.time() + self.skew

    # -- faults ----------------------------------------------------------------

    def fail(self, kind: str, *, times: int = 1, route: str = "messages") -> None:
        """The next ``times`` calls of ``route`` (``messages``, ``media``, ``lookup``,
        ``download``) get fault ``kind`` (see the package docstring)."""
        self._faults.setdefault(route, []).extend([kind] * times)

    def expire_urls(self) -> None:
        """Every download URL handed out so far answers 404 from now on."""
        self._urls = {token: (media_id, True) for token, (media_id, _) in self._urls.items()}

    async def _fault(self, route: str, request: web.Request) -> web.StreamResponse | None:
        queue = self._faults.get(route)
        if not queue:
            return None
        kind = queue.pop(0)
        if kind in ERRORS:
            return graph_error(kind)
        if kind == "502":
            return web.Response(status=502, text=HTML_502, content_type="text/html")
        if kind == "reset":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if kind == "hold":
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.held.append(future)
            await self._notify()
            await future  # never applied: the client went away meanwhile
            return web.Response(status=504, text="held")
        raise ValueError(f"unknown fault {kind!r}")

    # -- Graph API -------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _record(self, call: Call) -> None:
        self.calls.append(call)
        await self._notify()

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not self._authorized(request):
            await self._record(Call("POST", "messages", body, "190"))
            return graph_error("190")
        if body.get("status") == "read":  # faults are for messages, not receipts
            self.reads.append(body)
            await self._record(Call("POST", "messages", body, "ok"))
            return web.json_response({"success": True})
        fault = await self._fault("messages", request)
        if fault is not None:
            await self._record(Call("POST", "messages", body, "fault"))
            return fault
        problem = self._check(body)
        if problem is not None:
            await self._record(Call("POST", "messages", body, problem))
            return graph_error(problem)
        to = str(body["to"])
        wamid = f"wamid.OUT{next(self._ids):06d}"
        self.sent.append(Sent(to, wamid, str(body["type"]), body))
        await self._record(Call("POST", "messages", body, "ok"))
        return web.json_response({"messaging_product": "whatsapp",
                                  "contacts": [{"input": to, "wa_id": to}],
                                  "messages": [{"id": wamid}]})

    def _check(self, body: dict[str, Any]) -> str | None:
        """The error WhatsApp gives a message, if any."""
        kind = body.get("type")
        if body.get("messaging_product") != "whatsapp" or not body.get("to"):
            return "100"
        if kind != "template":
            last = self.last_inbound.get(str(body["to"]))
            if last is None or self.clock() - last >= WINDOW:
                return "131047"
        if kind == "text" and not 0 < len(body["text"]["body"]) <= 4096:
            return "100"
        if kind == "interactive":
            action = body["interactive"]["action"]
            buttons = action.get("buttons") or []
            if not 1 <= len(buttons) <= 3 or any(
                    len(b["reply"]["title"]) > 20 or not b["reply"]["id"] for b in buttons):
                return "131009"
            if len(body["interactive"]["body"]["text"]) > 1024:
                return "131009"
        if kind in ("image", "document", "audio", "video", "sticker") and \
                str(body[kind].get("id")) not in self.media_store:
            return "131009"
        return None

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return graph_error("190")
        fault = await self._fault("media", request)
        if fault is not None:
            return fault
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not isinstance(
                upload, web.FileField):
            return graph_error("100")
        data = upload.file.read()
        media_id = f"{next(self._ids) + 900000000000000}"
        self.media_store[media_id] = _Media(data, str(form.get("type") or ""), upload.filename)
        await self._record(Call("POST", "media", {"id": media_id, "name": upload.filename,
                                                  "type": form.get("type")}, "ok"))
        return web.json_response({"id": media_id})

    async def _lookup(self, request: web.Request) -> web.StreamResponse:
        media_id = request.match_info["media_id"]
        if not self._authorized(request):
            return graph_error("190")
        fault = await self._fault("lookup", request)
        if fault is not None:
            return fault
        media = self.media_store.get(media_id)
        await self._record(Call("GET", media_id, {}, "ok" if media else "100"))
        if media is None:
            return graph_error("100", "Unsupported get request. Object with ID "
                               f"'{media_id}' does not exist")
        token = f"t{next(self._ids)}"
        self._urls[token] = (media_id, self.expiring > 0)
        self.expiring = max(0, self.expiring - 1)
        return web.json_response({
            "messaging_product": "whatsapp", "id": media_id, "mime_type": media.mime,
            "sha256": hashlib.sha256(media.data).hexdigest(), "file_size": len(media.data),
            "url": f"http://127.0.0.1:{self.port}/download/{token}"})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        fault = await self._fault("download", request)
        if fault is not None:
            return fault
        entry = self._urls.get(request.match_info["token"])
        await self._record(Call("GET", "download", {}, "ok" if entry and not entry[1]
                                else "expired"))
        if not self._authorized(request):
            return web.Response(status=401, text="Unauthorized")
        if entry is None or entry[1]:
            return web.Response(status=404, text="URL signature expired")
        media = self.media_store[entry[0]]
        return web.Response(body=media.data, content_type=media.mime or "application/octet-stream")

    # -- waiting ---------------------------------------------------------------

    async def wait_until(self, check: Callable[[], bool], limit: float = 30.0) -> None:
        """Wait until ``check()`` holds (a hang guard of ``limit`` seconds)."""
        assert self._changed is not None
        async with asyncio.timeout(limit), self._changed:
            await self._changed.wait_for(check)

    def visible(self, to: str) -> list[str]:
        """The texts the person ``to`` has received, in order."""
        return [s.text for s in self.sent if s.to == to]

    # -- the webhook sender ----------------------------------------------------

    def _envelope(self, value: dict[str, Any]) -> dict[str, Any]:
        return {"object": "whatsapp_business_account", "entry": [{
            "id": "102290129340398", "changes": [{"field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"display_phone_number": "15550783881",
                             "phone_number_id": self.phone_number_id}, **value}}]}]}

    def _message(self, sender: str, name: str, kind: str, content: dict[str, Any],
                 wamid: str | None = None, context: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "from": sender, "id": wamid or f"wamid.IN{next(self._ids):06d}",
            "timestamp": str(int(self.clock())), "type": kind, kind: content}
        if context:
            message["context"] = {"from": "15550783881", "id": context}
        self.last_inbound[sender] = self.clock()
        return self._envelope({"contacts": [{"profile": {"name": name}, "wa_id": sender}],
                               "messages": [message]})

    def text(self, sender: str, body: str, *, name: str = "Alice",
             wamid: str | None = None) -> dict[str, Any]:
        """A delivery of a text message from ``sender``."""
        return self._message(sender, name, "text", {"body": body}, wamid)

    def media(self, sender: str, kind: str, data: bytes, mime: str, *, caption: str = "",
              filename: str = "", voice: bool = False, name: str = "Alice") -> dict[str, Any]:
        """A delivery of an image, document, audio, video or sticker (stored for download)."""
        media_id = f"{next(self._ids) + 800000000000000}"
        self.media_store[media_id] = _Media(data, mime, filename)
        content: dict[str, Any] = {"id": media_id, "mime_type": mime,
                                   "sha256": hashlib.sha256(data).hexdigest()}
        if caption:
            content["caption"] = caption
        if filename:
            content["filename"] = filename
        if kind == "audio":
            content["voice"] = voice
        return self._message(sender, name, kind, content)

    def reaction(self, sender: str, message_id: str, emoji: str) -> dict[str, Any]:
        """A delivery of ``sender``'s reaction to ``message_id`` (``""``: removed)."""
        return self._message(sender, "Alice", "reaction",
                             {"message_id": message_id, "emoji": emoji})

    def press(self, sender: str, message_id: str, button_id: str,
              title: str = "") -> dict[str, Any]:
        """A delivery of a reply-button press under ``message_id``."""
        return self._message(sender, "Alice", "interactive", {
            "type": "button_reply", "button_reply": {"id": button_id, "title": title}},
            context=message_id)

    def status(self, message_id: str, recipient: str, state: str = "delivered",
               error: int | None = None) -> dict[str, Any]:
        """A delivery of a status update (``failed`` with ``error``'s code)."""
        status: dict[str, Any] = {"id": message_id, "status": state,
                                  "timestamp": str(int(self.clock())),
                                  "recipient_id": recipient}
        if error is not None:
            status["errors"] = [{"code": error, "title": ERRORS[str(error)][2]}]
        return self._envelope({"statuses": [status]})

    async def verification(self, token: str, challenge: str = "1158201444",
                           mode: str = "subscribe") -> tuple[int, str]:
        """Meta's subscription check (``GET`` with ``hub.*``); the status and body."""
        assert self._client is not None and self.webhook_url
        params = {"hub.mode": mode, "hub.verify_token": token, "hub.challenge": challenge}
        async with self._client.get(self.webhook_url, params=params) as response:
            return response.status, await response.text()

    def sign(self, body: bytes) -> str:
        """The ``X-Hub-Signature-256`` of ``body``."""
        return "sha256=" + hmac.new(self.app_secret.encode(), body,
                                    hashlib.sha256).hexdigest()

    async def post(self, payload: dict[str, Any] | bytes, *,
                   signature: str | None = None) -> int:
        """POST one delivery once (signed, unless ``signature`` is given); its status."""
        assert self._client is not None and self.webhook_url
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        async with self._client.post(self.webhook_url, data=raw, headers={
                "Content-Type": "application/json",
                "X-Hub-Signature-256": self.sign(raw) if signature is None else signature,
                }) as response:
            await response.read()
            self.deliveries.append(response.status)
            return response.status

    async def deliver(self, payload: dict[str, Any], *, attempts: int = 50,
                      pause: float = 0.05) -> int:
        """Deliver like Meta: again (after ``pause``) while the answer is not a 2xx or
        the connection fails; the last status (0: never answered)."""
        status = 0
        for _ in range(attempts):
            try:
                status = await self.post(payload)
            except aiohttp.ClientError:
                status = 0
            if 200 <= status < 300:
                return status
            await asyncio.sleep(pause)
        return status


@pytest_asyncio.fixture(name="fake_whatsapp")
async def fake_whatsapp() -> AsyncIterator[FakeWhatsApp]:
    """A started :class:`FakeWhatsApp`."""
    async with FakeWhatsApp() as fake:
        yield fake
