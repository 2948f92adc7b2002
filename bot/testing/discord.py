"""A local fake of Discord: the REST API and the gateway websocket on 127.0.0.1.

The real ``discord.py`` client runs against it unchanged; point it there with
the ``DISCORD_API_BASE`` and ``DISCORD_GATEWAY_URL`` settings (see
:meth:`FakeDiscord.settings`)::

    async def test_hello(fake_discord: FakeDiscord) -> None:
        app = await Roost.create(Settings(**fake_discord.settings()), ...)
        await app.start_channel("discord")
        fake_discord.dm("hello")
        call = await fake_discord.wait_for_call("POST", "/channels/4000/messages")

What it speaks (see ``/work/shared/notes/fake-platform-servers.md``):

- REST under ``/api/v10``: ``users/@me``, ``oauth2/applications/@me``, channel
  messages (POST, PATCH, DELETE), typing, global application commands (PUT),
  interaction callbacks and the interaction webhook (``@original`` edit and
  delete, followups). Anything else gets a 404 in Discord's error shape, and
  a call without ``Authorization: Bot <token>`` a 401.
  Every call is recorded in :attr:`FakeDiscord.calls`, rejected ones too;
  :meth:`FakeDiscord.fail_next` makes the next matching calls answer 429
  (with ``Retry-After`` and a JSON ``retry_after``) or a 5xx.
  ``GET /channels/{id}/messages`` reads a channel's history as Discord does
  (newest first; ``after``/``before`` exclusive, ``limit`` up to 100): the
  users' messages pushed or recorded as missed (:meth:`FakeDiscord.missed`)
  and the bot's own. ``GET /channels/{id}`` describes the known channels. A
  message created with ``enforce_nonce`` and a nonce seen before returns the
  earlier message instead of a new one, as on Discord.
- Faults, the ways the real Discord fails: :meth:`FakeDiscord.inject` queues
  one of :data:`FAULTS` for matching calls and :meth:`FakeDiscord.chaos` fails
  a random share of them: ``"500"`` (JSON), ``"502"`` (an HTML page from the
  proxy), ``"503"``, ``"429"`` (JSON ``retry_after`` with ``X-RateLimit-*``
  headers), ``"reset_before"`` (TCP reset before the call took effect),
  ``"reset_after"`` (it took effect, then the reset) and ``"stall"`` (the
  answer comes ``stall`` seconds late).
- Files, as on Discord: :meth:`FakeDiscord.attachment` puts bytes on the fake
  CDN (``/attachments/{channel}/{id}/{name}?ex=..&is=..&hm=..``; an unsigned,
  expired or unknown URL gets 404 "This content is no longer available.", as
  the real CDN answers) and returns the attachment object to put in a message
  (``attachments=`` of the message helpers). :meth:`FakeDiscord.fail_cdn`
  makes the next CDN requests fail. Message creation accepts multipart
  bodies as discord.py sends them (``payload_json`` and ``files[n]``),
  validated like the API: more than 10 files or an empty message are a 400,
  files over :attr:`FakeDiscord.upload_limit` together (10 MiB) a 413 with
  code 40005 "Request entity too large". Uploaded files are kept on the
  message (:attr:`FakeMessage.files`) and served by the CDN.
- The gateway at ``/gateway``: HELLO, heartbeat ACKs, IDENTIFY → READY and one
  GUILD_CREATE (a text channel, a thread in it and the bot's managed role),
  RESUME → RESUMED. Helpers push MESSAGE_CREATE (guild, mention, reply to the
  bot, thread, DM, from another bot, malformed) and INTERACTION_CREATE.
  :meth:`FakeDiscord.invalidate_session` sends INVALID_SESSION (``d: false``):
  the client IDENTIFYs again and gets a new READY, as after a reconnect
  Discord could not resume (the events meanwhile are not replayed).

The server never closes a gateway socket by itself: the client would try to
RESUME, which is not what a test wants to see.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import random
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
import pytest_asyncio
from aiohttp import WSMsgType, web

__all__ = [
    "APP_ID",
    "BOT_ID",
    "BOT_ROLE_ID",
    "CHANNEL_ID",
    "DM_CHANNEL_ID",
    "FAULTS",
    "GUILD_ID",
    "OTHER_BOT_ID",
    "THREAD_ID",
    "USER_ID",
    "FakeDiscord",
    "FakeMessage",
    "RestCall",
    "UploadedFile",
    "fake_discord",
]

BOT_ID = 1000
APP_ID = 1100
GUILD_ID = 2000
BOT_ROLE_ID = 2100
CHANNEL_ID = 3000
THREAD_ID = 3001
DM_CHANNEL_ID = 4000
USER_ID = 5000
OTHER_BOT_ID = 6000
TIMESTAMP = "2024-01-01T00:00:00.000000+00:00"
API_PREFIX = "/api/v10"
FAULTS = ("500", "502", "503", "429", "reset_before", "reset_after", "stall")
"""The fault kinds :meth:`FakeDiscord.inject` and :meth:`FakeDiscord.chaos` know."""
CHAOS_PATHS = r"^/channels/\d+/messages"
"""What :meth:`FakeDiscord.chaos` fails by default: creating, editing, deleting
and reading messages."""
UPLOAD_LIMIT = 10 * 1024 * 1024
"""Discord's upload limit per message without server boosts (10 MiB)."""
MAX_FILES = 10
"""Files one message may carry."""
CDN_GONE = "This content is no longer available."
"""What Discord's CDN answers (404, text) for an unsigned, expired or unknown URL."""
BAD_GATEWAY_PAGE = """<html>
<head><title>502 Bad Gateway</title></head>
<body><center><h1>502 Bad Gateway</h1></center><hr><center>cloudflare</center></body>
</html>
"""


