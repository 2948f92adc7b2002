"""Built-in plugin: the heartbeat, a periodic check-in driven by HEARTBEAT.md.

Off unless ``enabled = true`` in ``[plugins."plugins.heartbeat"]``
(:class:`HeartbeatConfig`). Every ``interval_minutes`` within ``active_hours`` (in
``timezone``), the owner (``owner``, ``channel:user_id``) gets one minimal-prompt run
in their direct chat (``chat`` when its id differs from the user id), with their
workspace's HEARTBEAT.md as the run's extra context. A beat is skipped while
the owner has a run in flight or queued, and when HEARTBEAT.md is missing or
has nothing but headings, empty list items and comments, so an unconfigured
heartbeat costs no tokens. Each beat is an ordinary run of kind
``heartbeat``: its trace (tokens included) is in the runs table.

Suppression: the run is asked to answer ``HEARTBEAT_OK`` when nothing needs
the owner's attention. The :func:`suppress_heartbeat_ack` sanitizer (offered
only while the heartbeat is on) turns a reply that is that token, at its start
or end, plus at most :data:`ACK_MAX_CHARS` other characters into ``NO_REPLY``,
which the run loop and the stream bridge already keep from the chat; a longer
reply is delivered without the token. Sanitizers do not know the run's kind,
so this applies to every run; the token means nothing outside heartbeats.

History: beats run with ``persist=False``, so the every-30-minutes "all
quiet" turns never crowd the owner's conversation (nor count as unflushed
messages or trigger compaction). A beat that did say something is appended to
the history afterwards, so the owner can answer it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field

from roost import (
    NO_REPLY,
    ChatMessage,
    InboundMessage,
    JobSpec,
    Sanitizer,
    Settings,
    hookimpl,
    read_cached,
    user_workspace,
)

if TYPE_CHECKING:
    from roost import Runtime

log = logging.getLogger("roost.plugins.heartbeat")

PLUGIN_NAME = "plugins.heartbeat"


class HeartbeatConfig(BaseModel):
    """``[plugins."plugins.heartbeat"]``: the periodic check-in (``heartbeat*`` before)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Run a short turn with the owner's ``HEARTBEAT.md`` every interval."""
    interval_minutes: int = Field(30, ge=5)
    """Minutes between heartbeats."""
    active_hours: str = "08:00-22:00"
    """Local hours (``timezone``) in which the heartbeat runs."""
    owner: str | None = None
    """``channel:user_id`` whose direct chat and workspace the heartbeat uses."""
    chat: str | None = None
    """The owner's direct chat id on that channel, when it differs from the user id."""


def heartbeat_config(settings: Settings) -> HeartbeatConfig:
    """The heartbeat table of ``settings`` (defaults where absent); raises on a bad value."""
    return HeartbeatConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})

HEARTBEAT_FILE = "HEARTBEAT.md"
HEARTBEAT_TOKEN = "HEARTBEAT_OK"
ACK_MAX_CHARS = 300
"""A reply that is the token plus at most this many characters is not delivered."""
MAX_CHECKLIST_CHARS = 8_000
HEARTBEAT_TIMEOUT = 180.0
SANITIZER_ORDER = 800
"""After the built-in sanitizers (100..700), so thinking tags and the like are gone."""

HEARTBEAT_PROMPT = (
    "Heartbeat: a scheduled check-in, not a message from the user. Go through the "
    f"{HEARTBEAT_FILE} checklist in <extra_context>, using your tools and notes as needed. "
    "If something needs the user's attention now, write them a short message about it; "
    "don't repeat what you already told them. Otherwise reply exactly "
    f"{HEARTBEAT_TOKEN} and nothing else: it is not delivered."
)

_MARKUP = "*_`~"
_LEADING = re.compile(rf"\A\s*[{_MARKUP}]*{HEARTBEAT_TOKEN}[{_MARKUP}]*")
_TRAILING = re.compile(rf"[{_MARKUP}]*{HEARTBEAT_TOKEN}[{_MARKUP}]*[\s.!]*\Z")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_NOTHING = re.compile(r"#{1,6}(\s.*)?|[-*+](\s*\[[ xX]?\])?|[-*_]{3,}")
"""A line that says nothing: a heading, an empty list item or checkbox, a rule."""


def suppress_heartbeat_ack(text: str) -> str:
    """``NO_REPLY`` for a heartbeat acknowledgement, else ``text`` without the token.

    Also ``NO_REPLY`` for a reply that so far is only the start of the token:
    the stream bridge runs sanitizers on partial text, and must not show
    "HEART" before the rest arrives.
    """
    bare = text.strip().lstrip(_MARKUP)
    if bare and HEARTBEAT_TOKEN.startswith(bare):
        return NO_REPLY
    for pattern in (_LEADING, _TRAILING):
        match = pattern.search(text)
        if match:
            rest = (text[:match.start()] + text[match.end():]).strip()
            return NO_REPLY if len(rest) <= ACK_MAX_CHARS else rest
    return text


def is_effectively_empty(checklist: str) -> bool:
    """Whether HEARTBEAT.md gives the model nothing to check."""
    for line in _COMMENT.sub("", checklist).splitlines():
        line = line.strip()
        if line and not _NOTHING.fullmatch(line):
            return False
    return True


