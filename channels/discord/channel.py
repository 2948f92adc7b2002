"""The :class:`DiscordChannel` itself: lifecycle and the outbound entry points."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import discord

from bot.config.settings import SetupError
from bot.contracts.channel import InboundHandler, ReplyStream
from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.chunking import split_message
from channels.discord.common import MESSAGE_LIMIT, _escape, _reference, _target, log
from channels.discord.interactions import _Interactions
from channels.discord.media import _Media
from channels.discord.rest import _Rest
from channels.discord.shards import _Shards
from channels.discord.stream import _StreamedReply
from channels.uploading import opened_files

_REDIRECTED: list[DiscordChannel] = []
"""The started channels that point discord.py at other endpoints, oldest first."""


class DiscordChannel(_Shards, _Interactions, _Rest, _Media):
    """Discord through discord.py's gateway client; see the module docstring."""

    name = "discord"

    # -- lifecycle -----------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Log in, connect to the gateway and return once ``on_ready`` fired.

        Sharded (``discord_shard_count`` above 1, or replicas on PostgreSQL): once
        the shards this process took are ready (:mod:`channels.discord.shards`).
        """
        self._handler = handler
        self._redirect()
        if self._sharded():
            try:
                await self._start_shards()
            except BaseException:
                await self.stop()
                raise
            return
        client = self._new_client()
        self.client = client
        self._sessions[None] = client
        self._runner = asyncio.create_task(self._run(client), name="discord-gateway")
        ready = asyncio.create_task(client.connected.wait())
        try:
            done, _ = await asyncio.wait({ready, self._runner}, timeout=self.ready_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if ready not in done:
            runner, self._runner = self._runner, None
            runner.cancel()
            await client.close()
            await asyncio.gather(runner, return_exceptions=True)
            self._restore()
            failure = None if runner.cancelled() else runner.exception()
            if isinstance(failure, SetupError):
                raise failure  # 4010/4011: a setting to change, said in one line
            if failure is not None:
                raise RuntimeError(f"Discord did not connect: {failure}") from failure
            raise TimeoutError(f"Discord was not ready within {self.ready_timeout:g}s")
        self._runner.add_done_callback(lambda task: self._gateway_ended(client, task))
        self._started = True
        assert client.user is not None
        log.info("discord: connected as %s (id %s)", client.user, client.user.id)

    async def stop_intake(self) -> None:
        """Hand the core no more messages; the REST client keeps sending until :meth:`stop`.

        Discord never redelivers, but nothing is lost: what arrives from now
        on advances no cursor, so the catch-up after the restart reads it
        from the history (the core's cursors stop at its last recorded message).
        """
        self._intake_open = False
        if self._catching_up is not None:
            self._catching_up.cancel()
        await self._release_shards()  # other replicas take them over at once

    async def stop(self) -> None:
        """Let sends in flight finish (10 s at most), then close the client."""
        self._stopping = True
        self._intake_open = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 10)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_shards()
        if self.client is not None:
            await self.client.close()
        await self._close_media()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        self._restore()

    def _redirect(self) -> None:
        # discord.py reads both endpoints from class attributes, so they are
        # process-wide; they are put back when the last channel that moved them stops
        # (several apps in one process, as in tests of replicas).
        if self._api_base is None and self._gateway is None:
            return
        gateway_cls = discord.gateway.DiscordWebSocket
        self._saved_endpoints = _REDIRECTED[0]._saved_endpoints if _REDIRECTED else (
            discord.http.Route.BASE, gateway_cls.DEFAULT_GATEWAY)
        _REDIRECTED.append(self)
        if self._api_base is not None:
            discord.http.Route.BASE = self._api_base
        if self._gateway is not None:
            gateway_cls.DEFAULT_GATEWAY = self._gateway

    def _restore(self) -> None:
        if self in _REDIRECTED:
            _REDIRECTED.remove(self)
        if self._saved_endpoints is not None and not _REDIRECTED:
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = \
                self._saved_endpoints
        self._saved_endpoints = None

    # -- outbound --------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; the id of its last message (``None`` for an interaction's).

        Split, referenced in groups, as the interaction's answer if one is
        pending. With ``replace`` the draft is edited into the first piece, or,
        if that edit fails for good, the reply is posted anew and the draft
        deleted. ``message.files`` are uploaded after the text, one message
        each; a file over the upload limit raises :class:`MediaTooLarge` before
        anything is posted. Raises when the reply was not delivered.
        """
        # Every file opened once and checked before anything is posted; uploads read
        # from those descriptors.
        with self._busy(), opened_files(message.files, self._check_file) as opened:
            pieces = split_message(_escape(message.text), MESSAGE_LIMIT)
            target = _target(message)
            reference = _reference(message, target)
            pending = None if message.replace else self._claim_interaction(message)
            if pending is not None and await self._answer(pending, pieces):
                if message.files:
                    # An interaction's answer is text; its files follow in the channel.
                    await self._upload_files(target, message.files, opened, None,
                                             message.delivery_id)
                return None
            last = await self._deliver_reply(target, reference, pieces,
                                             draft=message.replace or None,
                                             delivery_id=message.delivery_id)
            if message.files:
                uploaded = await self._upload_files(
                    target, message.files, opened, reference if last is None else None,
                    message.delivery_id)
                last = uploaded or last
            return last

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages (``chat_id`` may be a thread); gone is fine."""
        with self._busy():
            await self._delete(int(chat_id), int(message_id))

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft message edited as the reply grows, unless streaming is off for discord."""
        if self.client is None or not self.settings.streams(self.name):
            return None
        return _StreamedReply(self, message).stream

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Show "typing…" in the message's channel or thread, refreshed until the block ends."""
        if self.client is None:
            yield
            return
        task = self._spawn(self._keep_typing(int(message.thread_id or message.chat_id)))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
