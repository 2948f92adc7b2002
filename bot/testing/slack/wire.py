"""The fake Slack's ids and tokens, the records it keeps, and small HTTP helpers."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import mimetypes
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

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
    blocks: list[Any] = field(default_factory=list)
    """Its Block Kit blocks, as last set (buttons in ``actions`` blocks)."""


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
class Failure:
    """One scripted failure: what it answers and how many more calls it fails."""

    status: int
    remaining: int
    retry_after: float
    error: str
    kind: str = "status"
    """``"status"`` (answer ``status``/``error``) or one of :data:`FAULTS`."""
    stall: float = 0.0


@dataclass(slots=True)
class Chaos:
    """Random failures: the share of calls, the methods and kinds, and the seeded generator."""

    rate: float
    methods: frozenset[str]
    kinds: tuple[str, ...]
    rng: random.Random
    retry_after: float
    stall: float


def guess_type(name: str) -> str:
    """The MIME type of a file name (``application/octet-stream`` when unknown)."""
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def reset_connection(request: web.Request, *, hard: bool = True) -> None:
    """Drop the connection: a TCP RST (``hard``) as a reset mid-call looks, else a close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if hard and isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def channel_type_of(channel: str) -> str:
    """An event's ``channel_type`` for a channel id: ``im``, ``group`` or ``channel``."""
    if channel.startswith("D"):
        return "im"
    return "group" if channel.startswith("G") else "channel"
