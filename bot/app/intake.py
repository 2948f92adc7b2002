"""What the core does with each kind of event a channel hands in.

Messages go to the dispatcher; button presses to ``on_press`` (approval prompts);
edits, deletions and reactions are not acted on yet and are logged at debug level
here, the one place that decides, so no message path changes when a channel starts
reporting them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bot.contracts.channel import InboundHandler
from bot.contracts.messages import ButtonPress, InboundEvent, InboundMessage

log = logging.getLogger("roost.intake")


def events_to(submit: Callable[[InboundMessage], Awaitable[None]],
              on_press: Callable[[ButtonPress], Awaitable[bool]] | None = None
              ) -> InboundHandler:
    """The handler given to channels: messages to ``submit``, presses to ``on_press``
    (which returns whether the press was its), other events logged."""
    async def handle(event: InboundEvent) -> None:
        if isinstance(event, InboundMessage):
            await submit(event)
            return
        if isinstance(event, ButtonPress) and on_press is not None:
            try:
                if await on_press(event):
                    return
            except Exception:
                # A press that cannot be handled must not make the platform redeliver it.
                log.exception("%s: handling a button press failed", event.channel)
                return
        log.debug("%s: %s not acted on", event.channel, type(event).__name__)

    return handle
