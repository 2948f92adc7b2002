"""A stand-in for the core's handler, for testing a channel adapter on its own.

Hand :class:`RecordingInbox` to ``channel.start()`` instead of the core: it
records what the adapter hands over as the core's inbox would (one entry per
``event_id``), can refuse hand-overs as an inbox whose database is briefly
unavailable would (so the adapter must not acknowledge them), and can hold
them at a gate (to check that an acknowledgement waits for the handler).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from bot.contracts.messages import InboundEvent, InboundMessage

__all__ = ["RecordingInbox"]

E = TypeVar("E")


class RecordingInbox:
    """Records hand-overs; ``fail_next`` refuses that many, ``gate`` holds them."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[InboundMessage] = []
        """Every hand-over, refused and repeated ones included."""
        self.messages: list[InboundMessage] = []
        """Every accepted hand-over, in order (a redelivery appears twice)."""
        self.recorded: dict[str, InboundMessage] = {}
        """What the core's inbox would hold: the first accepted message per ``event_id``."""
        self.fail_next = failures
        self.refused = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        """Set when a hand-over starts (before the gate)."""
        self.arrived = asyncio.Event()
        """Set when a hand-over is accepted."""
        self.changed = asyncio.Condition()
        self.events: list[InboundEvent] = []
        """Every accepted hand-over that is not a message (presses, edits, deletions,
        reactions), in order."""

    async def __call__(self, event: InboundEvent) -> None:
        if not isinstance(event, InboundMessage):
            if self.gate is not None:
                await self.gate.wait()
            self.events.append(event)
            async with self.changed:
                self.changed.notify_all()
            return
        message = event
        self.calls.append(message)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            self.refused += 1
            raise RuntimeError("the inbox could not commit")
        self.messages.append(message)
        self.recorded.setdefault(message.event_id, message)
        self.arrived.set()
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, count: int, *, limit: float = 10.0) -> list[InboundMessage]:
        """Wait until ``count`` distinct messages are recorded; returns them in order."""
        async with asyncio.timeout(limit), self.changed:
            await self.changed.wait_for(lambda: len(self.recorded) >= count)
        return list(self.recorded.values())

    async def wait_for_text(self, text: str, *, limit: float = 5.0) -> InboundMessage:
        """Wait until a message with exactly ``text`` was accepted; returns it."""
        def found() -> InboundMessage | None:
            return next((m for m in self.messages if m.text == text), None)

        async with asyncio.timeout(limit), self.changed:
            await self.changed.wait_for(lambda: found() is not None)
        message = found()
        assert message is not None
        return message

    async def wait_event(self, kind: type[E], count: int = 1, *,
                         limit: float = 5.0) -> list[E]:
        """Wait until ``count`` events of ``kind`` were accepted; returns them in order."""
        def found() -> list[E]:
            return [e for e in self.events if isinstance(e, kind)]

        async with asyncio.timeout(limit), self.changed:
            await self.changed.wait_for(lambda: len(found()) >= count)
        return found()

    def texts(self) -> list[str]:
        """The texts of the recorded messages, in order."""
        return [m.text for m in self.recorded.values()]
