"""What the core does with each kind of event a channel hands in.

Messages go to the dispatcher; presses, edits, deletions and reactions are
not acted on yet and are logged at debug level here, the one place that
decides, so no message path changes when a channel starts reporting them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bot.contracts.channel import InboundHandler
from bot.contracts.messages import InboundEvent, InboundMessage

log = logging.getLogger("roost.intake")


def events_to(submit: Callable[[InboundMessage], Awaitable[None]]) -> InboundHandler:
    """The handler given to channels: messages to ``submit``, other events logged."""
    async def handle(event: InboundEvent) -> None:
        if isinstance(event, InboundMessage):
            await submit(event)
            return
        log.debug("%s: %s not acted on", event.channel, type(event).__name__)

    return handle
