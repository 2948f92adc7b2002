"""The Bot API's wire shapes in the fake: users, recorded calls, failures, form decoding."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MB = 1024 * 1024
MAX_TEXT = 4096
"""Telegram's limit on a message's text, in UTF-16 code units after entity parsing."""


def user(user_id: int, first_name: str, username: str | None = None, *,
         is_bot: bool = False) -> dict[str, Any]:
    """A Telegram ``User`` object."""
    data: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
    if username:
        data["username"] = username
    return data


ALICE = user(42, "Alice", "alice")
"""The default sender of pushed messages."""
BOB = user(43, "Bob", "bob")
"""A second human, for groups."""


@dataclass(slots=True)
class Call:
    """One API call the fake received.

    ``status`` is 0 while the call is being answered (a long poll), then the
    HTTP status. ``params`` are decoded the way the server reads them: JSON-encoded values
    (``chat_id``, ``reply_parameters``, ``commands``...) become Python values,
    text fields stay strings. ``at`` is ``time.perf_counter()`` on arrival.
    """

    method: str
    params: dict[str, Any]
    at: float
    status: int = 200
    result: Any = None
    error: str = ""
    fault: str = ""
    """The fault injected into this call, if any (see :meth:`FakeTelegram.fail`):
    ``"status"``, ``"html"``, ``"reset_before"`` (status stays 0: nothing
    happened), ``"reset_after"`` (status 200: it took effect, the answer was
    lost), ``"stall"``, or ``"window"`` (a call inside a 429 window)."""


FAULT_KINDS = ("500", "html", "429", "reset_before", "reset_after", "stall")
"""The faults :meth:`FakeTelegram.inject_faults` draws from, as real Telegram has them."""


@dataclass(slots=True)
class Failure:
    """A scripted failure of one method (see :meth:`FakeTelegram.fail`)."""

    status: int
    description: str
    retry_after: int | None
    times: int
    kind: str = "status"
    seconds: float = 0.0
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RandomFaults:
    """Faults drawn at random (see :meth:`FakeTelegram.inject_faults`)."""

    rate: float
    kinds: tuple[str, ...]
    methods: frozenset[str] | None
    retry_after: int
    stall: float
    rng: random.Random


@dataclass(frozen=True, slots=True)
class RawJson:
    """JSON text spliced into an answer as it is (see :meth:`FakeTelegram.push_json`)."""

    text: str


def dump_json(value: Any) -> str:
    """``value`` as JSON, with :class:`RawJson` pieces spliced in verbatim."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(dump_json(v) for v in value) + "]"
    return json.dumps(value)


@dataclass(slots=True)
class Pending:
    """An update waiting to be fetched or delivered."""

    update_id: int
    payload: Any
    kind: str | None


@dataclass(slots=True)
class Webhook:
    """The webhook the bot set, and each delivery attempt ``(update_id, status)``."""

    url: str
    secret: str | None
    allowed: list[str] | None
    attempts: list[tuple[int, int]] = field(default_factory=list)


class ApiError(Exception):
    """An error answer of the Bot API: its status, description and parameters."""

    def __init__(self, status: int, description: str, retry_after: int | None = None,
                 parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after
        self.parameters = dict(parameters or {})


HTML_PAGES = {
    502: "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center>"
         "<h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.18.0</center>\r\n"
         "</body>\r\n</html>\r\n",
    504: "<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n"
         "<center><h1>504 Gateway Time-out</h1></center>\r\n<hr><center>nginx/1.18.0"
         "</center>\r\n</body>\r\n</html>\r\n",
}


# Fields whose values aiogram sends as plain strings; everything else is JSON.
_TEXT_PARAMS = frozenset({
    "text", "caption", "parse_mode", "action", "url", "secret_token", "ip_address",
    "language_code", "emoji", "name", "description", "short_description",
    "business_connection_id", "message_effect_id", "callback_query_id",
})

UPDATE_KINDS = (
    "message", "edited_message", "channel_post", "edited_channel_post", "callback_query",
    "inline_query", "my_chat_member", "chat_member", "message_reaction", "poll",
)

COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")


@dataclass(slots=True)
class StoredFile:
    """A file the fake holds: what ``getFile`` describes and the file URL serves."""

    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    name: str = ""
    mime_type: str = ""


@dataclass(frozen=True, slots=True)
class Upload:
    """A file the bot uploaded: the method, the chat, the name and bytes as received."""

    method: str
    chat_id: int | str
    name: str
    content_type: str
    data: bytes
    caption: str | None
    message_id: int


@dataclass(slots=True)
class DownloadFault:
    """A scripted failure of file downloads (see :meth:`FakeTelegram.fail_download`)."""

    kind: str
    status: int
    times: int



# -- helpers ------------------------------------------------------------------------------


def scope_of(method: str, params: Mapping[str, Any]) -> str:
    """What a 429 on this call holds: its chat, ``getUpdates`` alone, or the whole bot."""
    if params.get("chat_id") not in (None, ""):
        return f"chat:{params['chat_id']}"
    if method.lower() == "getupdates":
        return "getupdates"
    return "bot"


def drop_connection(request: web.Request) -> None:
    """Close the connection without an answer (the client sees a disconnect)."""
    if request.transport is not None:
        request.transport.abort()
    # Ends the handler quietly: aiohttp takes a cancelled handler as a client gone.
    raise asyncio.CancelledError


def public(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message without the fake's own bookkeeping keys."""
    return {k: v for k, v in message.items() if not k.startswith("_")}


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram counts text."""
    return len(text.encode("utf-16-le")) // 2


def unix_now() -> int:
    """The time as a message's ``date``."""
    return int(time.time())


def require(p: Mapping[str, Any], *names: str) -> None:
    """Raise the Bot API's 400 when one of ``names`` is missing or empty."""
    for name in names:
        if p.get(name) in (None, ""):
            raise ApiError(400, f"Bad Request: {name} is empty")


def scope_key(scope: Any) -> str:
    """The key a ``BotCommandScope`` is stored under (``"default"``, ``"chat:<id>"``...)."""
    if not isinstance(scope, dict) or scope.get("type", "default") == "default":
        return "default"
    if "chat_id" in scope:
        return f"{scope['type']}:{scope['chat_id']}"
    return str(scope["type"])


def decode_value(key: str, value: str) -> Any:
    """A form or query value: JSON-decoded, except the parameters that are plain text."""
    if key in _TEXT_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def decode_form(form: Mapping[str, Any]) -> dict[str, Any]:
    """A request's form fields decoded (files kept as they are)."""
    return {k: decode_value(k, v) if isinstance(v, str) else v for k, v in form.items()}
