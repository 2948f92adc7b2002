"""The input guard (a normalized pattern scan with a per-sender window), truncation, joining.

The types plugins use (:class:`GuardPattern`, :class:`InputCheck`) are in
:mod:`bot.contracts.guard`.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.contracts.guard import GuardPattern

if TYPE_CHECKING:
    from bot.config.settings import GuardMode

log = logging.getLogger("roost.engine.guard")


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
WITHHELD = "[message withheld: the input guard refused it, so the model never saw it]"
"""What the history keeps of a refused message: it never reaches the model, now or later."""

SENDER_WINDOW = 3
"""A sender's last messages in a session are also scanned together: a split attack is
seen whole."""

# Letters that look like Latin ones (Cyrillic, Greek, small capitals, ...), folded
# so "іgnоre" (Cyrillic і and о) reads as "ignore". Digits and symbols of
# leetspeak are folded too; the patterns are phrases, so this costs no false alarms.
_CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o",
    "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i",
    "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ɡ": "g", "ɑ": "a",
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "γ": "y", "ω": "w", "ϲ": "c",
    "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ғ": "f", "ɢ": "g", "ʜ": "h",
    "ɪ": "i", "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p",
    "ʀ": "r", "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ʏ": "y", "ᴢ": "z",
    "0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s",
    "ı": "i", "ł": "l", "ø": "o", "đ": "d", "ħ": "h",
})
_SPACES = re.compile(r"[^\S\n]+")


def normalize_for_scan(text: str) -> str:
    """The text the guard scans: how it reads, not how it is spelled.

    NFKC (fullwidth and styled letters become plain ones), invisible format
    characters (zero-width spaces and joiners, bidi controls, soft hyphens)
    and combining marks removed, look-alike letters folded to Latin,
    case folded, runs of spaces collapsed.
    """
    if text.isascii():
        return _SPACES.sub(" ", text.lower().translate(_CONFUSABLES))
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in unicodedata.normalize("NFKD", text)
                   if unicodedata.category(c) not in ("Cf", "Mn", "Me")
                   and c not in "\u115f\u1160\u3164\uffa0")
    return _SPACES.sub(" ", text.casefold().translate(_CONFUSABLES))


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
        self._recent: OrderedDict[tuple[str, str], deque[str]] = OrderedDict()
        for p in patterns:
            try:
                self.compiled.append((p.name, re.compile(p.pattern, re.IGNORECASE)))
            except re.error as exc:
                log.error("guard pattern %r does not compile and is skipped: %s", p.name, exc)

    def mode_for(self, channel: str) -> GuardMode:
        """The mode in force on ``channel``."""
        return self.channel_modes.get(channel, self.mode)

    def scan(self, text: str) -> list[str]:
        """Names of the patterns that match ``text`` as written or as it reads."""
        normal = normalize_for_scan(text)
        return [name for name, rx in self.compiled
                if rx.search(text) or (normal != text and rx.search(normal))]

    def check(self, text: str, *, channel: str, user: str, session: str) -> GuardVerdict:
        """Scan ``text`` as the channel's mode says, logging every detection.

        The sender's previous messages in the session (up to
        :data:`SENDER_WINDOW`) are scanned together with this one, so an
        injection split over several messages is caught at its last part.
        """
        mode = self.mode_for(channel)
        if mode == "off" or not self.compiled:
            return GuardVerdict((), mode)
        matches = tuple(self.scan(text))
        key = (session, user)
        recent = self._recent.pop(key, None) or deque(maxlen=SENDER_WINDOW - 1)
        if not matches and recent:
            joined = " ".join((*recent, text))
            matches = tuple(f"{name}(split)" for name in self.scan(joined))
        if not matches:
            # Only clean messages join the window: one that matched on its own
            # was flagged already and must not flag the sender's next ones.
            recent.append(text[-2_000:])
        self._recent[key] = recent
        if len(self._recent) > 4096:
            self._recent.popitem(last=False)
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


def join_messages(texts: Sequence[str], limit: int) -> str:
    """Several messages merged into one run's text, every one of them kept.

    When together they exceed ``limit`` characters, the longest are shortened
    (each marked, so the model can say so) and the short ones stay whole:
    a quick follow-up behind a huge paste is never cut away.
    """
    joined = "\n".join(texts)
    if len(joined) <= limit:
        return joined
    marker = "\n[... shortened: this message was {n:,} characters long]"
    budget = limit - (len(texts) - 1) - len(marker) * len(texts) - 8 * len(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    share: dict[int, int] = {}
    left, remaining = budget, len(texts)
    for i in order:
        fair = max(0, left // remaining)
        share[i] = min(len(texts[i]), fair)
        left -= share[i]
        remaining -= 1
    parts = []
    for i, text in enumerate(texts):
        if share[i] >= len(text):
            parts.append(text)
        else:
            parts.append(text[:share[i]] + marker.format(n=len(text)))
    return "\n".join(parts)
