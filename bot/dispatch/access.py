"""The pairing policy: who may DM the bot under ``dm_policy = "pairing"``.

Admins and ``dm_allowlist`` users always pass; so does anyone an admin
approved (``/pair approve CODE``, ``roost pairing approve CODE``). Anyone
else's direct message is refused before it is queued — the model never sees
it, and it is not answered later — and its sender is told the code an admin
needs, at most once per ten minutes while the code is valid
(:mod:`bot.storage.access`). Groups follow the group policy, not this one;
:class:`bot.engine.gates.PairingGate` applies it in the gate chain.
"""

from __future__ import annotations

import logging
import math

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage
from bot.storage.access import AccessStore

log = logging.getLogger("roost.dispatch.access")

LOCAL_CHANNELS = frozenset({"console"})
"""Channels whose only user is whoever runs Roost in a terminal (``roost chat``): they
need no pairing."""


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
