"""The fake Discord's ids, payload shapes and small HTTP helpers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

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
    components: list[Any] = field(default_factory=list)
    """Its message components (action rows of buttons), as last set."""



@dataclass(slots=True)
class Failure:
    """One scripted REST failure: what it answers, how often, and which calls it matches."""

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
        """Whether a call of ``method`` to ``path`` is one this failure is for."""
        return (self.method is None or self.method == method) and (
            self.path is None or self.path.search(path) is not None)


@dataclass(slots=True)
class Interaction:
    """An interaction the fake dispatched: its token and whether it was deferred."""

    id: int
    token: str
    channel_id: int
    deferred: bool = False
    created: float = field(default_factory=time.monotonic)
    """When it was dispatched: its first callback must come within ``ack_within``."""
    acknowledged: int = 0
    """The type of the callback that answered it (0: none yet)."""
    message_id: int | None = None
    """The message whose component was used (component interactions)."""
    followups: list[dict[str, Any]] = field(default_factory=list)
    """Follow-up messages sent with its token (``flags`` 64: ephemeral)."""


class Socket:
    """One gateway connection and its sequence numbers."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.seq = 0
        self.shard = (0, 1)
        """``(shard_id, shard_count)`` from its IDENTIFY (``(0, 1)``: unsharded)."""

    async def send(self, payload: Mapping[str, Any]) -> None:
        """Send one gateway payload as a JSON text frame."""
        # Text frames: the client only inflates binary ones, so compression
        # can be ignored even though it asks for zlib-stream.
        await self.ws.send_str(json.dumps(payload))

    async def dispatch(self, event: str, data: Any) -> None:
        """Send a dispatch (op 0) with the next sequence number."""
        self.seq += 1
        await self.send({"op": 0, "t": event, "s": self.seq, "d": data})


def message_object(message_id: int, channel_id: int, content: str,
                   author: dict[str, Any], *, guild_id: int | None) -> dict[str, Any]:
    """A message object as Discord sends it (no attachments, mentions or flags yet)."""
    data: dict[str, Any] = {
        "id": str(message_id), "channel_id": str(channel_id), "type": 0, "content": content,
        "author": author, "timestamp": TIMESTAMP, "edited_timestamp": None, "tts": False,
        "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
        "embeds": [], "pinned": False, "flags": 0, "components": [],
    }
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
    return data


def text_channel(channel_id: int = CHANNEL_ID, guild_id: int = GUILD_ID) -> dict[str, Any]:
    """A guild text channel object."""
    return {"id": str(channel_id), "type": 0, "name": "general", "position": 0,
            "guild_id": str(guild_id), "permission_overwrites": [], "nsfw": False,
            "parent_id": None}


def shard_of(guild_id: int | None, shard_count: int) -> int:
    """The shard Discord sends a guild's events to: ``(guild_id >> 22) % shard_count``;
    DMs (no guild) go to shard 0."""
    return 0 if guild_id is None else (guild_id >> 22) % shard_count


def thread_channel() -> dict[str, Any]:
    """The thread of the test guild's text channel."""
    return {"id": str(THREAD_ID), "type": 11, "name": "a thread", "guild_id": str(GUILD_ID),
            "parent_id": str(CHANNEL_ID), "owner_id": str(USER_ID), "message_count": 1,
            "member_count": 1, "rate_limit_per_user": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                "archive_timestamp": TIMESTAMP, "locked": False}}


def guild_create(guild_id: int = GUILD_ID, channel_id: int = CHANNEL_ID) -> dict[str, Any]:
    """A GUILD_CREATE: the test guild (a text channel, a thread, the bot's role), or
    another guild with one text channel (:meth:`FakeDiscord.add_guild`)."""
    role = {"permissions": "0", "color": 0, "hoist": False, "mentionable": False,
            "flags": 0}
    return {
        "id": str(guild_id), "name": "Test Guild", "unavailable": False, "member_count": 2,
        "owner_id": str(USER_ID), "features": [], "emojis": [], "stickers": [],
        "roles": [{**role, "id": str(guild_id), "name": "@everyone", "position": 0,
                   "managed": False},
                  {**role, "id": str(BOT_ROLE_ID), "name": "testbot", "position": 1,
                   "managed": True, "tags": {"bot_id": str(BOT_ID)}}],
        "channels": [text_channel(channel_id, guild_id)],
        "threads": [thread_channel()] if guild_id == GUILD_ID else [],
        "members": [], "voice_states": [], "presences": [],
        "joined_at": TIMESTAMP, "large": False,
    }


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None,
                  ) -> web.Response:
    """A JSON answer with exactly the content type discord.py parses."""
    # Exactly "application/json": with "; charset=utf-8" discord.py reads the
    # body as a string, not JSON.
    return web.Response(status=status, body=json.dumps(data).encode(),
                        headers={"Content-Type": "application/json", **(headers or {})})


async def read_multipart(request: web.Request,
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


def cdn_signature(path: str, expires: str) -> str:
    """The ``hm`` query parameter of a CDN URL for ``path`` expiring at ``expires``."""
    # Stands in for Discord's HMAC over the path and expiry.
    return hashlib.sha256(f"{path}:{expires}".encode()).hexdigest()[:32]


def path_id(url: str) -> str:
    """The attachment id in a CDN URL (``/attachments/{channel}/{id}/{name}``)."""
    return urllib.parse.urlsplit(url).path.split("/")[-2]


def no_content() -> web.Response:
    """An empty 204 answer."""
    return web.Response(status=204)


def not_found() -> web.Response:
    """A 404 in Discord's error shape."""
    return json_response({"message": "404: Not Found", "code": 0}, status=404)


FAULT_STATUS = {"500": 500, "502": 502, "503": 503, "429": 429}
"""The HTTP status of each fault kind that answers one."""


def failure_response(failure: Failure) -> web.Response:
    """The answer Discord (or the proxy in front of it) gives for ``failure``."""
    if failure.status == 429:
        wait = f"{failure.retry_after:g}"
        return json_response({"message": "You are being rate limited.",
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
    return json_response({"message": f"{failure.status}: injected failure", "code": 0},
                         status=failure.status)


def bot_message_payload(msg: FakeMessage) -> dict[str, Any]:
    """The message object Discord returns for a message the bot created."""
    data = message_object(msg.id, msg.channel_id, msg.content,
                          user_payload(BOT_ID, "testbot", bot=True), guild_id=None)
    data["attachments"] = [
        {"id": path_id(f.url), "filename": f.filename, "size": len(f.data),
         "url": f.url, "proxy_url": f.url, "content_type": f.content_type}
        for f in msg.files]
    if msg.edits:
        data["edited_timestamp"] = TIMESTAMP
    data["components"] = list(msg.components)
    return data


def reset_connection(request: web.Request) -> None:
    """Reset the connection (a TCP RST, as a connection dropped mid-call looks)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
