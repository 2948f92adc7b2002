"""A local fake of Slack, for driving the real slack-bolt / slack_sdk against it.

It plays both sides of Slack:

* the **Web API** the app calls (``POST /api/{method}``): ``auth.test``,
  ``chat.postMessage``, ``chat.update``, ``chat.delete``,
  ``apps.connections.open`` and ``conversations.info``, with bearer tokens
  checked and ``{"ok": ...}`` answers. Point ``AsyncWebClient(base_url=...)``
  (Roost: ``SLACK_API_BASE``) at :attr:`FakeSlack.base_url`;
* the **Events API** that calls the app: :meth:`FakeSlack.post_event`,
  :meth:`FakeSlack.post_body`, :meth:`FakeSlack.url_verification` and
  :meth:`FakeSlack.slash_command` send requests signed like Slack's
  (``v0=`` HMAC-SHA256 over ``v0:{timestamp}:{body}``) to
  :attr:`FakeSlack.events_url`, optionally forged or with ``X-Slack-Retry-Num``;
* **Socket Mode**: ``apps.connections.open`` hands out ``ws://.../socket``;
  the socket sends ``hello``, then the envelopes :meth:`FakeSlack.socket_event`
  and :meth:`FakeSlack.socket_slash_command` push, and records the acks;
* the **response_url** of slash commands (``POST /response/{n}``), recorded
  in :attr:`FakeSlack.responses`;
* **files**: :meth:`FakeSlack.file` stores bytes and returns the file object a
  message event carries (``files=[...]``, ``subtype="file_share"``); its
  ``url_private`` (and ``url_private_download``) serve the bytes only to
  ``Authorization: Bearer <bot token>`` with the ``files:read`` scope (see
  :attr:`FakeSlack.scopes`), and answer anything else as Slack does: a 302
  to the login page (an HTML 200), or 403 with ``denial="403"``. Uploads
  work as on Slack (``files.info`` too): ``files.getUploadURLExternal`` (needs ``files:write``)
  hands out an upload URL, a POST of the bytes there, then
  ``files.completeUploadExternal`` shares the files into a channel or thread
  (recorded in :attr:`FakeSlack.shared`); every file is downloadable after.

::

    async with FakeSlack() as fake:
        ...                                    # start the app with fake.settings()
        fake.events_url = "http://127.0.0.1:3000/slack/events"
        await fake.post_event(fake.message("hello", channel=fake.dm_channel))
        [call] = await fake.wait_for("chat.postMessage")
        assert call.params["text"] == "Hi!"

Every Web API call is recorded in :attr:`FakeSlack.calls`; the bot's messages
as they currently stand (edits applied, deletions marked) in
:attr:`FakeSlack.messages` (``conversations.history``/``.replies`` read them
back, metadata included). The ``fake_slack`` pytest fixture yields a started
instance.

**Faults**, the ways the real Slack fails (see
``/work/shared/notes/fake-platform-servers.md``): :meth:`FakeSlack.fail` makes
the next N calls of a method fail with a status (429 with ``Retry-After``,
5xx, or an ``ok: false`` error); :meth:`FakeSlack.inject` queues one of
:data:`FAULTS` for a method (``"*"``: any), and :meth:`FakeSlack.chaos` fails
a random share of calls. Kinds: ``"500"`` (JSON envelope), ``"502"`` (an HTML
page from the proxy), ``"429"``, ``"reset_before"`` (TCP reset before the
call took effect), ``"reset_after"`` (it took effect, then the reset),
``"disconnect"`` (the server closes the connection without answering, before
the call took effect), ``"truncated"`` (a 200 whose JSON body is cut short),
``"stall"`` (the answer comes after ``stall`` seconds). Deliveries to the app
fail too, and Slack redelivers: :meth:`FakeSlack.deliver_event` retries an
event whose POST got a non-2xx (or no answer in time) with
``X-Slack-Retry-Num``; :meth:`FakeSlack.deliver_socket_event` resends an
envelope that was not acked in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import mimetypes
import random
import socket
import struct
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

__all__ = [
    "ALICE",
    "APP_TOKEN",
    "BOB",
    "BOT_ID",
    "BOT_TOKEN",
    "BOT_USER_ID",
    "CHANNEL",
    "DM_CHANNEL",
    "FAULTS",
    "SIGNING_SECRET",
    "TEAM_ID",
    "Call",
    "Delivery",
    "FakeSlack",
    "Posted",
    "ResponsePost",
    "SharedFile",
    "SlackFile",
    "SlashResult",
    "fake_slack",
    "sign",
]

BOT_TOKEN = "xoxb-fake-bot-token"
APP_TOKEN = "xapp-fake-app-token"
SIGNING_SECRET = "fake-signing-secret"
TEAM_ID = "T0TEAM"
APP_ID = "A0APP"
BOT_USER_ID = "U0BOT"
"""The bot's user id: ``<@U0BOT>`` in text mentions it."""
BOT_ID = "B0BOT"
ALICE = "U0ALICE"
"""The default sender of events."""
BOB = "U0BOB"
CHANNEL = "C0GENERAL"
"""The default channel of events (a public channel)."""
DM_CHANNEL = "D0ALICE"
"""A direct-message channel (ids of DMs start with ``D``)."""
MAX_TEXT = 40_000
"""Slack refuses (``msg_too_long``) message text longer than this."""
FAULTS = ("500", "502", "429", "reset_before", "reset_after", "disconnect", "truncated",
          "stall")
