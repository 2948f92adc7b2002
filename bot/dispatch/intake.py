"""Who gets an answer: the DM and group policies, DM pairing, group chatter kept as context.

A group message the bot was not addressed in is not answered; the last
``group_context_messages`` of them are kept in the database (so the next run finds
them whichever replica received them) and given to the session's next run, the
newest whole messages that fit in ``group_context_tokens``.

Under ``dm_policy = "pairing"``, admins and ``dm_allowlist`` users always pass; so
does anyone an admin approved (``/pair approve CODE``, ``roost pairing approve
CODE``). Anyone else's direct message is refused before it is queued (the model
never sees it, and it is not answered later) and its sender is told the code an
admin needs, at most once per ten minutes while the code is valid
(:mod:`bot.storage.access`). The gate chain applies both policies
(:class:`bot.engine.gates.PolicyGate`, :class:`bot.engine.gates.PairingGate`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage
from bot.engine.context import TokenEstimator
from bot.storage.access import AccessStore
from bot.storage.chatter import GroupChatter

log = logging.getLogger("roost.dispatch.intake")


class ChatPolicy:
    """Applies the DM and group policies; keeps un-addressed group messages per session."""

    def __init__(self, settings: Settings, chatter: GroupChatter) -> None:
        self.settings = settings
        self.chatter = chatter
        self.answers_every_dm = all(policy in ("open", "pairing")
                                    for policy in dm_policies(settings))
        """Every channel's DM policy lets anyone's DM through here (the pairing gate
        decides after): a DM needs no look at :meth:`allows`."""

    async def allows(self, message: InboundMessage, is_command: bool, key: str) -> bool:
        """Whether ``message`` (of session ``key``) is answered; the DM pairing gate decides
        after this (``dm_policy`` "pairing" passes here). Group messages not answered
        under the ``mention`` policy are kept for the session's next run."""
        s = self.settings
        admin = s.is_admin(message.channel, message.sender_id)
        if message.chat_type == "direct":
            dm = s.dm_policy_for(message.channel)
            # "pairing" passes here: the pairing gate (PairingPolicy) decides next.
            if admin or dm in ("open", "pairing") or (
                    dm == "allowlist"
                    and f"{message.channel}:{message.sender_id}" in s.dm_allowlist):
                return True
            log.info("DM from %s:%s ignored (dm policy %s)", message.channel,
                     message.sender_id, dm)
            return False
        policy = s.group_policy_for(message.channel, message.chat_id)
        if policy == "all" or (policy == "mention" and (message.mentioned or is_command)):
            return True
        if policy == "off":
            return is_command and admin
        if s.group_context_messages:
            # Stored as much of it as a run is given.
            await self.chatter.keep(key, dataclasses.replace(
                message, text=message.text[:MESSAGE_CHARS], raw=None), s.group_context_messages)
        return False

    def addresses(self, message: InboundMessage) -> bool:
        """Whether ``message`` is one the bot answers as it reads now: any direct message,
        a group message under ``all``, or one that mentions the bot under ``mention``
        (an edit that removed the mention no longer is)."""
        if message.chat_type == "direct":
            return True
        policy = self.settings.group_policy_for(message.channel, message.chat_id)
        return policy == "all" or (policy == "mention" and message.mentioned)

    async def take(self, key: str) -> list[InboundMessage]:
        """The group messages kept for session ``key`` since its last run, oldest first
        (forgotten now: each is handed to one run)."""
        return await self.chatter.take(key)

    def with_earlier_files(self, kept: Sequence[InboundMessage],
                          message: InboundMessage) -> InboundMessage:
        """``message`` with the files of the kept group messages before its own.

        Asked "what's in the photo above?", the bot sees the photo: files sent
        in the group without addressing it are fetched only once it is
        addressed (nothing is downloaded for chatter it never answers), the
        newest up to ``media_max_files`` with the message's own, then stored and
        shown like the message's own files. ``kept`` is what :meth:`take` returned.
        """
        room = self.settings.media_max_files - len(message.attachments)
        if not kept or room <= 0:
            return message
        earlier = [a for m in kept for a in m.attachments][-room:]
        if not earlier:
            return message
        return dataclasses.replace(message, attachments=(*earlier, *message.attachments))

    def context(self, kept: Sequence[InboundMessage], estimator: TokenEstimator) -> str:
        """Group messages the bot was not addressed in since its last run (``kept``), as
        prompt text.

        Each message is cut at ``MESSAGE_CHARS``; then the newest whole messages whose
        lines fit in ``group_context_tokens`` (by ``estimator``) are kept, and the model
        is told how many older ones were left out. The newest alone is cut to the cap
        when even it does not fit.
        """
        cap = self.settings.group_context_tokens
        if not kept or cap <= 0:
            return ""
        lines: list[str] = []
        used = 0
        for m in reversed(kept):
            line = f"[{m.display_name} (id {m.sender_id})]: {_with_files(m)}"
            cost = estimator.text(line)
            if used + cost > cap:
                if not lines:  # the newest alone is over the cap: its start
                    lines.append(_cut(line, cap, estimator))
                break
            lines.append(line)
            used += cost
        lines.reverse()
        left_out = len(kept) - len(lines)
        note = (f"\n({left_out} earlier message(s) left out: over the "
                f"{cap:,}-token limit for group chatter)") if left_out else ""
        return ("Recent messages in this group that were not addressed to you, oldest "
                "first:\n" + "\n".join(lines) + note)


