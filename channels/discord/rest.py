"""Discord's REST API as the adapter uses it: every call retried, posts made once.

:class:`Rest` holds the discord.py client REST calls go through (opened by the
gateway sessions at start) and makes each call through :func:`deliver`, with
discord.py's errors mapped by :func:`delivery_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import discord

from channels.delivery import DeliveryPolicy, deliver
from channels.discord.common import (
    NO_PINGS,
    RECENT_IDS,
    TYPING_REFRESH,
    RecentIds,
    log,
    piece_nonce,
)
from channels.discord.errors import delivery_error

T = TypeVar("T")


class Rest:
    """Posts, edits, deletes and typing over the REST client, each call retried by deliver()."""

    def __init__(self, *, delivery: DeliveryPolicy, call_timeout: float | None) -> None:
        """``delivery`` tunes retries of 5xx and connection errors; ``call_timeout``, if
        set, bounds each call, discord.py's own queueing for its rate-limit buckets
        included."""
        self.delivery = delivery
        self.call_timeout = call_timeout
        self.own = RecentIds(RECENT_IDS)
        """Ids of the bot's own recent messages (a reply to one addresses the bot)."""
        self._client: discord.Client | None = None

    @property
    def client(self) -> discord.Client | None:
        """The client REST calls go through; ``None`` until :meth:`use`."""
        return self._client

    def use(self, client: discord.Client) -> None:
        """Make REST calls through ``client`` from now on."""
        self._client = client

    def _ready(self) -> discord.Client:
        assert self._client is not None
        return self._client

    async def deliver(self, call: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Run a REST call with :func:`deliver`, translating discord.py's errors.

        discord.py already sleeps through 429s (``retry_after``) and retries
        500/502/504 a few times; what reaches here is a limit longer than its
        ``max_ratelimit_timeout``, another 5xx, a dropped connection, or a
        call that took longer than :attr:`call_timeout`.
        """
        async def translated() -> T:
            try:
                async with asyncio.timeout(self.call_timeout):  # None: no bound
                    return await call()
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

        return await deliver(translated, what=what, policy=self.delivery)

    async def deliver_reply(self, target: int, reference: discord.MessageReference | None,
                             pieces: list[str], *, draft: str | None,
                             shown: str | None = None,
                             delivery_id: str | None = None,
                             view: discord.ui.View | None = None) -> str | None:
        """Put ``pieces`` in place of ``draft`` (or post them); the last message's id.

        No pieces: the draft is deleted. If editing the draft into the first
        piece fails for good (deleted meanwhile, or Discord keeps failing the
        edit), the piece is posted anew and the draft deleted, so no draft is
        left frozen. With a ``delivery_id`` (the core's key of the reply, the
        same across attempts and restarts) each piece's nonce derives from it,
        so Discord returns a piece an earlier attempt posted, in this process
        or one that stopped before the core recorded it, instead of posting
        it twice (Discord remembers nonces for a few minutes). ``view`` (buttons)
        goes under the last piece.
        """
        if not pieces:
            if draft:
                await self.delete(target, int(draft))
            return None
        nonces: list[str | None] = [piece_nonce(delivery_id, i) if delivery_id else None
                                    for i in range(len(pieces))]
        first: str | None = None
        lone = view if len(pieces) == 1 else None
        if draft:
            if pieces[0] == shown and lone is None:
                first = draft
            else:
                try:
                    await self.edit(target, int(draft), pieces[0], lone)
                    first = draft
                except Exception as exc:
                    log.warning("discord: could not edit draft %s into the reply (%s); "
                                "posting it anew", draft, exc)
        if first is None:
            first = str((await self.post(target, pieces[0], reference, nonces[0], lone)).id)
            if draft:
                try:
                    await self.delete(target, int(draft))
                except Exception:
                    # The reply is out: failing now would make the core post it again.
                    log.exception("discord: could not delete the replaced draft %s in %s",
                                  draft, target)
        last = first
        for index, (piece, nonce) in enumerate(zip(pieces[1:], nonces[1:], strict=True)):
            under = view if index == len(pieces) - 2 else None
            last = str((await self.post(target, piece, None, nonce, under)).id)
        return last

    async def post(self, target: int, text: str, reference: discord.MessageReference | None,
                    key: str | None = None,
                    view: discord.ui.View | None = None) -> discord.Message:
        """Post one message into ``target`` (nonce ``key``, else a random one; ``view``: its
        buttons); the message."""
        channel = self._ready().get_partial_messageable(target)
        # Every try of one post carries the same nonce (``key``, else a random
        # one), and discord.py asks Discord to enforce it: a try that took
        # effect before its answer was lost (a reset, a timeout) is returned
        # again instead of posted twice.
        nonce: str | int = key if key else secrets.randbelow(1 << 62)

        async def call() -> discord.Message:
            extra: dict[str, Any] = {} if view is None else {"view": view}
            if reference is None:
                return await channel.send(text, allowed_mentions=NO_PINGS, nonce=nonce,
                                          **extra)
            return await channel.send(text, allowed_mentions=NO_PINGS, reference=reference,
                                      nonce=nonce, **extra)

        sent = await self.deliver(call, what=f"sending to discord:{target}")
        self.own.add(sent.id)
        return sent

    async def edit(self, target: int, message_id: int, text: str,
                   view: discord.ui.View | None = None, *, buttons: bool = False) -> None:
        """Replace the text of one of the bot's messages; with ``view`` (or ``buttons``)
        its buttons too (``view=None``: removed)."""
        partial = self._ready().get_partial_messageable(target).get_partial_message(message_id)

        async def call() -> None:
            if view is None and not buttons:
                await partial.edit(content=text, allowed_mentions=NO_PINGS)
            else:
                await partial.edit(content=text, allowed_mentions=NO_PINGS, view=view)

        await self.deliver(call, what=f"editing discord:{target}/{message_id}")

    async def delete(self, target: int, message_id: int) -> None:
        """Delete one of the bot's messages; one already gone counts as deleted."""
        partial = self._ready().get_partial_messageable(target).get_partial_message(message_id)
        # Already gone (deleted by a moderator or the user) is as good as deleted.
        with contextlib.suppress(discord.NotFound):
            await self.deliver(partial.delete, what=f"deleting discord:{target}/{message_id}")

    async def keep_typing(self, target: int) -> None:
        """Show "typing…" in ``target``, refreshed until cancelled."""
        channel = self._ready().get_partial_messageable(target)
        while True:
            try:
                await channel.typing()
            except Exception as exc:
                # A missing indicator is cosmetic; never let it disturb the run.
                log.debug("discord: typing in %s failed: %s", target, exc)
            await asyncio.sleep(TYPING_REFRESH)
