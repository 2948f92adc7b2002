"""WhatsApp's 24-hour customer-service window, tracked in the channel's durable notes.

A free-form message may go to a person only within 24 hours of their last message;
after that only a template may. The time of each person's last message is kept in
the channel's notes (Roost's database, shared by replicas), so a restart or another
replica knows it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from roost.channels import ChannelState

WINDOW = 24 * 3600.0
MARGIN = 60.0
"""Seconds before the window's end from which a reply counts as outside (a send
takes a moment, and WhatsApp's clock is not ours)."""


class CustomerWindow:
    """When each person last wrote, and whether a free-form reply may go to them now."""

    def __init__(self, state: ChannelState, *, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.clock = clock

    async def wrote(self, wa_id: str, at: float) -> None:
        """Note that ``wa_id`` wrote at ``at`` (seconds since the epoch; later wins)."""
        at = min(at, self.clock())
        last = await self.last(wa_id)
        if last is None or at > last:
            await self.state.put(f"inbound:{wa_id}", repr(at))

    async def closed(self, wa_id: str, at: float) -> None:
        """WhatsApp said at ``at`` that ``wa_id``'s window was closed (a 131047 status):
        believed unless the person wrote after that (in a later second)."""
        last = await self.last(wa_id)
        if last is None or last <= at:
            await self.state.put(f"inbound:{wa_id}", repr(at - WINDOW))

    async def last(self, wa_id: str) -> float | None:
        """When ``wa_id`` last wrote, if known."""
        value = await self.state.get(f"inbound:{wa_id}")
        try:
            return None if value is None else float(value)
        except ValueError:
            return None

    async def is_open(self, wa_id: str) -> bool:
        """Whether a free-form message may go to ``wa_id`` now."""
        last = await self.last(wa_id)
        return last is not None and self.clock() - last < WINDOW - MARGIN