@dataclass(frozen=True, slots=True)
class ActiveHours:
    """A daily time range in minutes after midnight; ``end < start`` spans midnight."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> ActiveHours:
        """Parse ``"HH:MM-HH:MM"`` (``24:00`` allowed as the end); raises ``ValueError``."""
        match = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text)
        if not match:
            raise ValueError(f"active_hours {text!r} is not 'HH:MM-HH:MM'")
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if h1 > 23 or m1 > 59 or m2 > 59 or end > 24 * 60:
            raise ValueError(f"active_hours {text!r} has an impossible time")
        return cls(start, end)

    def __contains__(self, when: dt.time) -> bool:
        minute = when.hour * 60 + when.minute
        if self.start == self.end:
            return True  # "00:00-24:00" and the like: all day
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Heartbeat:
    """The heartbeat job. ``clock`` returns an aware datetime (tests move it).

    Raises ``ValueError`` naming the setting when the configuration is unusable.
    """

    def __init__(self, settings: Settings,
                 clock: Callable[[], dt.datetime] = _now) -> None:
        self.settings = settings
        self.config = config = heartbeat_config(settings)
        self.clock = clock
        owner = config.owner or ""
        channel, _, user = owner.partition(":")
        if not channel or not user:
            raise ValueError(f'[plugins."{PLUGIN_NAME}"] owner {owner!r} must be '
                             "'channel:user_id' (set it, or enabled = false)")
        self.channel, self.user = channel, user
        self.chat = config.chat or user
        try:
            self.hours = ActiveHours.parse(config.active_hours)
        except ValueError as exc:
            raise ValueError(f'[plugins."{PLUGIN_NAME}"] {exc}') from None
        try:
            self.zone = ZoneInfo(settings.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"timezone {settings.timezone!r} is not a known IANA time "
                             "zone") from exc
        # The workspace of the agent that serves the owner's direct chat.
        self.workspace = user_workspace(settings, self.message())

    def spec(self) -> JobSpec:
        """The job, for ``roost_scheduled_jobs``."""
        return JobSpec("heartbeat", f"every {self.config.interval_minutes}m",
                       self.run)

    def message(self) -> InboundMessage:
        """The heartbeat's turn, addressed to the owner's direct chat."""
        return InboundMessage(channel=self.channel, chat_id=self.chat, chat_type="direct",
                              sender_id=self.user, text=HEARTBEAT_PROMPT)

    def checklist(self) -> str:
        """The owner's HEARTBEAT.md ('' if missing or outside the workspace)."""
        return read_cached(os.path.join(self.workspace, HEARTBEAT_FILE), MAX_CHECKLIST_CHARS,
                           within=self.workspace)

    async def run(self, app: Runtime) -> None:
        """One tick of the job (what the scheduler calls)."""
        await self.beat(app)

    async def beat(self, app: Runtime) -> str:
        """Run one heartbeat if it is due; returns what happened (for logs and tests).

        ``inactive`` (outside active hours), ``no_channel`` (the owner's channel
        is not running), ``busy`` (the owner has a run in flight or queued),
        ``empty`` (nothing in HEARTBEAT.md), ``suppressed`` (nothing to say),
        ``delivered`` or ``failed``.
        """
        local = self.clock().astimezone(self.zone)
        if local.time() not in self.hours:
            return "inactive"
        if self.channel not in app.channels:
            log.warning("heartbeat skipped: channel %r is not running", self.channel)
            return "no_channel"
        message = self.message()
        key = app.key_for(message)
        if app.running_count(key) or app.queue_length(key):
            log.info("heartbeat skipped: %s has a run in progress", key)
            return "busy"
        checklist = self.checklist()
        if is_effectively_empty(checklist):
            log.debug("heartbeat skipped: %s is empty", HEARTBEAT_FILE)
            return "empty"
        result = await app.run_scheduled(
            message, mode="minimal", kind="heartbeat", extra_context=checklist,
            persist=False, timeout=HEARTBEAT_TIMEOUT, deliver_failed=False)
        log.info("heartbeat %s: %s, %d/%d tokens", result.run_id[:8],
                 "nothing to say" if result.silent else result.status,
                 result.usage.input_tokens, result.usage.output_tokens)
        if result.status != "completed":
            return "failed"
        if result.reply is None:
            return "suppressed"
        # Delivered: keep it in the conversation so a reply to it has context.
        session = await app.store.get(key)
        await app.store.append_run(session, result.run_id, [
            ChatMessage("user", message.text, sender_id=self.user,
                        sender_name=message.display_name),
            ChatMessage("assistant", result.reply),
        ])
        return "delivered"


@hookimpl
def roost_plugin_config_model() -> type[HeartbeatConfig]:
    """The ``[plugins."plugins.heartbeat"]`` table."""
    return HeartbeatConfig


@hookimpl
def roost_scheduled_jobs(settings: Settings) -> JobSpec | None:
    """The heartbeat job, when it is enabled."""
    if not heartbeat_config(settings).enabled:
        return None
    return Heartbeat(settings).spec()


@hookimpl
def roost_output_sanitizers(settings: Settings) -> Sanitizer | None:
    """Silence ``HEARTBEAT_OK`` acknowledgements, when the heartbeat is enabled."""
    if not heartbeat_config(settings).enabled:
        return None
    return Sanitizer("suppress_heartbeat_ack", suppress_heartbeat_ack, SANITIZER_ORDER)
