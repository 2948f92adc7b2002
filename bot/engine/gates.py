"""Who is answered, and how: one ordered chain of gates.

Everything that decides whether and how a message is answered is a gate, listed
here in the order they run: the DM and group policies, pairing, budgets and the
request rate, the input guard, the length limit, and plugins' input checks
(``roost_check_input``). Each gate sees an :class:`Asking` and returns a
:class:`Verdict`: pass, rewrite (the text, with a note for the model), refuse
(with a reply) or drop (silently). A gate runs at the :class:`Stage` where what
it reads exists, and :class:`GateChain` runs a stage's gates in order.

The input guard (:class:`InputGuard`) is here too: a normalized pattern scan with a
per-sender window, which :class:`GuardGate` applies; the types plugins use
(:class:`bot.contracts.guard.GuardPattern`, :class:`bot.contracts.guard.InputCheck`)
are in :mod:`bot.contracts.guard`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, Protocol

from bot.config.settings import GuardMode, Settings
from bot.contracts.guard import GuardPattern
from bot.contracts.messages import InboundMessage
from bot.engine.budgets import Budgets
from bot.pluginhost.manager import PluginHost
from bot.storage.inbox import Inbox

log = logging.getLogger("roost.engine.gates")


class Stage(IntEnum):
    """When a gate runs; the chain's gates are ordered by it."""

    INTAKE = 1
    """Before the message is recorded: whether it is answered at all."""
    START = 2
    """When its run starts: the budgets as they are then."""
    INPUT = 3
    """In the run, with the agent's settings and the run's plugin state."""
    CONTENT = 4
    """In the run, once the message's files are described in its text."""


@dataclass(frozen=True, slots=True)
class Asking:
    """A message as the gates see it. ``text`` is what the model would read so far."""

    message: InboundMessage
    text: str
    key: str
    """The session it belongs to."""
    settings: Settings
    """The service's settings at intake, the agent's once its run started."""
    command: bool = False
    from_person: bool = True
    """``False``: a scheduled turn (cron, heartbeat)."""
    agent: str = "default"
    guard: InputGuard | None = None
    """The run's input guard (from :attr:`Stage.INPUT` on)."""


