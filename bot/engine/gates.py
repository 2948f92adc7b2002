"""Who is answered, and how: one ordered chain of gates.

Everything that decides whether and how a message is answered is a gate, listed
here in the order they run: the DM and group policies, pairing, budgets and the
request rate, the input guard, the length limit, and plugins' input checks
(``roost_check_input``). Each gate sees an :class:`Asking` and returns a
:class:`Verdict`: pass, rewrite (the text, with a note for the model), refuse
(with a reply) or drop (silently). A gate runs at the :class:`Stage` where what
it reads exists, and :class:`GateChain` runs a stage's gates in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, Protocol

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage
from bot.engine.budgets import Budgets
from bot.engine.guard import BLOCK_REFUSAL, truncate
from bot.engine.snapshot import PluginSnapshot
from bot.pluginhost.manager import PluginHost
from bot.storage.inbox import Inbox


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
    plugins: PluginSnapshot | None = None
    """The run's plugin state (from :attr:`Stage.INPUT` on)."""


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


# -- the gates, in the order they run -------------------------------------------------


class Policy(Protocol):
    """The DM and group policies (:class:`bot.dispatch.intake.ChatPolicy`)."""

    async def allows(self, message: InboundMessage, is_command: bool, key: str) -> bool:
        """Whether ``message`` is answered under the chat's policy (a group's unaddressed
        message is kept for its next run)."""
        ...


class Pairing(Protocol):
    """Who may DM the bot (:class:`bot.dispatch.intake.PairingPolicy`)."""

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
        if await self.pairing.admits(message):
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
        if asking.plugins is None:
            return PASS
        message = asking.message
        verdict = asking.plugins.guard.check(asking.text, channel=message.channel,
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
