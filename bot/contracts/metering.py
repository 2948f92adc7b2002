"""Who pays for a model call: the meter every call of a run reserves against, then settles.

The dispatcher sets :data:`METER` for a run (a person's message, a cron job, the
heartbeat, a background memory flush) to the budgets of whoever the run serves;
every model call made in that context — the run's own, compaction's, the
judges', the memory flush's — goes through :func:`metered_complete`, which
reserves the call's worst case before it and settles to the reported usage after.
Tasks started from a run inherit its meter (asyncio copies the context).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Protocol

from bot.contracts.llm import LLMProvider, LLMRequest, LLMResponse, OnRetry, OnText, Usage


class BudgetRefused(Exception):
    """A model call does not fit a budget; ``reply`` is the one line for the user."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.reply = reply


class Hold(Protocol):
    """One call's reservation, settled exactly once."""

    async def settle(self, usage: Usage | None, model: str) -> None:
        """Replace the reservation by ``usage`` (``None``: the call failed, nothing counted)."""
        ...


class Meter(Protocol):
    """The budgets a run's model calls count against."""

    async def reserve(self, request: LLMRequest, provider: str) -> Hold:
        """Reserve ``request``'s worst case; raises :class:`BudgetRefused` when it does not fit."""
        ...

    async def charge(self, usage: Usage, model: str) -> None:
        """Count usage spent outside a model call (a transcription) without a reservation."""
        ...


METER: ContextVar[Meter | None] = ContextVar("roost_meter", default=None)
"""The meter of the run being served; ``None`` outside one (a call nobody pays for)."""


async def metered_complete(provider: LLMProvider, request: LLMRequest, *,
                           on_text: OnText | None = None,
                           on_retry: OnRetry | None = None) -> LLMResponse:
    """``provider.complete(request)``, reserved before and settled after on the current meter."""
    meter = METER.get()
    if meter is None:
        return await provider.complete(request, on_text=on_text, on_retry=on_retry)
    hold = await meter.reserve(request, provider.name)
    try:
        response = await provider.complete(request, on_text=on_text, on_retry=on_retry)
    except BaseException:
        # Released even when cancelled: the settle is shielded and finishes on its own.
        await asyncio.shield(hold.settle(None, request.model))
        raise
    await asyncio.shield(hold.settle(response.usage, request.model))
    return response


TRANSCRIPT_CHARS_PER_TOKEN = 4
"""A transcription counts as its transcript's tokens, at about this many characters each."""


async def charge_transcription(transcriber: object, transcript: str) -> None:
    """Count a transcription against the current meter: the transcript's tokens as output
    of the transcriber's model (``model``, else its ``name``), priced by ``[budgets.prices]``."""
    meter = METER.get()
    if meter is None:
        return
    model = str(getattr(transcriber, "model", "") or getattr(transcriber, "name", ""))
    await meter.charge(Usage(0, len(transcript) // TRANSCRIPT_CHARS_PER_TOKEN + 1), model)
