"""Input checks: guard patterns, the input guard, truncation, and input filters."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.config import GuardMode

log = logging.getLogger("roost.security")


@dataclass(frozen=True, slots=True)
class GuardPattern:
    """A named regular expression that flags a likely prompt injection."""

    name: str
    pattern: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class InputCheck:
    """An input filter's verdict on a user message.

    ``text`` replaces the message text when set; ``refusal`` stops the run and
    is sent to the user instead of calling the model; ``note`` is appended to
    what the model sees (for example, that the input was shortened).
    """

    text: str | None = None
    refusal: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """What the guard found in one message and what to do about it."""

    matches: tuple[str, ...]
    mode: str

    @property
    def blocked(self) -> bool:
        """True when the run must not reach the model."""
        return bool(self.matches) and self.mode == "block"


BLOCK_REFUSAL = ("I can't act on that message: it looks like an attempt to override my "
                 "instructions. Please rephrase it as a normal request.")


class InputGuard:
    """Scans user messages with every plugin's patterns, compiled once.

    The mode decides what a match does: ``off`` (no scan), ``log`` (info log),
    ``warn`` (warning log, the default) or ``block`` (warning log, refusal).
    Logs name the pattern, channel, user and session, never the message.
    """

    def __init__(self, patterns: Sequence[GuardPattern], mode: GuardMode,
                 channel_modes: Mapping[str, GuardMode] | None = None) -> None:
        self.mode = mode
        self.channel_modes = dict(channel_modes or {})
        self.compiled: list[tuple[str, re.Pattern[str]]] = []
        for p in patterns:
            try:
                self.compiled.append((p.name, re.compile(p.pattern, re.IGNORECASE)))
            except re.error as exc:
                log.error("guard pattern %r does not compile and is skipped: %s", p.name, exc)

    def mode_for(self, channel: str) -> GuardMode:
        """The mode in force on ``channel``."""
        return self.channel_modes.get(channel, self.mode)

    def scan(self, text: str) -> list[str]:
        """Names of the patterns that match ``text``."""
        return [name for name, rx in self.compiled if rx.search(text)]

    def check(self, text: str, *, channel: str, user: str, session: str) -> GuardVerdict:
        """Scan ``text`` as the channel's mode says, logging every detection."""
        mode = self.mode_for(channel)
        if mode == "off":
            return GuardVerdict((), mode)
        matches = tuple(self.scan(text))
        level = logging.INFO if mode == "log" else logging.WARNING
        for name in matches:
            log.log(level, "security.injection_detected pattern=%s channel=%s user=%s "
                    "session=%s mode=%s", name, channel, user, session, mode)
        return GuardVerdict(matches, mode)


def truncate(text: str, limit: int) -> tuple[str, str | None]:
    """Cut ``text`` to ``limit`` characters; the second value tells the model it was cut."""
    if len(text) <= limit:
        return text, None
    note = (f"[The user's message was {len(text):,} characters long and was shortened to the "
            f"first {limit:,}. Say so if the missing part matters.]")
    return text[:limit], note
