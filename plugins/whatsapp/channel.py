"""The :class:`WhatsAppChannel`: the channel contract over the WhatsApp Cloud API.

In: :class:`~plugins.whatsapp.webhook.Webhook` on Roost's HTTP server. Out: the
Graph API (:class:`~plugins.whatsapp.graph.Graph`). Direct chats only; a reply
goes whole (WhatsApp cannot edit a message), in 4,096-character pieces in
WhatsApp's formatting, after the typing indicator shown while the run worked.
A reply due outside the 24-hour window goes as the configured template, else is
:class:`~roost.channels.Undeliverable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from plugins.whatsapp.config import WhatsAppConfig
from plugins.whatsapp.formatting import to_whatsapp
from plugins.whatsapp.graph import LIMITS, Graph, GraphError, OutsideWindow
from plugins.whatsapp.inbound import CHANNEL_NAME
from plugins.whatsapp.webhook import PATH, Webhook
from plugins.whatsapp.window import CustomerWindow
from roost import (
    Attachment,
    Channel,
    ChannelHealth,
    InboundHandler,
    InboundMessage,
    MediaError,
    MediaTooLarge,
    OpenFile,
    OutboundFile,
    OutboundMessage,
)
from roost.channels import (
    READY,
    ButtonPress,
    ButtonRows,
    Capabilities,
    DeliveryPolicy,
    InFlight,
    RateLimiter,
    SetupError,
    Undeliverable,
    fetch_capped,
    opened_files,
    split_message,
)

log = logging.getLogger("roost.plugins.whatsapp")

MESSAGE_LIMIT = 4096
BUTTON_BODY_LIMIT = 1024
MAX_BUTTONS = 3
BUTTON_TITLE = 20
TEMPLATE_PARAMETER = 1000
TYPING_EVERY = 20.0
"""Seconds between typing indicators (WhatsApp shows one for up to 25 s)."""
STOP_GRACE = 10.0

_UPLOAD_LIMITS = {"image": 5 << 20, "video": 16 << 20, "audio": 16 << 20,
                  "document": 100 << 20}
_IMAGE_TYPES = ("image/jpeg", "image/png")
_MEDIA_HOSTS = ("fbsbx.com", "whatsapp.net", "facebook.com")
"""Where a media download URL may point before the access token goes with it."""


def media_type(mime: str) -> str:
    """The message type a file goes as (what WhatsApp does not show inline: a document)."""
    if mime in _IMAGE_TYPES:
        return "image"
    if mime in ("video/mp4", "video/3gpp"):
        return "video"
    if mime in ("audio/aac", "audio/mp4", "audio/mpeg", "audio/amr", "audio/ogg"):
        return "audio"
    return "document"


def button_groups(buttons: ButtonRows) -> list[list[dict[str, Any]]]:
    """Reply buttons in groups of three (WhatsApp's maximum), titles clipped to 20 chars."""
    flat = [b for row in buttons for b in row]
    replies = [{"type": "reply", "reply": {
        "id": b.data, "title": b.label if len(b.label) <= BUTTON_TITLE
        else b.label[:BUTTON_TITLE - 1] + "…"}} for b in flat]
    return [replies[i:i + MAX_BUTTONS] for i in range(0, len(replies), MAX_BUTTONS)]


class WhatsAppChannel(Channel):
    """WhatsApp Business Cloud API; see the module docstring for the mapping."""

    name = CHANNEL_NAME
    capabilities = Capabilities(buttons=True, react=True, reactions_in=True)

    def __init__(self, config: WhatsAppConfig, *, policy: DeliveryPolicy | None = None) -> None:
        """Nothing connects yet; ``policy`` tunes retries of Graph API calls."""
        self.config = config
        self.policy = policy or DeliveryPolicy()
        self.inflight = InFlight()
        self.limiter = RateLimiter(LIMITS, shared_by=self)
        self.graph: Graph | None = None
        self.webhook: Webhook | None = None
        self.window: CustomerWindow | None = None

    # -- lifecycle -------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the settings, then serve the webhook on Roost's HTTP server."""
        c = self.config
        missing = [env for env, value in (
            ("WHATSAPP_PHONE_NUMBER_ID", c.phone_number_id),
            ("WHATSAPP_ACCESS_TOKEN", c.access_token), ("WHATSAPP_APP_SECRET", c.app_secret),
            ("WHATSAPP_VERIFY_TOKEN", c.verify_token)) if not value]
        if missing:
            raise SetupError(f"the whatsapp channel needs {', '.join(missing)}")
        if self.http_routes is None:
            raise SetupError("the whatsapp channel needs Roost's HTTP server for its webhook "
                             f"({PATH}): set ROOST_HTTP_PORT")
        assert c.access_token and c.app_secret and c.verify_token
        self.graph = Graph(c.api_base, c.access_token.get_secret_value(), c.phone_number_id,
                           self.inflight, policy=self.policy, limiter=self.limiter,
                           timeout=c.timeout, rate_limit_wait=c.rate_limit_wait,
                           pair_rate_limit_wait=c.pair_rate_limit_wait)
        self.window = CustomerWindow(self.state)
        self.webhook = Webhook(handler, self.window,
                               app_secret=c.app_secret.get_secret_value(),
                               verify_token=c.verify_token.get_secret_value())
        self.webhook.mount(self.http_routes)
        log.info("WhatsApp: webhook on port %d%s for number id %s", self.http_routes.port,
                 PATH, c.phone_number_id)

    def health(self) -> ChannelHealth:
        """Ready while the webhook is served."""
        if self.webhook is not None and self.webhook.routes is not None and self.webhook.open:
            return READY
        return ChannelHealth(False, "webhook not served")

    async def stop_intake(self) -> None:
        """Answer deliveries 503 from now on: WhatsApp sends them again after the restart."""
        if self.webhook is not None:
            self.webhook.close_intake()

    async def stop(self) -> None:
        """Stop serving the webhook, let sends in flight finish (up to 10 s), close."""
        if self.webhook is not None:
            self.webhook.close_intake()
            self.webhook.unmount()
        if not await self.inflight.wait_idle(STOP_GRACE):
            log.warning("WhatsApp: %d call(s) still running at shutdown", self.inflight.count)
        await self.inflight.cancel_tasks()
        if self.graph is not None:
            await self.graph.close()

    def _graph(self) -> Graph:
        if self.graph is None:
            raise RuntimeError("the whatsapp channel is not started")
        return self.graph

    # -- outbound --------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply: text pieces, the buttons under the last, then each file.

        Outside the 24-hour window (known here, or 131047 from WhatsApp) the reply
        goes as the configured template instead, or raises :class:`Undeliverable`.
        """
        assert self.window is not None
        if not await self.window.is_open(message.chat_id):
            return await self._outside(message)
        with opened_files(message.files, self._check_file) as opened:
            try:
                return await self._send_opened(message, opened)
            except OutsideWindow:
                return await self._outside(message)

    async def _send_opened(self, message: OutboundMessage,
                           opened: Sequence[OpenFile]) -> str | None:
        graph, to = self._graph(), message.chat_id
        text = to_whatsapp(message.text) if message.text.strip() else ""
        pieces = split_message(text, MESSAGE_LIMIT) if text else []
        groups = button_groups(message.buttons)
        if groups and pieces and len(pieces[-1]) > BUTTON_BODY_LIMIT:
            pieces[-1:] = split_message(pieces[-1], BUTTON_BODY_LIMIT)
        last: str | None = None
        context = {"context": {"message_id": message.reply_to}} if message.reply_to else {}
        for n, piece in enumerate(pieces):
            if n == len(pieces) - 1 and groups:
                break
            last = await graph.send(to, {"type": "text", "text": {"body": piece},
                                         **(context if n == 0 else {})}, what="message")
        for n, group in enumerate(groups):
            body = pieces[-1] if n == 0 and pieces else "…"
            last = await graph.send(to, {"type": "interactive", "interactive": {
                "type": "button", "body": {"text": body},
                "action": {"buttons": group}}}, what="buttons")
        for file, source in zip(message.files, opened, strict=True):
            last = await self._send_file(to, file, source)
        return last

    def _check_file(self, file: OutboundFile, size: int) -> None:
        limit = _UPLOAD_LIMITS[media_type(file.mime_type)]
        if size > limit:
            raise MediaTooLarge(size, limit)

    async def _send_file(self, to: str, file: OutboundFile, source: OpenFile) -> str | None:
        graph = self._graph()
        data = await asyncio.to_thread(source.read_all)
        media_id = await graph.upload(data, file.mime_type or "application/octet-stream",
                                      file.name)
        kind = media_type(file.mime_type)
        media: dict[str, Any] = {"id": media_id}
        if kind == "document":
            media["filename"] = file.name
        if file.caption and kind != "audio":
            media["caption"] = file.caption[:1024]
        sent = await graph.send(to, {"type": kind, kind: media}, what=f"{kind} {file.name}")
        if file.caption and kind == "audio":  # audio messages carry no caption
            sent = await graph.send(to, {"type": "text", "text": {
                "body": file.caption[:MESSAGE_LIMIT]}}, what="audio caption")
        return sent

    async def _outside(self, message: OutboundMessage) -> str | None:
        """A reply outside the window: the template, or :class:`Undeliverable`."""
        c = self.config
        if not c.template_name:
            raise Undeliverable("outside WhatsApp's 24-hour window (no message from the "
                                "person in the last 24 hours) and no template_name is set")
        flat = " ".join(message.text.split()) or "…"
        if len(flat) > TEMPLATE_PARAMETER:
            flat = flat[:TEMPLATE_PARAMETER - 1] + "…"
        try:
            return await self._graph().send(message.chat_id, {"type": "template", "template": {
                "name": c.template_name, "language": {"code": c.template_language},
                "components": [{"type": "body", "parameters": [
                    {"type": "text", "text": flat}]}]}}, what="template")
        except GraphError as exc:
            raise Undeliverable(f"outside WhatsApp's 24-hour window, and the template "
                                f"{c.template_name!r} was refused ({exc})") from exc

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """WhatsApp needs no answer to a press; ``note`` goes as a message (a chat is
        always direct, so only the presser sees it)."""
        if note:
            try:
                await self._graph().send(press.chat_id, {"type": "text", "text": {
                    "body": note[:MESSAGE_LIMIT]}}, what="press answer")
            except Exception as exc:
                log.info("WhatsApp: answer to a press not sent (%s)", exc)

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """The bot's reaction on a message (``None``: removed; WhatsApp keeps one per
        sender, so ``replacing`` needs nothing); dropped when rate limited."""
        try:
            sent = await self._graph().send(chat_id, {"type": "reaction", "reaction": {
                "message_id": message_id, "emoji": emoji or ""}}, what="reaction",
                urgent=False)
        except GraphError as exc:
            log.info("WhatsApp: reaction refused (%s)", exc)
            return False
        return sent is not None

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """The read receipt with the typing indicator, again every 20 s while the block runs
        (WhatsApp hides it after 25 s or when the reply arrives)."""
        if not message.message_id or self.graph is None:
            yield
            return
        graph = self.graph

        async def keep_typing() -> None:
            while True:
                await graph.mark_read(message.message_id, typing=True)
                await asyncio.sleep(TYPING_EVERY)

        task = self.inflight.spawn(keep_typing())
        try:
            yield
        finally:
            task.cancel()

    # -- media in --------------------------------------------------------------

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Look the media id up, then fetch its URL with the token; an expired URL
        (404, 401 or 403) is looked up once more."""
        graph = self._graph()
        for attempt in (1, 2):
            try:
                info = await graph.media_url(attachment.url)
            except GraphError as exc:
                raise MediaError(f"WhatsApp no longer has {attachment.name} ({exc})") from exc
            url = str(info.get("url") or "")
            size = int(info.get("file_size") or 0) if str(
                info.get("file_size") or "0").isdigit() else 0
            if size > limit:
                raise MediaTooLarge(size, limit)
            if not self._trusted(url):
                raise MediaError(f"the link to {attachment.name} is not WhatsApp's")
            try:
                return await fetch_capped(graph.session, url, limit, check=_expired,
                                          what=f"downloading {attachment.name} from WhatsApp",
                                          policy=self.policy, headers=graph.auth)
            except _Expired:
                if attempt == 2:
                    raise MediaError(f"the link to {attachment.name} expired twice") from None
                log.info("WhatsApp: the media URL of %s expired; looking it up again",
                         attachment.name)
        raise AssertionError("unreachable")

    def _trusted(self, url: str) -> bool:
        """Whether ``url`` is WhatsApp's (or on the Graph API's host), so the token may go."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        if host == urlsplit(self.config.api_base).hostname:
            return parts.scheme in ("http", "https")
        return parts.scheme == "https" and any(
            host == h or host.endswith("." + h) for h in _MEDIA_HOSTS)


class _Expired(MediaError):
    """The short-lived download URL is no longer valid (look it up again)."""


def _expired(response: aiohttp.ClientResponse) -> None:
    if response.status in (401, 403, 404):
        raise _Expired(f"HTTP {response.status}")
    if response.status >= 400:
        raise MediaError(f"WhatsApp answered HTTP {response.status} to a media download")