def _cut(text: str, tokens: int, estimator: TokenEstimator) -> str:
    """The longest start of ``text`` found within ``tokens`` (a few estimates)."""
    while text and estimator.text(text) > tokens:
        text = text[:min(len(text) - 1, int(len(text) * tokens / estimator.text(text)))]
    return text


MESSAGE_CHARS = 2_000
"""Characters of one kept group message given to the run."""


def _with_files(message: InboundMessage) -> str:
    """A kept message's text, and what files it had (they come with the next run)."""
    text = message.text[:MESSAGE_CHARS]
    if not message.attachments:
        return text
    files = ", ".join(f"{a.kind} {a.name}".strip() for a in message.attachments)
    note = f"(sent {files}: given to you with the message you are answering)"
    return f"{text} {note}" if text else note


LOCAL_CHANNELS = frozenset({"console"})
"""Channels whose only user is whoever runs Roost in a terminal (``roost chat``): they
need no pairing."""


def dm_policies(settings: Settings) -> set[str]:
    """The DM policies in force on some channel (the default and every override)."""
    return {settings.dm_policy, *settings.dm_policies.values()}


def pairing_text(code: str, ttl: float) -> str:
    """What an unknown user is told: the command an admin sends to let them in."""
    minutes = max(1, math.ceil(ttl / 60))
    return ("Hi! I only talk to people an admin of this bot has approved. To be approved, "
            "send this to an admin; they approve you with:\n"
            f"/pair approve {code}\n"
            f"The code is valid for {minutes} minutes. Your messages until then are not "
            "read or answered.")


class PairingPolicy:
    """Decides whether a direct message may reach the bot, and answers the ones that may not."""

    def __init__(self, settings: Settings, store: AccessStore) -> None:
        self.settings = settings
        self.store = store
        self.anywhere = "pairing" in dm_policies(settings)
        """Whether some channel's DMs are under the pairing policy; when not, every
        message is admitted without a look at :meth:`admits`."""

    def applies(self, message: InboundMessage) -> bool:
        """Whether ``message`` must come from a paired user: a DM under the pairing policy
        from someone who is neither an admin nor allowlisted."""
        s = self.settings
        return (message.chat_type == "direct"
                and message.channel not in LOCAL_CHANNELS
                and s.dm_policy_for(message.channel) == "pairing"
                and not s.is_admin(message.channel, message.sender_id)
                and f"{message.channel}:{message.sender_id}" not in s.dm_allowlist)

    async def admits(self, message: InboundMessage) -> bool:
        """Whether ``message`` may go on: the gate does not apply, or its sender is paired."""
        return not self.applies(message) or await self.store.is_paired(message.channel,
                                                                       message.sender_id)

    async def refuse(self, message: InboundMessage) -> str | None:
        """Record a refused message; the reply to send (``None``: stay silent this time)."""
        refusal = await self.store.refuse(message.channel, message.sender_id, message.chat_id,
                                          message.display_name)
        # The code itself is never logged: whoever reads the log could approve it.
        log.info("DM from %s:%s refused: not paired (%s)", message.channel, message.sender_id,
                 "code sent" if refusal.notify else "code sent recently; silent")
        if not refusal.notify:
            return None
        return pairing_text(refusal.code, refusal.expires_at - self.store.clock())
