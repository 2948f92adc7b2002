"""Constants, small caches and the pure helpers the parts of the Slack adapter share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError

from bot.resilience.retry import parse_retry_after
from channels.delivery import DeliveryPolicy
from channels.logline import short as _short

log = logging.getLogger("roost.channels.slack")
sdk_log = logging.getLogger("roost.channels.slack.sdk")

CHANNEL_NAME = "slack"
"""The channel's name in the core's messages."""
MESSAGE_LIMIT = 4_000
"""Slack's recommended maximum for a message's text; longer replies are split."""
DEFAULT_API_BASE = "https://slack.com/api/"
EVENTS_PATH = "/slack/events"
SLASH_COMMAND = "/roost"
RESPONSE_URL_USES = 5
"""Slack accepts at most this many posts to one ``response_url``."""
REMEMBERED = 10_000
"""Event ids, message ids and bot threads remembered (each, newest first)."""
CONNECT_TIMEOUT = 30.0
STOP_GRACE = 10.0
"""How long :meth:`SlackChannel.stop` waits for Web API calls in flight."""
METADATA_EVENT = "roost_reply"
"""The message metadata type under which each post carries its nonce."""
LOOKUP_MARGIN = 120.0
"""How far back (seconds) a failed post is looked for, to absorb clock skew."""
LOOKUP_LIMIT = 200
"""Messages read back when looking for a failed post (the newest ones)."""
SWEEP_MARGIN = 2.0
"""Seconds after the call timeout by which a timed-out post has landed, if ever."""
REDELIVERY_LOOKBACK = 24 * 3600.0
"""How far back (seconds) a reply with a ``delivery_id`` is looked for before it is
posted: an earlier attempt, maybe in a process since restarted, may have posted it."""
TRANSIENT_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable",
                              "request_timeout"})
"""Error codes Slack documents as its own trouble, sometimes sent with HTTP 200."""

# Message subtypes that are a person saying something; the rest (edits,
# deletions, joins, topic changes, bot posts...) are not addressed to the bot.
SPOKEN_SUBTYPES = frozenset({"file_share", "thread_broadcast", "me_message"})
# A streaming edit is cosmetic: one try, and the next edit or the final reply catches up.
EDIT_POLICY = DeliveryPolicy(attempts=1)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Malformed(ValueError):
    """A Slack payload missing what the adapter needs."""

class NotRecorded(Exception):
    """The core's handler raised: the delivery must not be acknowledged (Slack retries)."""


# Slack's signature headers as Slack sends them: the timestamp is whole Unix
# seconds, the signature ``v0=`` and a hex SHA-256. Anything else is refused
# before slack_sdk's verifier, which calls int() on the timestamp (a 500 for
# "1.5") and compares the signature with hmac.compare_digest (a TypeError for
# non-ASCII text).
SIGNATURE_TIMESTAMP = re.compile(r"[0-9]{1,12}")
SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
# What Slack's ids look like. The core stores ids as given (only text and
# names are cleaned of lone surrogates), so anything else is malformed.
SLACK_ID = re.compile(r"[A-Z0-9]{1,64}")
SLACK_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")
TRIGGER_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
RESPONSE_URL = re.compile(r"https?://[\x21-\x7e]{1,2000}")


@dataclass(frozen=True, slots=True)
class SlashReply:
    channel_id: str
    response_url: str


# Set while a slash command is handed to the core. The core runs the command
# in a task created inside that call, which inherits this context, so the
# command's reply (sent from that task) finds its response_url here without
# the core knowing about Slack.
SLASH_REPLY: ContextVar[SlashReply | None] = ContextVar("roost_slack_slash", default=None)