Action = Literal["pass", "rewrite", "refuse", "drop"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A gate's answer. ``rewrite`` replaces the text (``note`` is told to the model);
    ``refuse`` answers ``reply`` (``None``: nothing is sent); ``drop`` ignores the message."""

    action: Action
    text: str = ""
    note: str = ""
    reply: str | None = None


PASS = Verdict("pass")
DROP = Verdict("drop")


def rewrite(text: str, note: str = "") -> Verdict:
    """Go on with ``text`` instead; ``note`` (if any) reaches the model with it."""
    return Verdict("rewrite", text, note)


def refuse(reply: str | None) -> Verdict:
    """Stop here and answer ``reply`` (``None``: stay silent)."""
    return Verdict("refuse", reply=reply)


class Gate(Protocol):
    """One check of the chain."""

    @property
    def stage(self) -> Stage:
        """When it runs."""
        ...

    async def check(self, asking: Asking) -> Verdict:
        """Its verdict on ``asking``."""
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What a stage of the chain decided: ``pass`` (with the text and the notes the
    gates added), ``refuse`` (with the reply) or ``drop``; ``gate`` names who stopped it."""

    action: Literal["pass", "refuse", "drop"]
    text: str
    notes: tuple[str, ...] = ()
    reply: str | None = None
    gate: str = ""


class GateChain:
    """The gates in the order they run; :meth:`check` runs one stage of them."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        """Raises :class:`ValueError` if ``gates`` are not in stage order."""
        stages = [g.stage for g in gates]
        if stages != sorted(stages):
            raise ValueError("gates must be listed in the order of their stages")
        self.gates = tuple(gates)

    async def check(self, stage: Stage, asking: Asking) -> Decision:
        """Run ``stage``'s gates in order on ``asking``; the first refusal or drop ends it."""
        notes: list[str] = []
        for gate in self.gates:
            if gate.stage != stage:
                continue
            verdict = await gate.check(asking)
            if verdict.action in ("refuse", "drop"):
                return Decision(verdict.action, asking.text, tuple(notes), verdict.reply,
                                type(gate).__name__)
            if verdict.action == "rewrite":
                asking = dataclasses.replace(asking, text=verdict.text)
                if verdict.note:
                    notes.append(verdict.note)
        return Decision("pass", asking.text, tuple(notes))


# -- the input guard -----------------------------------------------------------------


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


# -- the gates, in the order they run -------------------------------------------------


class Policy(Protocol):
    """The DM and group policies (:class:`bot.dispatch.intake.ChatPolicy`)."""

    answers_every_dm: bool
    """Every channel's DM policy lets anyone's DM through (checked once, at construction)."""

    async def allows(self, message: InboundMessage, is_command: bool, key: str) -> bool:
        """Whether ``message`` is answered under the chat's policy (a group's unaddressed
        message is kept for its next run)."""
        ...


class Pairing(Protocol):
    """Who may DM the bot (:class:`bot.dispatch.intake.PairingPolicy`)."""

    anywhere: bool
    """Whether some channel's DMs are under the pairing policy at all."""

    async def admits(self, message: InboundMessage) -> bool:
        """Whether ``message``'s sender may reach the bot."""
        ...

    async def refuse(self, message: InboundMessage) -> str | None:
        """Record a refused message; the reply to send (``None``: none this time)."""
        ...


class PolicyGate:
    """Drops what the DM and group policies do not answer (unaddressed group chatter,
    closed DMs); the policy keeps what a group's later question needs."""

    stage = Stage.INTAKE

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def check(self, asking: Asking) -> Verdict:
        if asking.message.chat_type == "direct" and self.policy.answers_every_dm:
            return PASS
        allowed = await self.policy.allows(asking.message, asking.command, asking.key)
        return PASS if allowed else DROP


class PairingGate:
    """Refuses an unpaired sender's DM: it is recorded closed at once (never run, not
    even after a restart) and the sender is told the pairing code when one is due; a
    redelivery of a refused message is dropped."""

    stage = Stage.INTAKE

    def __init__(self, pairing: Pairing, inbox: Inbox) -> None:
        self.pairing = pairing
        self.inbox = inbox

    async def check(self, asking: Asking) -> Verdict:
        message = asking.message
        if not self.pairing.anywhere or await self.pairing.admits(message):
            return PASS
        entry = await self.inbox.add(message, asking.key,
                                     "command" if asking.command else "message")
        if entry is None:
            return DROP  # a redelivery of a message refused before
        self.inbox.close((entry.id,))
        return refuse(await self.pairing.refuse(message))


class BudgetGate:
    """Refuses a run whose sender, group or agent spent its token budget, or a person's
    message over the request rate (scheduled turns count only against the budgets)."""

    stage = Stage.START

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets

    async def check(self, asking: Asking) -> Verdict:
        refusal = await self.budgets.check(asking.message, asking.agent,
                                           request=asking.from_person)
        return PASS if refusal is None else refuse(refusal)


class GuardGate:
    """Refuses what the run's input guard blocks (its patterns; ``guard_mode``)."""

    stage = Stage.INPUT

    async def check(self, asking: Asking) -> Verdict:
        if asking.guard is None:
            return PASS
        message = asking.message
        verdict = asking.guard.check(asking.text, channel=message.channel,
                                             user=message.sender_id, session=asking.key)
        return refuse(BLOCK_REFUSAL) if verdict.blocked else PASS


class LengthGate:
    """Cuts a text over ``max_message_chars``, telling the model it was cut."""

    stage = Stage.INPUT

    async def check(self, asking: Asking) -> Verdict:
        text, note = truncate(asking.text, asking.settings.max_message_chars)
        return PASS if text == asking.text and not note else rewrite(text, note or "")


class PluginChecksGate:
    """Plugins' input checks (``roost_check_input``), in plugin order: each may rewrite
    the text (the next sees the rewrite), add a note, or refuse (the first refusal wins)."""

    stage = Stage.CONTENT

    def __init__(self, host: PluginHost) -> None:
        self.host = host

    async def check(self, asking: Asking) -> Verdict:
        checked = await self.host.hooks.roost_check_input(
            message=asking.message, text=asking.text, settings=asking.settings)
        if checked.refusal is not None:
            return refuse(checked.refusal)
        if checked.text == asking.text and not checked.notes:
            return PASS
        return rewrite(checked.text, "\n".join(checked.notes))


def run_gates(host: PluginHost) -> list[Gate]:
    """The gates of a run: guard, length, plugins' checks (any run, scheduled or not)."""
    return [GuardGate(), LengthGate(), PluginChecksGate(host)]


def all_gates(policy: Policy, pairing: Pairing, inbox: Inbox, budgets: Budgets,
              host: PluginHost) -> list[Gate]:
    """The whole chain, in order: policies, pairing, budgets, then the run's gates."""
    return [PolicyGate(policy), PairingGate(pairing, inbox), BudgetGate(budgets),
            *run_gates(host)]