"""The fault kinds :meth:`FakeSlack.inject` and :meth:`FakeSlack.chaos` know."""
CHAOS_METHODS = ("chat.postMessage", "chat.update", "chat.delete", "conversations.history",
                 "conversations.replies")
"""The methods :meth:`FakeSlack.chaos` fails by default (what replies use)."""
BAD_GATEWAY_PAGE = """<html>
<head><title>502 Bad Gateway</title></head>
<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body>
</html>
"""


def sign(body: bytes, timestamp: int | str, secret: str) -> str:
    """Slack's request signature: ``v0=`` + HMAC-SHA256(secret, ``v0:{ts}:{body}``)."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass(slots=True)
class Call:
    """One Web API call the fake received.

    ``params`` merges the JSON or form body and the query string; ``token`` is
    the bearer token (or ``token`` param). ``status`` is the HTTP status
    answered and ``ok`` the envelope's ``ok``; ``at`` is ``time.perf_counter()``.
    """

    method: str
    params: dict[str, Any]
    token: str
    at: float
    status: int = 200
    ok: bool = True
    error: str = ""
    done: bool = False
    """Answered (or dropped by an injected fault); a stalled call is not done yet."""


@dataclass(slots=True)
class Posted:
    """A message the app posted, as it stands now (edits applied)."""

    channel: str
    ts: str
    text: str
    thread_ts: str | None = None
    edits: list[str] = field(default_factory=list)
    """Every text it had before the current one, oldest first."""
    deleted: bool = False
    metadata: dict[str, Any] | None = None


@dataclass(slots=True)
class SlackFile:
    """A file the fake knows: sent by a user (:meth:`FakeSlack.file`) or uploaded by the app."""

    id: str
    name: str
    mimetype: str
    data: bytes | None
    """``None`` until an upload's bytes arrived."""
    length: int = 0
    """The size ``files.getUploadURLExternal`` was told (uploads only)."""
    title: str = ""


@dataclass(frozen=True, slots=True)
class SharedFile:
    """One file ``files.completeUploadExternal`` shared into a conversation."""

    channel: str
    thread_ts: str | None
    name: str
    title: str
    data: bytes
    initial_comment: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """The app's answer to one request the fake sent to its Events endpoint."""

    status: int
    body: str
    elapsed: float
    event_id: str = ""

    def json(self) -> Any:
        """The answer body parsed as JSON."""
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class SlashResult:
    """The app's answer to a slash command, and where its real reply will arrive."""

    status: int
    body: str
    elapsed: float
    response_url: str


@dataclass(frozen=True, slots=True)
class ResponsePost:
    """One POST the app made to a slash command's ``response_url``."""

    url: str
    body: dict[str, Any]
    at: float


@dataclass(slots=True)
class _Failure:
    status: int
    remaining: int
    retry_after: float
    error: str
    kind: str = "status"
    """``"status"`` (answer ``status``/``error``) or one of :data:`FAULTS`."""
    stall: float = 0.0


@dataclass(slots=True)
class _Chaos:
    rate: float
    methods: frozenset[str]
    kinds: tuple[str, ...]
    rng: random.Random
    retry_after: float
    stall: float