def user_payload(user_id: int, name: str, *, bot: bool = False) -> dict[str, Any]:
    """A Discord user object."""
    data: dict[str, Any] = {"id": str(user_id), "username": name, "discriminator": "0",
                            "global_name": name.title(), "avatar": None}
    if bot:
        data["bot"] = True
    return data


@dataclass(frozen=True, slots=True)
class RestCall:
    """One REST request the fake received and how it answered."""

    method: str
    path: str
    """Relative to ``/api/v10``, e.g. ``/channels/3000/messages``."""
    query: Mapping[str, str]
    body: Any
    """The JSON body (``None`` when there was none)."""
    headers: Mapping[str, str]
    status: int
    at: float
    """``time.monotonic()`` when it arrived."""


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """One file a message was created with (a ``files[n]`` part)."""

    filename: str
    content_type: str
    data: bytes
    url: str
    """Where the fake CDN serves it."""


@dataclass(slots=True)
class FakeMessage:
    """A message the bot created through REST (channel message or interaction response)."""

    id: int
    channel_id: int
    content: str
    reference: Mapping[str, Any] | None = None
    allowed_mentions: Mapping[str, Any] | None = None
    edits: list[str] = field(default_factory=list)
    """Every later content, in order (the last one is :attr:`content`)."""
    deleted: bool = False
    interaction_id: int | None = None
    files: list[UploadedFile] = field(default_factory=list)
    """The files uploaded with it, in order."""


@dataclass(slots=True)
class _Failure:
    status: int
    remaining: int
    retry_after: float
    method: str | None
    path: re.Pattern[str] | None
    kind: str = "status"
    """``"status"`` (answer ``status``) or one of :data:`FAULTS`."""
    stall: float = 0.0
    html: bool = False

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or self.path.search(path) is not None)


@dataclass(slots=True)
class _Interaction:
    id: int
    token: str
    channel_id: int
    deferred: bool = False


