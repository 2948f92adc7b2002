"""Posting, editing and deleting messages over Discord's REST API."""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import discord

from channels.discord.base import _DiscordBase
from channels.discord.common import _NO_PINGS, TYPING_REFRESH, _nonce, log


class _Rest(_DiscordBase):
    """REST calls behind replies: post, edit, delete, typing."""

    async def _deliver_reply(self, target: int, reference: discord.MessageReference | None,
                             pieces: list[str], *, draft: str | None,
                             shown: str | None = None,
                             delivery_id: str | None = None) -> str | None:
        """Put ``pieces`` in place of ``draft`` (or post them); the last message's id.

        No pieces: the draft is deleted. If editing the draft into the first
        piece fails for good (deleted meanwhile, or Discord keeps failing the
        edit), the piece is posted anew and the draft deleted, so no draft is
        left frozen. With a ``delivery_id`` (the core's key of the reply, the
        same across attempts and restarts) each piece's nonce derives from it,
        so Discord returns a piece an earlier attempt posted, in this process
        or one that stopped before the core recorded it, instead of posting
        it twice (Discord remembers nonces for a few minutes).
        """
        if not pieces:
            if draft:
                await self._delete(target, int(draft))
            return None
        nonces: list[str | None] = [_nonce(delivery_id, i) if delivery_id else None
                                    for i in range(len(pieces))]
        first: str | None = None
        if draft:
            if pieces[0] == shown:
                first = draft
            else:
                try:
                    await self._edit(target, int(draft), pieces[0])
                    first = draft
                except Exception as exc:
                    log.warning("discord: could not edit draft %s into the reply (%s); "
                                "posting it anew", draft, exc)
        if first is None:
            first = str((await self._post(target, pieces[0], reference, nonces[0])).id)
            if draft:
                try:
                    await self._delete(target, int(draft))
                except Exception:
                    # The reply is out: failing now would make the core post it again.
                    log.exception("discord: could not delete the replaced draft %s in %s",
                                  draft, target)
        last = first
        for piece, nonce in zip(pieces[1:], nonces[1:], strict=True):
            last = str((await self._post(target, piece, None, nonce)).id)
        return last

    async def _post(self, target: int, text: str, reference: discord.MessageReference | None,
                    key: str | None = None) -> discord.Message:
        assert self.client is not None
        channel = self.client.get_partial_messageable(target)
        # Every try of one post carries the same nonce (``key``, else a random
        # one), and discord.py asks Discord to enforce it: a try that took
        # effect before its answer was lost (a reset, a timeout) is returned
        # again instead of posted twice.
        nonce: str | int = key if key else secrets.randbelow(1 << 62)

        async def call() -> discord.Message:
            if reference is None:
                return await channel.send(text, allowed_mentions=_NO_PINGS, nonce=nonce)
            return await channel.send(text, allowed_mentions=_NO_PINGS, reference=reference,
                                      nonce=nonce)

        sent = await self._deliver(call, what=f"sending to discord:{target}")
        self._own.add(sent.id)
        return sent

    async def _edit(self, target: int, message_id: int, text: str) -> None:
        assert self.client is not None
        partial = self.client.get_partial_messageable(target).get_partial_message(message_id)

        async def call() -> None:
            await partial.edit(content=text, allowed_mentions=_NO_PINGS)

        await self._deliver(call, what=f"editing discord:{target}/{message_id}")

    async def _delete(self, target: int, message_id: int) -> None:
        assert self.client is not None
        partial = self.client.get_partial_messageable(target).get_partial_message(message_id)
        # Already gone (deleted by a moderator or the user) is as good as deleted.
        with contextlib.suppress(discord.NotFound):
            await self._deliver(partial.delete, what=f"deleting discord:{target}/{message_id}")

    async def _keep_typing(self, target: int) -> None:
        assert self.client is not None
        channel = self.client.get_partial_messageable(target)
        while True:
            try:
                await channel.typing()
            except Exception as exc:
                # A missing indicator is cosmetic; never let it disturb the run.
                log.debug("discord: typing in %s failed: %s", target, exc)
            await asyncio.sleep(TYPING_REFRESH)