class FakeSlack:
    """An aiohttp server on 127.0.0.1 that behaves like Slack to one app.

    ``events_url`` is where :meth:`post_event` and friends send requests (the
    app's ``/slack/events`` endpoint); set it once the app listens.
    """

    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN,
                 signing_secret: str = SIGNING_SECRET) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_id = TEAM_ID
        self.bot_user_id = BOT_USER_ID
        self.bot_id = BOT_ID
        self.channel = CHANNEL
        self.dm_channel = DM_CHANNEL
        self.events_url: str | None = None
        self.calls: list[Call] = []
        """Every Web API call, in order (failed ones too)."""
        self.messages: dict[str, Posted] = {}
        """The app's messages by ``ts``, in posting order."""
        self.responses: list[ResponsePost] = []
        """POSTs to slash commands' response URLs, in order."""
        self.acks: dict[str, dict[str, Any]] = {}
        """Socket Mode acks by envelope id (the whole frame the app sent)."""
        self.socket_connections = 0
        """How many Socket Mode connections were opened so far."""
        self.scopes: set[str] = {"files:read", "files:write"}
        """The bot token's file scopes; remove one to see Slack refuse."""
        self.denial = "redirect"
        """How ``url_private`` refuses a request: ``"redirect"`` (302 to the login
        page, as Slack does) or ``"403"``."""
        self.files: dict[str, SlackFile] = {}
        """Files by id."""
        self.shared: list[SharedFile] = []
        """Files shared by ``files.completeUploadExternal``, in order."""
        self.file_requests: list[tuple[str, dict[str, str], int]] = []
        """Every ``url_private`` request as ``(path, headers, status)``, in order."""
        self._failures: dict[str, list[_Failure]] = {}
        self._chaos: _Chaos | None = None
        self.injected: list[tuple[str, str]] = []
        """Every fault served, as ``(method, kind)``, in order."""
        self._last_ts = 0.0
        self._sockets: list[web.WebSocketResponse] = []
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port = 0

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Uploads may be large: the upload URL takes what Slack's would.
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # conversations.history and .replies
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/response/{id}", self._response_url)
        app.router.add_get("/files-pri/{tail:.*}", self._file_get)
        app.router.add_post("/upload/v1/{key}", self._upload_post)
        app.router.add_get("/", self._login_page)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        """Close sockets and the client session, release the port."""
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        if self._session is not None:
            await self._session.close()
            self._session = None
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
    def url(self) -> str:
        """``http://127.0.0.1:{port}`` (no trailing slash)."""
        if not self._port:
            raise RuntimeError("FakeSlack is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        """The Web API base for ``AsyncWebClient(base_url=...)``; the trailing slash matters."""
        return f"{self.url}/api/"

    def settings(self, *, socket_mode: bool = False, port: int = 0) -> dict[str, Any]:
        """Roost settings pointing the Slack channel at this fake.

        HTTP mode (bot token + signing secret) listens on ``port`` (0: any free
        one); Socket Mode uses the app token instead of the signing secret.
        """
        values: dict[str, Any] = {"slack_bot_token": self.bot_token,
                                  "slack_api_base": self.base_url, "slack_port": port}
        if socket_mode:
            values["slack_app_token"] = self.app_token
        else:
            values["slack_signing_secret"] = self.signing_secret
        return values

    # -- scripting and inspection ------------------------------------------------

    def fail(self, method: str, status: int = 429, *, times: int = 1,
             retry_after: float = 1.0, error: str = "") -> None:
        """Make the next ``times`` calls of ``method`` fail.

        429 answers ``{"ok": false, "error": "ratelimited"}`` with a
        ``Retry-After`` header (whole seconds, as Slack sends); 5xx answers an
        ``ok: false`` envelope with that status; 200 with ``error`` is an API
        error such as ``channel_not_found``. ``method`` may be
        ``"response_url"`` to fail posts to slash commands' response URLs.
        """
        if not error:
            error = "ratelimited" if status == 429 else "fatal_error" if status >= 500 \
                else "invalid_arguments"
        self._failures.setdefault(method, []).append(_Failure(status, times, retry_after, error))

    def inject(self, kind: str, method: str = "*", *, times: int = 1, retry_after: float = 1.0,
               stall: float = 0.5) -> None:
        """Serve the fault ``kind`` (one of :data:`FAULTS`) to the next ``times`` calls.

        ``method`` is a Web API method or ``"*"`` for any (``auth.test`` and
        ``apps.connections.open`` included). Queued faults of the method come
        before ``"*"`` ones.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        status = {"500": 500, "502": 502, "429": 429}.get(kind, 0)
        error = {"500": "internal_error", "429": "ratelimited"}.get(kind, "")
        self._failures.setdefault(method, []).append(
            _Failure(status, times, retry_after, error, kind=kind, stall=stall))

    def chaos(self, rate: float, *, methods: tuple[str, ...] = CHAOS_METHODS,
              kinds: tuple[str, ...] = FAULTS, seed: int = 0, retry_after: float = 1.0,
              stall: float = 0.5) -> None:
        """Fail a ``rate`` share of the calls of ``methods`` with a random kind (``0``: off).

        Seeded, so a failing run can be replayed.
        """
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self._chaos = None if rate <= 0 else _Chaos(rate, frozenset(methods), kinds,
                                                     random.Random(seed), retry_after, stall)

    def calls_of(self, method: str) -> list[Call]:
        """Every call of ``method`` (failed ones included)."""
        return [c for c in self.calls if c.method == method]

    def sent(self, method: str) -> list[Call]:
        """The successful calls of ``method``."""
        return [c for c in self.calls if c.method == method and c.ok]

    def quiet(self) -> bool:
        """Whether every call received so far has been answered (none is stalled)."""
        return all(c.done for c in self.calls)

    def visible(self, channel: str | None = None) -> list[Posted]:
        """The app's messages not deleted, optionally only in ``channel``, in posting order."""
        return [m for m in self.messages.values()
                if not m.deleted and (channel is None or m.channel == channel)]

    async def wait_for(self, method: str, count: int = 1, *, limit: float = 5.0,
                       ok: bool = True) -> list[Call]:
        """Wait until ``count`` calls of ``method`` arrived (successful ones if ``ok``)."""
        def matching() -> list[Call]:
            return self.sent(method) if ok else self.calls_of(method)

        await self.wait_until(lambda: len(matching()) >= count, limit=limit,
                              what=lambda: f"{count} {method} call(s), got {len(matching())}; "
                                           f"calls: {[c.method for c in self.calls]}")
        return matching()

    async def wait_for_responses(self, count: int = 1, *,
                                 limit: float = 5.0) -> list[ResponsePost]:
        """Wait until ``count`` posts to response URLs arrived."""
        await self.wait_until(lambda: len(self.responses) >= count, limit=limit,
                              what=lambda: f"{count} response_url post(s), "
                                           f"got {len(self.responses)}")
        return list(self.responses)

    async def wait_for_ack(self, envelope_id: str, *, limit: float = 5.0) -> dict[str, Any]:
        """Wait for the app's Socket Mode ack of ``envelope_id``; returns the ack frame."""
        await self.wait_until(lambda: envelope_id in self.acks, limit=limit,
                              what=lambda: f"an ack of {envelope_id}; acks: {list(self.acks)}")
        return self.acks[envelope_id]

    async def wait_until(self, predicate: Callable[[], bool], *, limit: float = 5.0,
                         what: Callable[[], str] | str = "the condition") -> None:
        """Wait until ``predicate()`` holds; re-checked whenever the fake records something."""
        try:
            async with asyncio.timeout(limit), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError:
            described = what() if callable(what) else what
            raise AssertionError(f"expected {described} within {limit}s") from None

    # -- building events -----------------------------------------------------------

    def next_ts(self) -> str:
        """A fresh Slack timestamp: the clock, strictly increasing (``"1763900000.123456"``)."""
        self._last_ts = max(round(time.time(), 6), round(self._last_ts + 0.000001, 6))
        return f"{self._last_ts:.6f}"

    def mention(self, text: str) -> str:
        """``text`` with the bot's ``<@U0BOT>`` mention in front."""
        return f"<@{self.bot_user_id}> {text}"

    def message(self, text: str, *, user: str = ALICE, channel: str | None = None,
                ts: str | None = None, thread_ts: str | None = None,
                channel_type: str | None = None, **extra: Any) -> dict[str, Any]:
        """A ``message`` event; ``channel_type`` follows the channel id (``D``… is ``im``)."""
        channel = channel or self.channel
        ts = ts or self.next_ts()
        event: dict[str, Any] = {
            "type": "message", "channel": channel, "user": user, "text": text, "ts": ts,
            "event_ts": ts, "channel_type": channel_type or _channel_type(channel),
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        event.update(extra)
        return event

    def direct_message(self, text: str, *, user: str = ALICE, **extra: Any) -> dict[str, Any]:
        """A ``message`` event in the DM channel (``channel_type: im``)."""
        return self.message(text, user=user, channel=self.dm_channel, **extra)

    def app_mention(self, text: str, *, user: str = ALICE, channel: str | None = None,
                    ts: str | None = None, thread_ts: str | None = None,
                    **extra: Any) -> dict[str, Any]:
        """An ``app_mention`` event (these carry no ``channel_type``)."""
        event = self.message(text, user=user, channel=channel, ts=ts, thread_ts=thread_ts,
                             **extra)
        event["type"] = "app_mention"
        del event["channel_type"]
        return event

    def bot_message(self, text: str, *, bot_id: str = "B0OTHER", channel: str | None = None,
                    **extra: Any) -> dict[str, Any]:
        """A message another bot posted (``subtype: bot_message``, ``bot_id``)."""
        event = self.message(text, channel=channel, **extra)
        del event["user"]
        event.update(subtype="bot_message", bot_id=bot_id)
        return event

    def envelope(self, event: Mapping[str, Any] | Any,
                 event_id: str | None = None) -> dict[str, Any]:
        """The ``event_callback`` body Slack wraps an event in."""
        return {
            "token": "legacy-verification-token", "team_id": self.team_id,
            "api_app_id": APP_ID, "event": event, "type": "event_callback",
            "event_id": event_id or self.next_event_id(), "event_time": int(time.time()),
            "authorizations": [{"team_id": self.team_id, "user_id": self.bot_user_id,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False,
        }

    def next_event_id(self) -> str:
        """A fresh event id (``Ev0000000001``)."""
        return f"Ev{next(self._ids):010d}"

    # -- Events API over HTTP ------------------------------------------------------

    async def post_event(self, event: Mapping[str, Any] | Any, *, event_id: str | None = None,
                         retry_num: int | None = None, retry_reason: str = "http_timeout",
                         forge: bool = False) -> Delivery:
        """Send ``event`` in an ``event_callback``; reuse ``event_id`` to redeliver.

        ``retry_num`` adds ``X-Slack-Retry-Num``/``-Reason`` as Slack does on
        redeliveries; ``forge`` signs with the wrong secret.
        """
        body = self.envelope(event, event_id)
        headers: dict[str, str] = {}
        if retry_num is not None:
            headers = {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": retry_reason}
        delivery = await self.post_body(json.dumps(body), headers=headers, forge=forge)
        return Delivery(delivery.status, delivery.body, delivery.elapsed, body["event_id"])

    async def deliver_event(self, event: Mapping[str, Any] | Any, *,
                            event_id: str | None = None, retries: int = 3,
                            answer_within: float = 3.0) -> list[Delivery]:
        """Deliver ``event`` as Slack does: again while the app fails to answer 2xx.

        An answer other than 2xx, or none within ``answer_within`` (Slack's 3 s), is
        followed by a redelivery of the same ``event_id`` with
        ``X-Slack-Retry-Num`` 1, 2, ... and ``X-Slack-Retry-Reason``
        (``http_error``/``http_timeout``), at most ``retries`` times. Returns
        every delivery; one that timed out has status 0.
        """
        body = self.envelope(event, event_id)
        raw = json.dumps(body)
        deliveries: list[Delivery] = []
        reason = ""
        for attempt in range(retries + 1):
            headers = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": reason} \
                if attempt else {}
            started = time.perf_counter()
            try:
                answer = await asyncio.wait_for(self.post_body(raw, headers=headers),
                                                answer_within)
            except TimeoutError:
                deliveries.append(Delivery(0, "", time.perf_counter() - started,
                                           body["event_id"]))
                reason = "http_timeout"
                continue
            deliveries.append(Delivery(answer.status, answer.body, answer.elapsed,
                                       body["event_id"]))
            if 200 <= answer.status < 300:
                break
            reason = "http_error"
        return deliveries

    async def url_verification(self, challenge: str = "challenge-token") -> Delivery:
        """Send the ``url_verification`` request Slack makes when the URL is configured."""
        body = {"token": "legacy-verification-token", "challenge": challenge,
                "type": "url_verification"}
        return await self.post_body(json.dumps(body))

    async def post_body(self, body: str | bytes, *, content_type: str = "application/json",
                        headers: Mapping[str, str] | None = None, forge: bool = False,
                        timestamp: int | str | None = None,
                        signature: str | None = None) -> Delivery:
        """POST raw ``body`` (signed unless ``forge``) to :attr:`events_url`.

        ``timestamp`` may be any header text (``"1.5"``, ``""``): the body is
        signed over it as given, the way a hostile client with the secret
        would. ``signature`` replaces the computed signature header.
        """
        if self.events_url is None or self._session is None:
            raise RuntimeError("set FakeSlack.events_url (and start the fake) first")
        raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        stamp = int(time.time()) if timestamp is None else timestamp
        secret = "not-" + self.signing_secret if forge else self.signing_secret
        all_headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": str(stamp),
                       "X-Slack-Signature": sign(raw, stamp, secret) if signature is None
                       else signature,
                       "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
                       **(headers or {})}
        started = time.perf_counter()
        async with self._session.post(self.events_url, data=raw, headers=all_headers) as resp:
            text = await resp.text()
            return Delivery(resp.status, text, time.perf_counter() - started)

    async def slash_command(self, text: str = "", *, command: str = "/roost", user: str = ALICE,
                            user_name: str = "alice", channel: str | None = None,
                            forge: bool = False) -> SlashResult:
        """Invoke a slash command over HTTP (form-encoded, like Slack).

        The answer must come within 3 s (Slack's limit); the app's reply then
        arrives at ``result.response_url`` (see :attr:`responses`).
        """
        form = self._slash_payload(text, command, user, user_name, channel)
        body = urllib.parse.urlencode(form)
        result = await self.post_body(body, content_type="application/x-www-form-urlencoded",
                                      forge=forge)
        return SlashResult(result.status, result.body, result.elapsed, form["response_url"])

    def _slash_payload(self, text: str, command: str, user: str, user_name: str,
                       channel: str | None) -> dict[str, str]:
        channel = channel or self.channel
        n = next(self._ids)
        return {
            "token": "legacy-verification-token", "team_id": self.team_id,
            "team_domain": "fake", "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user, "user_name": user_name, "command": command, "text": text,
            "api_app_id": APP_ID, "is_enterprise_install": "false",
            "response_url": f"{self.url}/response/{n}", "trigger_id": f"trigger.{n}",
        }

    # -- Socket Mode ---------------------------------------------------------------

    async def socket_event(self, event: Mapping[str, Any] | Any, *,
                           event_id: str | None = None,
                           retry_attempt: int | None = None) -> str:
        """Push ``event`` as an ``events_api`` envelope; returns the envelope id."""
        payload = self.envelope(event, event_id)
        frame: dict[str, Any] = {"type": "events_api", "payload": payload,
                                 "accepts_response_payload": False}
        if retry_attempt is not None:
            frame.update(retry_attempt=retry_attempt, retry_reason="timeout")
        return await self.socket_send(frame)

    async def deliver_socket_event(self, event: Mapping[str, Any] | Any, *,
                                   event_id: str | None = None, retries: int = 3,
                                   ack_timeout: float = 1.0) -> list[str]:
        """Push ``event`` and push it again while it is not acked, as Slack does.

        An envelope not acked within ``ack_timeout`` is sent again (a new
        envelope id, the same ``event_id``, ``retry_attempt`` 1, 2, ...), at most
        ``retries`` times. Returns the envelope ids sent; the last one is acked
        unless every try went unanswered (see :attr:`acks`).
        """
        payload = self.envelope(event, event_id)
        sent: list[str] = []
        for attempt in range(retries + 1):
            frame: dict[str, Any] = {"type": "events_api", "payload": payload,
                                     "accepts_response_payload": False}
            if attempt:
                frame.update(retry_attempt=attempt, retry_reason="timeout")
            envelope_id = await self.socket_send(frame)
            sent.append(envelope_id)
            try:
                await self.wait_for_ack(envelope_id, limit=ack_timeout)
            except AssertionError:
                continue
            break
        return sent

    async def socket_slash_command(self, text: str = "", *, command: str = "/roost",
                                   user: str = ALICE, user_name: str = "alice",
                                   channel: str | None = None) -> tuple[str, str]:
        """Push a ``slash_commands`` envelope; returns (envelope id, response_url)."""
        payload = self._slash_payload(text, command, user, user_name, channel)
        envelope_id = await self.socket_send({"type": "slash_commands", "payload": payload,
                                              "accepts_response_payload": True})
        return envelope_id, payload["response_url"]

    async def socket_send(self, frame: dict[str, Any] | str) -> str:
        """Send a raw frame on the newest socket (an ``envelope_id`` is added to dicts)."""
        open_sockets = [ws for ws in self._sockets if not ws.closed]
        if not open_sockets:
            raise AssertionError("no Socket Mode connection is open")
        envelope_id = ""
        if isinstance(frame, dict):
            envelope_id = str(frame.setdefault("envelope_id", f"env-{next(self._ids)}"))
            frame = json.dumps(frame)
        await open_sockets[-1].send_str(frame)
        return envelope_id

    async def wait_for_socket(self, *, limit: float = 5.0) -> None:
        """Wait until a Socket Mode connection is open."""
        await self.wait_until(lambda: any(not ws.closed for ws in self._sockets),
                              limit=limit, what="a Socket Mode connection")

    # -- serving -------------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: dict[str, Any] = {}
        if request.can_read_body:
            if request.content_type == "application/json":
                loaded = await request.json()
                params = dict(loaded) if isinstance(loaded, dict) else {}
            else:
                params = dict((await request.post()).items())
        params.update(request.query.items())
        auth = request.headers.get("Authorization", "")
        token = str(params.pop("token", "")) or (auth[7:] if auth.startswith("Bearer ") else "")
        call = Call(method, params, token, time.perf_counter())
        self.calls.append(call)
        failure = self._take_failure(method)
        if failure is not None and failure.kind != "status":
            self.injected.append((method, failure.kind))
            return await self._fault(request, call, failure)
        status, data, headers = self._answer(method, params, token, failure)
        return await self._finish(call, status, data, headers)

    async def _finish(self, call: Call, status: int, data: dict[str, Any],
                      headers: Mapping[str, str]) -> web.Response:
        call.status, call.ok = status, bool(data.get("ok"))
        call.error = str(data.get("error", ""))
        call.done = True
        await self._notify()
        return web.json_response(data, status=status, headers=headers)

    async def _fault(self, request: web.Request, call: Call, failure: _Failure) -> web.Response:
        """Serve an injected fault the way Slack's infrastructure fails."""
        kind = failure.kind
        if kind == "502":
            call.status, call.ok, call.error, call.done = 502, False, "bad_gateway", True
            await self._notify()
            return web.Response(status=502, text=BAD_GATEWAY_PAGE, content_type="text/html")
        if kind == "500":
            return await self._finish(call, 500, {"ok": False, "error": "internal_error"}, {})
        if kind == "429":
            return await self._finish(call, 429, {"ok": False, "error": "ratelimited"},
                                      {"Retry-After": str(max(1, round(failure.retry_after)))})
        if kind in ("reset_before", "disconnect"):
            call.status, call.ok, call.error, call.done = 0, False, kind, True
            await self._notify()
            _reset(request, hard=kind == "reset_before")
            return web.Response(status=500)  # never written: the connection is gone
        if kind == "truncated":
            call.status, call.ok, call.error, call.done = 200, False, "truncated", True
            await self._notify()
            return web.Response(status=200, text='{"ok": true, "chan',
                                content_type="application/json")
        if kind == "stall":
            # The call takes effect once the stall is over, even if the
            # client gave up waiting meanwhile (as a slow Slack does).
            await asyncio.sleep(failure.stall)
        status, data, headers = self._answer(call.method, call.params, call.token, None)
        response = await self._finish(call, status, data, headers)
        if kind == "reset_after":
            call.error = "reset_after"  # took effect; the answer is lost
            _reset(request)
        return response

    def _take_failure(self, method: str) -> _Failure | None:
        for key in (method, "*"):
            queue = self._failures.get(key)
            if not queue:
                continue
            failure = queue[0]
            failure.remaining -= 1
            if failure.remaining <= 0:
                queue.pop(0)
            return failure
        chaos = self._chaos
        if chaos is not None and method in chaos.methods and chaos.rng.random() < chaos.rate:
            kind = chaos.rng.choice(chaos.kinds)
            status = {"500": 500, "502": 502, "429": 429}.get(kind, 0)
            return _Failure(status, 1, chaos.retry_after, "", kind=kind, stall=chaos.stall)
        return None

    def _answer(self, method: str, params: dict[str, Any], token: str,
                failure: _Failure | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            return 200, {"ok": False, "error": "invalid_auth" if token else "not_authed"}, {}
        if failure is not None:
            headers = {"Retry-After": str(max(1, round(failure.retry_after)))} \
                if failure.status == 429 else {}
            return failure.status, {"ok": False, "error": failure.error}, headers
        handler = _METHODS.get(method)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        return 200, handler(self, params), {}

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake Team",
                "user": "roost", "team_id": self.team_id, "user_id": self.bot_user_id,
                "bot_id": self.bot_id, "is_enterprise_install": False}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, text = str(params.get("channel") or ""), params.get("text")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not isinstance(text, str) or not text.strip():
            return {"ok": False, "error": "no_text"}
        if len(text) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        ts = self.next_ts()
        thread_ts = params.get("thread_ts")
        metadata = params.get("metadata")
        if isinstance(metadata, str):  # form-encoded calls send it as JSON text
            with contextlib.suppress(ValueError):
                metadata = json.loads(metadata)
        posted = Posted(channel, ts, text, str(thread_ts) if thread_ts else None,
                        metadata=metadata if isinstance(metadata, dict) else None)
        self.messages[ts] = posted
        return {"ok": True, "channel": channel, "ts": ts,
                "message": self._message_object(posted, with_metadata=False)}

    def _message_object(self, posted: Posted, *, with_metadata: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "message", "user": self.bot_user_id,
                                   "bot_id": self.bot_id, "text": posted.text, "ts": posted.ts}
        if posted.thread_ts:
            message["thread_ts"] = posted.thread_ts
        if with_metadata and posted.metadata is not None:
            message["metadata"] = posted.metadata
        return message

    def _history(self, params: dict[str, Any]) -> dict[str, Any]:
        """``conversations.history``: top-level messages after ``oldest``, newest first.

        Only the bot's own messages are known to the fake; metadata is included
        with ``include_all_metadata``, as on Slack.
        """
        channel = str(params.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        found = [m for m in self._read_back(params) if m.channel == channel and not m.thread_ts]
        return self._page(list(reversed(found)), params)

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        """``conversations.replies``: a thread's messages after ``oldest``, oldest first."""
        channel, thread = str(params.get("channel") or ""), str(params.get("ts") or "")
        if not channel or not thread:
            return {"ok": False, "error": "thread_not_found"}
        found = [m for m in self._read_back(params)
                 if m.channel == channel and (m.thread_ts == thread or m.ts == thread)]
        return self._page(found, params)

    def _read_back(self, params: dict[str, Any]) -> list[Posted]:
        oldest = float(params.get("oldest") or 0)
        return [m for m in self.messages.values() if not m.deleted and float(m.ts) > oldest]

    def _page(self, found: list[Posted], params: dict[str, Any]) -> dict[str, Any]:
        limit = int(params.get("limit") or 100)
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        return {"ok": True, "has_more": len(found) > limit,
                "messages": [self._message_object(m, with_metadata=with_metadata)
                             for m in found[:limit]]}

    def _find(self, params: dict[str, Any]) -> Posted | dict[str, Any]:
        posted = self.messages.get(str(params.get("ts") or ""))
        if posted is None or posted.deleted or posted.channel != params.get("channel"):
            return {"ok": False, "error": "message_not_found"}
        return posted

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._find(params)
        if not isinstance(found, Posted):
            return found
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            return {"ok": False, "error": "no_text"}
        if len(text) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        found.edits.append(found.text)
        found.text = text
        return {"ok": True, "channel": found.channel, "ts": found.ts, "text": text}

    def _delete(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._find(params)
        if not isinstance(found, Posted):
            return found
        found.deleted = True
        return {"ok": True, "channel": found.channel, "ts": found.ts}

    def _connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        ws_url = self.url.replace("http://", "ws://", 1)
        return {"ok": True, "url": f"{ws_url}/socket?ticket={next(self._ids)}"}

    def _conversation_info(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        is_im = channel.startswith("D")
        return {"ok": True, "channel": {"id": channel, "name": "" if is_im else "general",
                                        "is_channel": channel.startswith("C"),
                                        "is_group": channel.startswith("G"), "is_im": is_im,
                                        "is_private": not channel.startswith("C")}}

    # -- files ---------------------------------------------------------------------

    def file(self, data: bytes, name: str, mimetype: str = "application/octet-stream", *,
             width: int | None = None, height: int | None = None,
             audio_ms: int | None = None, size: int | None = None,
             user: str = ALICE) -> dict[str, Any]:
        """Store ``data``; the file object a message event carries in ``files``.

        ``width``/``height`` are an image's ``original_w``/``original_h``;
        ``audio_ms`` makes it a clip recorded in Slack (``subtype: slack_audio``);
        ``size`` overrides the declared size (a payload that lies).
        """
        file_id = f"F0{next(self._ids):08d}"
        self.files[file_id] = SlackFile(file_id, name, mimetype, data)
        return self._file_object(self.files[file_id], user=user, size=size, width=width,
                                 height=height, audio_ms=audio_ms)

    def _file_object(self, file: SlackFile, *, user: str, size: int | None = None,
                     width: int | None = None, height: int | None = None,
                     audio_ms: int | None = None) -> dict[str, Any]:
        base = f"{self.url}/files-pri/{self.team_id}-{file.id}"
        quoted = urllib.parse.quote(file.name)
        now = int(time.time())
        found: dict[str, Any] = {
            "id": file.id, "created": now, "timestamp": now, "name": file.name,
            "title": file.title or file.name, "mimetype": file.mimetype,
            "filetype": file.name.rsplit(".", 1)[-1] if "." in file.name else "binary",
            "pretty_type": file.mimetype, "user": user, "user_team": self.team_id,
            "editable": False, "size": len(file.data or b"") if size is None else size,
            "mode": "hosted", "is_external": False, "external_type": "", "is_public": False,
            "public_url_shared": False, "display_as_bot": False, "username": "",
            "url_private": f"{base}/{quoted}", "url_private_download":
            f"{base}/download/{quoted}",
            "permalink": f"https://fake.slack.com/files/{user}/{file.id}/{quoted}",
            "is_starred": False, "has_rich_preview": False, "file_access": "visible"}
        if width is not None and height is not None:
            found["original_w"], found["original_h"] = width, height
        if audio_ms is not None:
            found.update(subtype="slack_audio", duration_ms=audio_ms,
                         media_display_type="audio")
        return found

    async def _file_get(self, request: web.Request) -> web.StreamResponse:
        """``url_private``: the bytes for the bot token with ``files:read``; else Slack's no."""
        headers = dict(request.headers)
        failure = self._take_failure("url_private")
        if failure is not None:
            self.file_requests.append((request.path, headers, failure.status))
            if failure.kind in ("reset_before", "reset_after", "disconnect"):
                _reset(request)
                return web.Response(status=500)  # never written: the connection is gone
            return web.Response(status=failure.status or 500, text=BAD_GATEWAY_PAGE,
                                content_type="text/html")
        parts = request.path.split("/")  # ["", "files-pri", "T-F", ("download",) name]
        file_id = parts[2].rsplit("-", 1)[-1] if len(parts) > 3 else ""
        file = self.files.get(file_id)
        authorized = (request.headers.get("Authorization") == f"Bearer {self.bot_token}"
                      and "files:read" in self.scopes)
        if not authorized:
            status = 403 if self.denial == "403" else 302
            self.file_requests.append((request.path, headers, status))
            if status == 403:
                return web.Response(status=403, text="Forbidden")
            redirect = urllib.parse.quote(request.path, safe="")
            return web.Response(status=302, headers={"Location": f"{self.url}/?redir={redirect}"})
        status = 200 if file is not None and file.data is not None else 404
        self.file_requests.append((request.path, headers, status))
        if file is None or file.data is None:
            return web.Response(status=404, text="file_not_found")
        return web.Response(body=file.data, content_type=file.mimetype)

    async def _login_page(self, request: web.Request) -> web.Response:
        return web.Response(text="<!DOCTYPE html><html><head><title>Slack</title></head><body>"
                                 "<h1>Sign in to Fake Team</h1></body></html>",
                            content_type="text/html")

    def _file_info(self, params: dict[str, Any]) -> dict[str, Any]:
        if "files:read" not in self.scopes:
            return {"ok": False, "error": "missing_scope", "needed": "files:read",
                    "provided": ",".join(sorted(self.scopes))}
        file = self.files.get(str(params.get("file") or ""))
        if file is None or file.data is None:
            return {"ok": False, "error": "file_not_found"}
        return {"ok": True, "file": self._file_object(file, user=ALICE), "comments": [],
                "response_metadata": {"next_cursor": ""}}

    def _get_upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        if "files:write" not in self.scopes:
            return {"ok": False, "error": "missing_scope", "needed": "files:write",
                    "provided": ",".join(sorted(self.scopes))}
        filename, length = str(params.get("filename") or ""), str(params.get("length") or "")
        if not filename or not length.isdigit() or int(length) <= 0:
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F0{next(self._ids):08d}"
        self.files[file_id] = SlackFile(file_id, filename, _guess_type(filename), None,
                                        length=int(length))
        return {"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    async def _upload_post(self, request: web.Request) -> web.Response:
        file = self.files.get(request.match_info["key"])
        if file is None or file.data is not None:
            return web.Response(status=404, text="upload_url_expired")
        data = await request.read()
        if request.content_type == "multipart/form-data":  # Slack takes both forms
            form = await request.post()
            field = next(iter(form.values()), None)
            data = field.file.read() if isinstance(field, web.FileField) else b""
        if len(data) != file.length:
            return web.Response(status=400, text="length_mismatch")
        file.data = data
        return web.Response(text=f"OK - {len(data)}")

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        try:
            items = json.loads(str(params.get("files") or ""))
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        if not isinstance(items, list) or not items:
            return {"ok": False, "error": "invalid_arguments"}
        channel = str(params.get("channel_id") or "") or None
        thread_ts = str(params.get("thread_ts") or "") or None
        if thread_ts and not channel:
            return {"ok": False, "error": "invalid_arguments"}
        done = []
        for item in items:
            file = self.files.get(str(item.get("id") if isinstance(item, dict) else ""))
            if file is None or file.data is None:
                return {"ok": False, "error": "file_not_found"}
            file.title = str(item.get("title") or file.name)
            done.append(file)
        for file in done:
            if channel is not None:
                self.shared.append(SharedFile(channel, thread_ts, file.name, file.title,
                                              file.data or b"",
                                              str(params.get("initial_comment") or "")))
        return {"ok": True, "files": [self._file_object(f, user=self.bot_user_id)
                                      for f in done]}

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.socket_connections += 1
        await ws.send_str(json.dumps({
            "type": "hello", "num_connections": 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 3600},
            "connection_info": {"app_id": APP_ID}}))
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    frame = json.loads(msg.data)
                    if isinstance(frame, dict) and "envelope_id" in frame:
                        self.acks[str(frame["envelope_id"])] = frame
                        await self._notify()
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws

    async def _response_url(self, request: web.Request) -> web.Response:
        url = f"{self.url}{request.path}"
        failure = self._take_failure("response_url")
        if failure is not None:
            headers = {"Retry-After": str(max(1, round(failure.retry_after)))} \
                if failure.status == 429 else {}
            return web.Response(status=failure.status, text=failure.error, headers=headers)
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(ResponsePost(url, body if isinstance(body, dict) else {},
                                           time.perf_counter()))
        await self._notify()
        return web.Response(text="ok")


_METHODS: dict[str, Callable[[FakeSlack, dict[str, Any]], dict[str, Any]]] = {
    "auth.test": FakeSlack._auth_test,
    "chat.postMessage": FakeSlack._post_message,
    "chat.update": FakeSlack._update,
    "chat.delete": FakeSlack._delete,
    "apps.connections.open": FakeSlack._connections_open,
    "conversations.info": FakeSlack._conversation_info,
    "conversations.history": FakeSlack._history,
    "conversations.replies": FakeSlack._replies,
    "files.info": FakeSlack._file_info,
    "files.getUploadURLExternal": FakeSlack._get_upload_url,
    "files.completeUploadExternal": FakeSlack._complete_upload,
}


def _guess_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _reset(request: web.Request, *, hard: bool = True) -> None:
    """Drop the connection: a TCP RST (``hard``) as a reset mid-call looks, else a close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if hard and isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _channel_type(channel: str) -> str:
    if channel.startswith("D"):
        return "im"
    return "group" if channel.startswith("G") else "channel"


# -- pytest ---------------------------------------------------------------------------------

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the fake works without pytest installed
    pass
else:
    @pytest_asyncio.fixture(name="fake_slack")
    async def fake_slack() -> AsyncIterator[FakeSlack]:
        """A started :class:`FakeSlack`, stopped after the test.

        Named explicitly, so a test module can import it under another name
        (``from bot.testing.slack import fake_slack as _fixture``) without the
        parameter shadowing the import.
        """
        async with FakeSlack() as fake:
            yield fake