class FakeDiscord:
    """The fake Discord server. Use it as an async context manager or via ``fake_discord``."""

    def __init__(self, *, token: str = "test-discord-token") -> None:
        self.token = token
        self.calls: list[RestCall] = []
        """Every REST request, in order."""
        self.messages: dict[int, FakeMessage] = {}
        """Messages the bot created, by id."""
        self.commands: list[dict[str, Any]] = []
        """The global application commands from the last bulk overwrite."""
        self.identifies: list[dict[str, Any]] = []
        """Every IDENTIFY payload's ``d`` (intents, token...)."""
        self.resumes = 0
        self.user_messages: dict[int, dict[str, Any]] = {}
        """Messages users sent (pushed live or recorded as missed), by id."""
        self.injected: list[tuple[str, str, str]] = []
        """Every fault served, as ``(method, path, kind)``, in order."""
        self.upload_limit = UPLOAD_LIMIT
        """The most bytes of files one message may carry (413 beyond)."""
        self.cdn_requests: list[tuple[str, Mapping[str, str], int]] = []
        """Every CDN request as ``(path with query, headers, status)``, in order."""
        self._cdn: dict[str, tuple[bytes, str, bool]] = {}
        self._cdn_failures: list[int | str] = []
        self._nonces: dict[str, int] = {}
        self._chaos: tuple[float, str | None, re.Pattern[str], tuple[str, ...],
                           random.Random, float, float] | None = None
        self._sockets: list[_Socket] = []
        self._failures: list[_Failure] = []
        self._interactions: dict[int, _Interaction] = {}
        self._ids = itertools.count(900_000)
        self._serving = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Bodies past the upload limit must reach the handler, which answers
        # them as Discord does (413, code 40005), not as aiohttp would.
        app = web.Application(client_max_size=8 * UPLOAD_LIMIT)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/attachments/{tail:.*}", self._cdn_get)
        app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the open gateway sockets, stop serving and release the port."""
        for sock in list(self._sockets):
            await sock.ws.close()
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
    def api_base(self) -> str:
        """The REST base, as ``discord.http.Route.BASE`` expects it."""
        return f"http://127.0.0.1:{self._require_port()}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """The gateway websocket URL."""
        return f"ws://127.0.0.1:{self._require_port()}/gateway"

    def settings(self) -> dict[str, Any]:
        """Roost settings that point the Discord channel at this fake."""
        return {"discord_bot_token": self.token, "discord_api_base": self.api_base,
                "discord_gateway_url": self.gateway_url}

    def _require_port(self) -> int:
        if not self._port:
            raise RuntimeError("FakeDiscord is not started")
        return self._port

    # -- scripting REST ------------------------------------------------------

    def fail_next(self, status: int, count: int = 1, *, retry_after: float = 0.2,
                  method: str | None = None, path: str | None = None,
                  html: bool = False) -> None:
        """Answer the next ``count`` matching REST calls with ``status``.

        ``path`` is a regular expression searched in the path below ``/api/v10``
        and ``method`` an HTTP method; both default to any. A 429 carries
        ``Retry-After`` and JSON ``retry_after`` = ``retry_after`` seconds, plus
        the ``Via`` header without which discord.py takes a 429 for a
        Cloudflare ban and gives up. ``html`` answers an HTML error page
        instead of Discord's JSON.
        """
        self._failures.append(_Failure(status, count, retry_after, method,
                                       re.compile(path) if path else None, html=html))

    def inject(self, kind: str, count: int = 1, *, method: str | None = None,
               path: str | None = None, retry_after: float = 0.2,
               stall: float = 0.5) -> None:
        """Serve the fault ``kind`` (one of :data:`FAULTS`) to the next ``count`` matching calls.

        Note that discord.py retries 500, 502 (and 504) by itself after 1, 3,
        5... seconds, and sleeps through 429s up to its ``max_ratelimit_timeout``.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        self._failures.append(_Failure(_FAULT_STATUS.get(kind, 0), count, retry_after, method,
                                       re.compile(path) if path else None, kind=kind,
                                       stall=stall))

    def chaos(self, rate: float, *, method: str | None = None, path: str = CHAOS_PATHS,
              kinds: Sequence[str] = FAULTS, seed: int = 0, retry_after: float = 0.2,
              stall: float = 0.5) -> None:
        """Fail a ``rate`` share of the matching calls with a random kind (``0``: off)."""
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self._chaos = None if rate <= 0 else (rate, method, re.compile(path), tuple(kinds),
                                               random.Random(seed), retry_after, stall)

    def _take_failure(self, method: str, path: str) -> _Failure | None:
        failure = next((f for f in self._failures if f.matches(method, path)), None)
        if failure is not None:
            failure.remaining -= 1
            if failure.remaining <= 0:
                self._failures.remove(failure)
            return failure
        if self._chaos is not None:
            rate, only, pattern, kinds, rng, retry_after, stall = self._chaos
            if ((only is None or only == method) and pattern.search(path)
                    and rng.random() < rate):
                kind = rng.choice(kinds)
                return _Failure(_FAULT_STATUS.get(kind, 0), 1, retry_after, None, None,
                                kind=kind, stall=stall)
        return None

    def quiet(self) -> bool:
        """Whether no REST call is being answered right now (none is stalled)."""
        return self._serving == 0

    async def wait_until_quiet(self, limit: float = 10.0) -> None:
        """Wait until no REST call is being answered (a stalled one has landed)."""
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(self.quiet)

        await asyncio.wait_for(wait(), limit)

    def calls_to(self, method: str, path: str = "") -> list[RestCall]:
        """Recorded calls with ``method`` whose path matches the regex ``path``."""
        pattern = re.compile(path)
        return [c for c in self.calls if c.method == method and pattern.search(c.path)]

    async def wait_for_call(self, method: str, path: str = "", *, count: int = 1,
                            status: int | None = 200, limit: float = 5.0) -> RestCall:
        """Wait until ``count`` calls matched (and answered ``status``, if given); the last."""
        def found() -> list[RestCall]:
            return [c for c in self.calls_to(method, path)
                    if status is None or c.status == status]

        async def wait() -> RestCall:
            async with self._changed:
                await self._changed.wait_for(lambda: len(found()) >= count)
                return found()[count - 1]

        return await asyncio.wait_for(wait(), limit)

    def posted(self, channel_id: int | None = None) -> list[FakeMessage]:
        """Messages the bot created (in ``channel_id``), oldest first, deleted ones included."""
        return [m for m in self.messages.values()
                if channel_id is None or m.channel_id == channel_id]

    def visible(self, channel_id: int | None = None) -> list[str]:
        """What a user sees: the current text of every message not deleted."""
        return [m.content for m in self.posted(channel_id) if not m.deleted]

    # -- REST ------------------------------------------------------------------

    async def _rest(self, request: web.Request) -> web.Response:
        self._serving += 1
        try:
            return await self._serve(request)
        finally:
            self._serving -= 1
            async with self._changed:
                self._changed.notify_all()

    async def _serve(self, request: web.Request) -> web.Response:
        path = request.path[len(API_PREFIX):]
        body: Any = None
        files: list[tuple[str, str, bytes]] | None = None
        if request.content_type == "multipart/form-data":
            body, files = await _read_multipart(request)
        elif request.can_read_body:
            raw = await request.read()
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
        failure = self._take_failure(request.method, path)
        kind = failure.kind if failure is not None else ""
        if failure is not None and kind != "status":
            self.injected.append((request.method, path, kind))
        if kind == "stall":
            # The call takes effect after the stall, even if the client gave up.
            await asyncio.sleep(failure.stall if failure is not None else 0)
        if failure is not None and kind not in ("stall", "reset_after"):
            if kind == "reset_before":
                await self._record(RestCall(request.method, path, dict(request.query), body,
                                            dict(request.headers), 0, time.monotonic()))
                _reset(request)
                return web.Response(status=500)  # never written: the connection is gone
            response = _failure_response(failure)
        elif not self._authorized(path, request.headers.get("Authorization", "")):
            response = _json({"message": "401: Unauthorized", "code": 0}, status=401)
        else:
            try:
                rejected = None if files is None else self._check_upload(body, files)
                response = rejected or self._route(request.method, path, request.query, body,
                                                   files or [])
            except (KeyError, TypeError, ValueError) as exc:
                response = _json({"message": f"400: Bad Request ({exc})", "code": 50035},
                                 status=400)
        await self._record(RestCall(request.method, path, dict(request.query), body,
                                    dict(request.headers), response.status, time.monotonic()))
        if kind == "reset_after":
            _reset(request)  # it took effect; the answer is lost
        return response

    async def _record(self, call: RestCall) -> None:
        async with self._changed:
            self.calls.append(call)
            self._changed.notify_all()

    def _authorized(self, path: str, authorization: str) -> bool:
        # Interaction callbacks and webhooks are authorized by their token in the path.
        if path.startswith(("/interactions/", "/webhooks/")):
            return True
        return authorization == f"Bot {self.token}"

    def _route(self, method: str, path: str, query: Mapping[str, str],
               body: Any, files: Sequence[tuple[str, str, bytes]] = ()) -> web.Response:
        if method == "GET" and path == "/users/@me":
            return _json(user_payload(BOT_ID, "testbot", bot=True))
        if method == "GET" and path == "/oauth2/applications/@me":
            return _json(self._application())
        if m := re.fullmatch(r"/channels/(\d+)/typing", path):
            return _no_content()
        if m := re.fullmatch(r"/channels/(\d+)", path):
            if method != "GET":
                return _not_found()
            return self._channel(int(m[1]))
        if m := re.fullmatch(r"/channels/(\d+)/messages", path):
            if method == "GET":
                return _json(self._history(int(m[1]), query))
            if method != "POST":
                return _not_found()
            data = body if isinstance(body, dict) else {}
            nonce = data.get("nonce")
            if data.get("enforce_nonce") and nonce is not None and str(nonce) in self._nonces:
                earlier = self.messages[self._nonces[str(nonce)]]
                return _json(self._message_payload(earlier))
            if not str(data.get("content") or "") and not files and not data.get("embeds"):
                return _json({"message": "Cannot send an empty message", "code": 50006},
                             status=400)
            msg = self._create(int(m[1]), body, files=files)
            if nonce is not None:
                self._nonces[str(nonce)] = msg.id
            return _json(self._message_payload(msg))
        if m := re.fullmatch(r"/channels/(\d+)/messages/(\d+)", path):
            return self._change(method, int(m[2]), body)
        if m := re.fullmatch(r"/applications/(\d+)/commands", path):
            if method != "PUT":
                return _not_found()
            self.commands = [dict(c) for c in body]
            return _json([{**c, "id": str(next(self._ids)), "application_id": str(APP_ID),
                           "version": "1", "type": c.get("type", 1),
                           "default_member_permissions": None, "nsfw": False}
                          for c in self.commands])
        if m := re.fullmatch(r"/interactions/(\d+)/([^/]+)/callback", path):
            return self._callback(int(m[1]), m[2], query, body)
        if m := re.fullmatch(r"/webhooks/(\d+)/([^/]+)/messages/@original", path):
            return self._original(method, m[2], body)
        if m := re.fullmatch(r"/webhooks/(\d+)/([^/]+)", path):
            if method != "POST":
                return _not_found()
            interaction = self._by_token(m[2])
            if interaction is None:
                return _not_found()
            msg = self._create(interaction.channel_id, body, interaction_id=interaction.id)
            if query.get("wait") in ("true", "1", "True"):
                return _json(self._message_payload(msg))
            return _no_content()
        return _not_found()

    def _channel(self, channel_id: int) -> web.Response:
        if channel_id == CHANNEL_ID:
            return _json(_text_channel())
        if channel_id == THREAD_ID:
            return _json(_thread())
        if channel_id == DM_CHANNEL_ID:
            return _json({"id": str(DM_CHANNEL_ID), "type": 1, "last_message_id": None,
                          "recipients": [user_payload(USER_ID, "alice")]})
        return _json({"message": "Unknown Channel", "code": 10003}, status=404)

    def _history(self, channel_id: int, query: Mapping[str, str]) -> list[dict[str, Any]]:
        """A page of a channel's messages, as Discord serves it.

        Newest first whatever the direction; ``after`` takes the oldest
        ``limit`` messages newer than it, ``before`` (or neither) the newest
        ``limit`` older than it; both bounds are exclusive.
        """
        limit = max(1, min(100, int(query.get("limit", "50"))))
        found = [dict(data) for data in self.user_messages.values()
                 if int(data["channel_id"]) == channel_id]
        found += [self._message_payload(m) for m in self.messages.values()
                  if m.channel_id == channel_id and not m.deleted and m.interaction_id is None]
        found.sort(key=lambda data: int(data["id"]))
        if "after" in query:
            after = int(query["after"])
            page = [d for d in found if int(d["id"]) > after][:limit]
        else:
            before = int(query["before"]) if "before" in query else None
            older = [d for d in found if before is None or int(d["id"]) < before]
            page = older[-limit:]
        return list(reversed(page))

    def _application(self) -> dict[str, Any]:
        return {"id": str(APP_ID), "name": "testbot", "description": "", "icon": None,
                "bot_public": True, "bot_require_code_grant": False, "verify_key": "00",
                "flags": 0, "owner": user_payload(USER_ID, "owner"),
                "bot": user_payload(BOT_ID, "testbot", bot=True)}

    def _create(self, channel_id: int, body: Any, *, interaction_id: int | None = None,
                files: Sequence[tuple[str, str, bytes]] = ()) -> FakeMessage:
        data = body if isinstance(body, dict) else {}
        msg = FakeMessage(id=next(self._ids), channel_id=channel_id,
                          content=str(data.get("content") or ""),
                          reference=data.get("message_reference"),
                          allowed_mentions=data.get("allowed_mentions"),
                          interaction_id=interaction_id)
        for filename, content_type, blob in files:
            attachment = self.attachment(blob, filename, content_type, channel_id=channel_id)
            msg.files.append(UploadedFile(filename, content_type, blob, attachment["url"]))
        self.messages[msg.id] = msg
        return msg

    def _check_upload(self, body: Any, files: Sequence[tuple[str, str, bytes]],
                      ) -> web.Response | None:
        """The API's answer to a multipart body it refuses, or ``None`` if it takes it."""
        if not isinstance(body, dict):
            return _json({"message": "Invalid Form Body", "code": 50035, "errors": {
                "payload_json": {"_errors": [{"code": "DICT_TYPE_CONVERT",
                                              "message": "Only dictionaries may be used "
                                                         "in a DictType"}]}}}, status=400)
        if len(files) > MAX_FILES:
            return _json({"message": "Invalid Form Body", "code": 50035, "errors": {
                "files": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                       "message": f"Must be {MAX_FILES} or fewer in "
                                                  "length."}]}}}, status=400)
        if sum(len(blob) for _, _, blob in files) > self.upload_limit:
            return _json({"message": "Request entity too large", "code": 40005}, status=413)
        return None

    def _change(self, method: str, message_id: int, body: Any) -> web.Response:
        msg = self.messages.get(message_id)
        if msg is None or msg.deleted:
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        if method == "DELETE":
            msg.deleted = True
            return _no_content()
        if method == "PATCH":
            msg.content = str((body or {}).get("content") or "")
            msg.edits.append(msg.content)
            return _json(self._message_payload(msg))
        return _not_found()

    def _callback(self, interaction_id: int, token: str, query: Mapping[str, str],
                  body: Any) -> web.Response:
        interaction = self._interactions.get(interaction_id)
        if interaction is None or interaction.token != token:
            return _json({"message": "Unknown interaction", "code": 10062}, status=404)
        kind = int(body.get("type", 0))
        if kind == 5:
            interaction.deferred = True
        elif kind == 4:
            data = body.get("data") or {}
            self._create(interaction.channel_id, data, interaction_id=interaction.id)
        if query.get("with_response") in ("1", "true", "True"):
            return _json({"interaction": {"id": str(interaction_id), "type": 2,
                                          "response_message_loading": kind == 5,
                                          "response_message_ephemeral": False},
                          "resource": {"type": kind}})
        return _no_content()

    def _original(self, method: str, token: str, body: Any) -> web.Response:
        interaction = self._by_token(token)
        if interaction is None:
            return _not_found()
        original = next((m for m in self.messages.values()
                         if m.interaction_id == interaction.id), None)
        if method == "PATCH":
            if original is None:
                # The deferred "thinking" message becomes the answer on its first edit.
                original = self._create(interaction.channel_id, {},
                                        interaction_id=interaction.id)
            original.content = str((body or {}).get("content") or "")
            original.edits.append(original.content)
            original.allowed_mentions = (body or {}).get("allowed_mentions")
            return _json(self._message_payload(original))
        if method == "DELETE":
            if original is not None:
                original.deleted = True
            interaction.deferred = False
            return _no_content()
        return _not_found()

    def _by_token(self, token: str) -> _Interaction | None:
        return next((i for i in self._interactions.values() if i.token == token), None)

    def _message_payload(self, msg: FakeMessage) -> dict[str, Any]:
        data = _message(msg.id, msg.channel_id, msg.content,
                        user_payload(BOT_ID, "testbot", bot=True),
                        guild_id=None)
        data["attachments"] = [
            {"id": _path_id(f.url), "filename": f.filename, "size": len(f.data),
             "url": f.url, "proxy_url": f.url, "content_type": f.content_type}
            for f in msg.files]
        if msg.edits:
            data["edited_timestamp"] = TIMESTAMP
        return data

    # -- CDN -------------------------------------------------------------------

    def attachment(self, data: bytes, filename: str, content_type: str | None = None, *,
                   channel_id: int = CHANNEL_ID, width: int | None = None,
                   height: int | None = None, voice_seconds: float | None = None,
                   size: int | None = None, chunked: bool = False) -> dict[str, Any]:
        """Put ``data`` on the CDN; the attachment object a message carries.

        ``size`` overrides the declared size (a payload that lies); ``chunked``
        serves the bytes without a Content-Length. ``voice_seconds`` makes it
        a voice message's attachment (``duration_secs`` and ``waveform``).
        """
        attachment_id = next(self._ids)
        path = f"/attachments/{channel_id}/{attachment_id}/{filename}"
        self._cdn[path] = (data, content_type or "application/octet-stream", chunked)
        expires = f"{int(time.time()) + 86_400:x}"
        url = (f"http://127.0.0.1:{self._require_port()}{path}?ex={expires}"
               f"&is={int(time.time()):x}&hm={_cdn_signature(path, expires)}&")
        found: dict[str, Any] = {"id": str(attachment_id), "filename": filename,
                                 "size": len(data) if size is None else size, "url": url,
                                 "proxy_url": url.replace("/attachments/",
                                                          "/media/attachments/", 1)}
        if content_type is not None:
            found["content_type"] = content_type
        if width is not None and height is not None:
            found["width"], found["height"] = width, height
        if voice_seconds is not None:
            found["duration_secs"] = voice_seconds
            found["waveform"] = "AAAAAAAAAAAA"
        return found

    def expire(self, url: str) -> None:
        """Forget the file behind a CDN ``url``: it answers 404 from now on."""
        self._cdn.pop(urllib.parse.urlsplit(url).path, None)

    def fail_cdn(self, fault: int | str, count: int = 1) -> None:
        """Fail the next ``count`` CDN requests: an HTTP status, or ``"reset"``."""
        self._cdn_failures.extend([fault] * count)

    async def _cdn_get(self, request: web.Request) -> web.StreamResponse:
        found = self._cdn.get(request.path)
        expires = request.query.get("ex", "")
        status = 200
        if self._cdn_failures:
            fault = self._cdn_failures.pop(0)
            if fault == "reset":
                self.cdn_requests.append((request.path_qs, dict(request.headers), 0))
                _reset(request)
                return web.Response(status=500)  # never written: the connection is gone
            status = int(fault)
        elif (found is None or request.query.get("hm") != _cdn_signature(request.path, expires)
              or int(expires or "0", 16) < time.time()):
            status = 404
        self.cdn_requests.append((request.path_qs, dict(request.headers), status))
        if status != 200 or found is None:
            return web.Response(status=status, text=CDN_GONE if status == 404
                                else f"{status} Error", content_type="text/plain")
        data, content_type, chunked = found
        if not chunked:
            return web.Response(body=data, content_type=content_type)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(data), 16_384):
            await response.write(data[start:start + 16_384])
        await response.write_eof()
        return response

    # -- gateway ---------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        sock = _Socket(ws)
        await sock.send({"op": 10, "d": {"heartbeat_interval": 30_000}})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                try:
                    payload = json.loads(frame.data)
                except ValueError:
                    continue
                await self._on_gateway(sock, payload)
        finally:
            if sock in self._sockets:
                self._sockets.remove(sock)
            async with self._changed:
                self._changed.notify_all()
        return ws

    async def _on_gateway(self, sock: _Socket, payload: dict[str, Any]) -> None:
        op = payload.get("op")
        if op == 1:
            await sock.send({"op": 11})
        elif op == 2:
            self.identifies.append(dict(payload.get("d") or {}))
            await sock.dispatch("READY", {
                "v": 10, "user": user_payload(BOT_ID, "testbot", bot=True),
                "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
                "session_id": f"session-{len(self.identifies)}",
                "resume_gateway_url": self.gateway_url,
                "application": {"id": str(APP_ID), "flags": 0},
                "private_channels": [], "relationships": [],
            })
            await sock.dispatch("GUILD_CREATE", _guild())
            await self._activate(sock)
        elif op == 6:
            self.resumes += 1
            await sock.dispatch("RESUMED", {})
            await self._activate(sock)

    async def _activate(self, sock: _Socket) -> None:
        async with self._changed:
            self._sockets.append(sock)
            self._changed.notify_all()

    async def wait_identified(self, count: int = 1, limit: float = 5.0) -> None:
        """Wait until ``count`` IDENTIFYs arrived and a session is live."""
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: len(self.identifies) >= count and bool(self._sockets))

        await asyncio.wait_for(wait(), limit)

    async def dispatch(self, event: str, data: Any) -> None:
        """Send a dispatch (op 0) ``event`` to every live gateway session."""
        if not self._sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        for sock in list(self._sockets):
            await sock.dispatch(event, data)

    async def dispatch_raw(self, event: str, data: str) -> None:
        """Dispatch ``event`` whose ``d`` is the JSON text ``data``, spliced in verbatim.

        For payloads no Python object serializes to (nesting past any
        decoder's depth); the frame gets its sequence number like any other.
        """
        if not self._sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        for sock in list(self._sockets):
            sock.seq += 1
            await sock.ws.send_str(f'{{"op": 0, "t": {json.dumps(event)}, "s": {sock.seq}, '
                                   f'"d": {data}}}')

    async def send_raw(self, frame: str) -> None:
        """Send ``frame`` verbatim as a text frame (e.g. something that is not JSON)."""
        for sock in list(self._sockets):
            await sock.ws.send_str(frame)

    # -- pushing events --------------------------------------------------------

    def message_payload(self, content: str, *, channel_id: int = CHANNEL_ID,
                        guild: bool = True, author: Mapping[str, Any] | None = None,
                        mentions: Sequence[Mapping[str, Any]] = (),
                        mention_roles: Sequence[int] = (),
                        referenced: FakeMessage | Mapping[str, Any] | None = None,
                        message_id: int | None = None,
                        attachments: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """A MESSAGE_CREATE payload from a user (``author``; Alice by default)."""
        data = _message(message_id or next(self._ids), channel_id, content,
                        dict(author or user_payload(USER_ID, "alice")),
                        guild_id=GUILD_ID if guild else None)
        data["attachments"] = [dict(a) for a in attachments]
        if any("waveform" in a for a in attachments):
            data["flags"] = 1 << 13  # IS_VOICE_MESSAGE
        data["mentions"] = [dict(m) for m in mentions]
        data["mention_roles"] = [str(r) for r in mention_roles]
        if referenced is not None:
            ref = (self._message_payload(referenced) if isinstance(referenced, FakeMessage)
                   else dict(referenced))
            data["type"] = 19
            data["message_reference"] = {"message_id": ref["id"],
                                         "channel_id": ref["channel_id"],
                                         **({"guild_id": str(GUILD_ID)} if guild else {})}
            data["referenced_message"] = ref
        return data

    async def push_message(self, data: Mapping[str, Any]) -> int:
        """Dispatch a MESSAGE_CREATE with ``data`` (kept in the history); its message id."""
        self.user_messages[int(data["id"])] = dict(data)
        await self.dispatch("MESSAGE_CREATE", dict(data))
        return int(data["id"])

    def missed(self, content: str, *, channel_id: int = CHANNEL_ID, mention: bool = False,
               author: Mapping[str, Any] | None = None) -> int:
        """A message sent while the bot was not connected: in the history, never dispatched.

        ``channel_id`` :data:`DM_CHANNEL_ID` makes it a DM. Returns its id.
        """
        guild = channel_id != DM_CHANNEL_ID
        mentions = [user_payload(BOT_ID, "testbot", bot=True)] if mention else []
        data = self.message_payload(f"<@{BOT_ID}> {content}" if mention else content,
                                    channel_id=channel_id, guild=guild, author=author,
                                    mentions=mentions)
        self.user_messages[int(data["id"])] = data
        return int(data["id"])

    async def invalidate_session(self) -> None:
        """Send INVALID_SESSION (not resumable) to every live session: the client IDENTIFYs anew."""
        for sock in list(self._sockets):
            self._sockets.remove(sock)
            await sock.send({"op": 9, "d": False})

    async def guild_message(self, content: str, *, mention: bool = False,
                            channel_id: int = CHANNEL_ID,
                            author: Mapping[str, Any] | None = None,
                            message_id: int | None = None,
                            attachments: Sequence[Mapping[str, Any]] = ()) -> int:
        """A message in the guild text channel; ``mention`` prefixes ``<@bot>``."""
        mentions = [user_payload(BOT_ID, "testbot", bot=True)] if mention else []
        text = f"<@{BOT_ID}> {content}" if mention else content
        return await self.push_message(self.message_payload(
            text, channel_id=channel_id, author=author, mentions=mentions,
            message_id=message_id, attachments=attachments))

    async def role_mention(self, content: str) -> int:
        """A message that mentions the bot's managed role instead of the bot."""
        return await self.push_message(self.message_payload(
            f"<@&{BOT_ROLE_ID}> {content}", mention_roles=[BOT_ROLE_ID]))

    async def reply_to_bot(self, message: FakeMessage, content: str) -> int:
        """A reply (with a message reference) to one of the bot's messages."""
        return await self.push_message(self.message_payload(
            content, channel_id=message.channel_id, referenced=message))

    async def thread_message(self, content: str, *, mention: bool = False) -> int:
        """A message in the thread of the guild text channel."""
        return await self.guild_message(content, mention=mention, channel_id=THREAD_ID)

    async def dm(self, content: str, *, author: Mapping[str, Any] | None = None,
                 message_id: int | None = None,
                 attachments: Sequence[Mapping[str, Any]] = ()) -> int:
        """A direct message to the bot (with ``attachments`` from :meth:`attachment`)."""
        return await self.push_message(self.message_payload(
            content, channel_id=DM_CHANNEL_ID, guild=False, author=author,
            message_id=message_id, attachments=attachments))

    async def bot_message(self, content: str, *, mention: bool = True) -> int:
        """A guild message from another bot (mentioning ours by default)."""
        return await self.guild_message(
            content, mention=mention, author=user_payload(OTHER_BOT_ID, "otherbot", bot=True))

    async def malformed(self) -> None:
        """A MESSAGE_CREATE the client cannot parse (no author, a non-numeric id)."""
        await self.dispatch("MESSAGE_CREATE", {"id": "not-a-snowflake",
                                               "channel_id": str(CHANNEL_ID),
                                               "guild_id": str(GUILD_ID), "content": "?"})

    async def interaction(self, name: str, args: str = "", *, user_id: int = USER_ID,
                          channel_id: int = CHANNEL_ID, guild: bool = True) -> int:
        """An INTERACTION_CREATE for the slash command ``/name`` with option ``args``."""
        data = self.interaction_payload(name, args, user_id=user_id, channel_id=channel_id,
                                        guild=guild)
        await self.dispatch("INTERACTION_CREATE", data)
        return int(data["id"])

    def interaction_payload(self, name: str, args: str = "", *, user_id: int = USER_ID,
                            channel_id: int = CHANNEL_ID, guild: bool = True) -> dict[str, Any]:
        """The INTERACTION_CREATE payload :meth:`interaction` sends (its callbacks work).

        For tests that change it before dispatching it themselves.
        """
        interaction = _Interaction(next(self._ids), f"itoken-{next(self._ids)}", channel_id)
        self._interactions[interaction.id] = interaction
        user = user_payload(user_id, "alice")
        data: dict[str, Any] = {
            "id": str(interaction.id), "application_id": str(APP_ID), "type": 2,
            "token": interaction.token, "version": 1, "attachment_size_limit": 8_388_608,
            "locale": "en-US", "app_permissions": "0",
            "data": {"id": "7777", "name": name, "type": 1,
                     **({"options": [{"name": "args", "type": 3, "value": args}]}
                        if args else {})},
            "channel_id": str(channel_id),
        }
        if guild:
            data["guild_id"] = str(GUILD_ID)
            data["guild_locale"] = "en-US"
            data["channel"] = (_thread() if channel_id == THREAD_ID
                               else _text_channel(channel_id))
            data["member"] = {"user": user, "roles": [], "joined_at": TIMESTAMP,
                              "deaf": False, "mute": False, "flags": 0, "permissions": "0"}
            data["context"] = 0
        else:
            data["channel"] = {"id": str(channel_id), "type": 1, "recipients": [user]}
            data["user"] = user
            data["context"] = 1
        return data

    def interaction_deferred(self, interaction_id: int) -> bool:
        """Whether the interaction was answered with a deferred (type 5) response."""
        return self._interactions[interaction_id].deferred


class _Socket:
    """One gateway connection and its sequence numbers."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.seq = 0

    async def send(self, payload: Mapping[str, Any]) -> None:
        # Text frames: the client only inflates binary ones, so compression
        # can be ignored even though it asks for zlib-stream.
        await self.ws.send_str(json.dumps(payload))

    async def dispatch(self, event: str, data: Any) -> None:
        self.seq += 1
        await self.send({"op": 0, "t": event, "s": self.seq, "d": data})


def _message(message_id: int, channel_id: int, content: str, author: dict[str, Any],
             *, guild_id: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(message_id), "channel_id": str(channel_id), "type": 0, "content": content,
        "author": author, "timestamp": TIMESTAMP, "edited_timestamp": None, "tts": False,
        "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
        "embeds": [], "pinned": False, "flags": 0, "components": [],
    }
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
    return data


def _text_channel(channel_id: int = CHANNEL_ID) -> dict[str, Any]:
    return {"id": str(channel_id), "type": 0, "name": "general", "position": 0,
            "guild_id": str(GUILD_ID), "permission_overwrites": [], "nsfw": False,
            "parent_id": None}


def _thread() -> dict[str, Any]:
    return {"id": str(THREAD_ID), "type": 11, "name": "a thread", "guild_id": str(GUILD_ID),
            "parent_id": str(CHANNEL_ID), "owner_id": str(USER_ID), "message_count": 1,
            "member_count": 1, "rate_limit_per_user": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                "archive_timestamp": TIMESTAMP, "locked": False}}


def _guild() -> dict[str, Any]:
    role = {"permissions": "0", "color": 0, "hoist": False, "mentionable": False,
            "flags": 0}
    return {
        "id": str(GUILD_ID), "name": "Test Guild", "unavailable": False, "member_count": 2,
        "owner_id": str(USER_ID), "features": [], "emojis": [], "stickers": [],
        "roles": [{**role, "id": str(GUILD_ID), "name": "@everyone", "position": 0,
                   "managed": False},
                  {**role, "id": str(BOT_ROLE_ID), "name": "testbot", "position": 1,
                   "managed": True, "tags": {"bot_id": str(BOT_ID)}}],
        "channels": [_text_channel()],
        "threads": [_thread()],
        "members": [], "voice_states": [], "presences": [],
        "joined_at": TIMESTAMP, "large": False,
    }


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None,
          ) -> web.Response:
    # Exactly "application/json": with "; charset=utf-8" discord.py reads the
    # body as a string, not JSON.
    return web.Response(status=status, body=json.dumps(data).encode(),
                        headers={"Content-Type": "application/json", **(headers or {})})


async def _read_multipart(request: web.Request,
                          ) -> tuple[Any, list[tuple[str, str, bytes]]]:
    """``(payload_json, files)`` of a multipart body as discord.py sends it."""
    body: Any = None
    files: list[tuple[str, str, bytes]] = []
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, aiohttp.BodyPartReader):
            continue
        blob = await part.read()
        if part.name == "payload_json":
            try:
                body = json.loads(blob)
            except ValueError:
                body = blob.decode("utf-8", "replace")
        elif part.name and part.name.startswith("files["):
            files.append((part.filename or "file",
                          part.headers.get("Content-Type", "application/octet-stream"),
                          bytes(blob)))
    return body, files


def _cdn_signature(path: str, expires: str) -> str:
    # Stands in for Discord's HMAC over the path and expiry.
    return hashlib.sha256(f"{path}:{expires}".encode()).hexdigest()[:32]


def _path_id(url: str) -> str:
    """The attachment id in a CDN URL (``/attachments/{channel}/{id}/{name}``)."""
    return urllib.parse.urlsplit(url).path.split("/")[-2]


def _no_content() -> web.Response:
    return web.Response(status=204)


def _not_found() -> web.Response:
    return _json({"message": "404: Not Found", "code": 0}, status=404)


_FAULT_STATUS = {"500": 500, "502": 502, "503": 503, "429": 429}


def _failure_response(failure: _Failure) -> web.Response:
    if failure.status == 429:
        wait = f"{failure.retry_after:g}"
        return _json({"message": "You are being rate limited.",
                      "retry_after": failure.retry_after, "global": False},
                     status=429,
                     headers={"Retry-After": wait, "Via": "1.1 google",
                              "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0",
                              "X-RateLimit-Reset": f"{time.time() + failure.retry_after:.3f}",
                              "X-RateLimit-Reset-After": wait,
                              "X-RateLimit-Bucket": "fake-bucket",
                              "X-RateLimit-Scope": "user"})
    if failure.kind == "502" or failure.html:
        return web.Response(status=failure.status, text=BAD_GATEWAY_PAGE.replace(
            "502 Bad Gateway", f"{failure.status} Error"), content_type="text/html")
    return _json({"message": f"{failure.status}: injected failure", "code": 0},
                 status=failure.status)


def _reset(request: web.Request) -> None:
    """Reset the connection (a TCP RST, as a connection dropped mid-call looks)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@pytest_asyncio.fixture(name="fake_discord")
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    """A started :class:`FakeDiscord`, stopped after the test.

    Named explicitly, so a test module can import it under another name
    (``from bot.testing.discord import fake_discord as _fixture``) without
    the parameter shadowing the import.
    """
    async with FakeDiscord() as fake:
        yield fake