class RecentKeys(Generic[K]):
    """A set that keeps only the newest ``size`` keys."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[K, None] = OrderedDict()

    def add(self, key: K) -> bool:
        """Remember ``key``; ``False`` if it was already known."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class KeyedLocks:
    """One lock per key, alive only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


def api_base(value: str | None) -> str:
    # The SDK joins base and method by plain concatenation.
    if not value:
        return DEFAULT_API_BASE
    return value if value.endswith("/") else value + "/"


def body_problem(body: Any) -> str | None:
    """Why a request body is not handed to bolt, or ``None`` if it is one Roost takes.

    Roost takes events, the URL check, SSL checks, slash commands and button
    presses (``block_actions``, ids where bolt reads them). Anything
    else (views, shortcuts, ``app_rate_limited``, junk) is
    answered 200 and dropped here: bolt would answer a 404 (which Slack
    retries), and for some malformed shapes its middleware, and even its
    error handler, raise while reading ids out of the body.
    """
    if not isinstance(body, dict) or not body:
        return "not a JSON object or form"
    kind = body.get("type")
    if "type" in body and not isinstance(kind, str):
        return "its type is not a string"
    if kind == "event_callback":
        event = body.get("event")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return "event_callback without an event object"
        return None
    if kind == "url_verification" or body.get("ssl_check") == "1":
        return None
    if kind is None and isinstance(body.get("command"), str):
        return None
    if kind == "block_actions":
        actions, user, team = body.get("actions"), body.get("user"), body.get("team")
        if not isinstance(actions, list) or not actions \
                or not all(isinstance(a, dict) and isinstance(a.get("action_id"), str)
                           for a in actions) \
                or not isinstance(user, dict) or not isinstance(user.get("id"), str) \
                or (team is not None and not (isinstance(team, dict)
                                              and isinstance(team.get("id"), str))):
            return "a block_actions request without its actions, user or team"
        return None
    return f"a {_short(kind or 'typeless', 60)} request, which Roost does not handle"


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is ``exc`` or among the exceptions it was raised in handling."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def ts_order(ts: str) -> float:
    try:
        return float(ts)
    except ValueError:
        return float("inf")


def problem_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, Malformed) else f"{type(exc).__name__}: {_short(exc)}"


def describe_request(body: Any) -> str:
    """A request's kind, for the log line that says it was skipped."""
    if not isinstance(body, dict):
        return "not an object"
    kind = body.get("type") or ("command" if "command" in body else "no type")
    return _short(kind, 60)


def event_key(channel: str, ts: str) -> str:
    """The inbox key of one Slack message.

    A post reaches the app as a ``message`` and an ``app_mention`` event with
    different ``event_id``s (and a retry repeats either), but channel and
    ``ts`` name the message itself, so every delivery of it dedupes.
    """
    return f"{channel}:{ts}"


def header_value(request: AsyncBoltRequest, name: str) -> str | None:
    values = request.headers.get(name)
    return str(values[0]) if values else None


def team_of(body: Mapping[str, Any], event: Mapping[str, Any]) -> str | None:
    """The Slack workspace (team id) an event or command came from, if it says."""
    for value in (event.get("team"), body.get("team_id")):
        if isinstance(value, str) and SLACK_ID.fullmatch(value):
            return value
    return None


def field_of(data: Mapping[str, Any], key: str, shape: re.Pattern[str] | None = None) -> str:
    """``data[key]``, a non-empty string (of ``shape``, if given), or :class:`Malformed`."""
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise Malformed(f"missing {key!r}")
    if shape is not None and not shape.fullmatch(value):
        raise Malformed(f"{key!r} is not what Slack sends ({_short(value, 40)})")
    return value


def error_code(exc: SlackApiError) -> str:
    data = exc.response.data
    return str(data.get("error") or "") if isinstance(data, dict) else ""


def retry_after(headers: Any) -> float:
    """``Retry-After`` in seconds from SDK headers (their key case varies), default 1."""
    items = headers.items() if isinstance(headers, Mapping) else []
    for key, value in items:
        if str(key).lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) and value else value
            if (seconds := parse_retry_after(raw)) is not None:
                return seconds
    return 1.0


def command_text(command: str, args: str) -> str:
    """``/roost stop now`` → ``/stop now``; another slash command stays as typed."""
    if command == SLASH_COMMAND:
        args = args.lstrip("/").strip()
        return "/" + (args or "help")
    return f"{command} {args}".strip()


def sender_name(event: Mapping[str, Any]) -> str:
    profile = event.get("user_profile")
    if isinstance(profile, dict):
        for key in ("display_name", "real_name", "name"):
            if isinstance(profile.get(key), str) and profile[key]:
                return str(profile[key])
    return ""


@contextlib.contextmanager
def logged(what: str) -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("Slack: %s failed", what)


def manifest(command_names: str) -> str:
    return f"""\
features:
  bot_user: {{display_name: Roost, always_online: true}}
  slash_commands:
    - command: {SLASH_COMMAND}
      url: https://YOUR-HOST{EVENTS_PATH}   # HTTP mode only; omit for Socket Mode
      description: "Roost commands: {command_names}"
      usage_hint: "<command> [args]"
      should_escape: false
oauth_config:
  scopes:
    bot: [app_mentions:read, channels:history, groups:history, im:history, mpim:history,
          chat:write, commands, files:read, files:write, reactions:read, reactions:write]
settings:
  event_subscriptions:
    request_url: https://YOUR-HOST{EVENTS_PATH}   # HTTP mode only
    bot_events: [app_mention, message.channels, message.groups, message.im, message.mpim,
                 reaction_added, reaction_removed]
  interactivity:
    is_enabled: true
    request_url: https://YOUR-HOST{EVENTS_PATH}   # HTTP mode only: buttons, same endpoint
  socket_mode_enabled: false   # true with SLACK_APP_TOKEN (connections:write)"""
