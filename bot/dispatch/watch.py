"""What a chat sees of one run's events, and what the dispatcher learns from them.

Streamed text goes into the reply's draft (:class:`bot.dispatch.stream.StreamBridge`),
a provider held by its circuit breaker is announced once, a run's own notices are
sent; the dispatcher learns when the run showed output (a follow-up no longer merges
into it) and what a cancelled run had spent.
"""

from __future__ import annotations

from collections.abc import Callable

from bot.contracts.events import RunEvent
from bot.dispatch.lanes import Running
from bot.dispatch.stream import DraftWatch, StreamBridge

HELD_NOTICE = ("The AI service is not answering right now. Your message is safe: I will "
               "answer as soon as it is back.")


class RunWatch:
    """The listener of one lane entry's run; ``notify(text)`` sends a notice to its chat."""

    def __init__(self, entry: Running, bridge: StreamBridge, draft: DraftWatch,
                 notify: Callable[[str], None]) -> None:
        self.entry = entry
        self.bridge = bridge
        self.draft = draft
        self.notify = notify
        self.held = False

    async def __call__(self, event: RunEvent) -> None:
        if event.type == "chunk":
            self.entry.shown()
            await self.bridge.add(event.payload["content"])
            self.draft.check(self.bridge.stream)
        elif event.type == "tool.call":
            self.entry.shown()
            await self.bridge.end_block()
        elif event.type == "run.retrying":
            if event.payload.get("attempt") == 0:
                # Held by the provider's circuit breaker: say so once.
                if not self.held:
                    self.held = True
                    self.notify(HELD_NOTICE)
            else:
                await self.bridge.restart()
        elif event.type == "activity":
            if event.payload.get("phase") == "committing":
                self.entry.shown()  # answered: a follow-up starts a run of its own
            elif event.payload.get("notice"):
                self.notify(event.payload["notice"])
