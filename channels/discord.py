"""The Discord channel: discord.py's gateway client, translated to and from Roost messages.

Inbound: guild text channels, threads and DMs (``Intents.default()`` plus the
message-content intent). A guild message is a ``group`` message of its
channel; a message in a thread keeps the thread's parent as ``chat_id`` and the
thread as ``thread_id``, so each thread is a session of its own and replies go
into it. ``mentioned`` is set when the bot (or its managed role) is mentioned,
the message replies to one of the bot's messages, or it is a ``/command``; the
bot's mention is stripped from the text. Bots (this one included), webhooks and
system messages are ignored and redelivered message ids are dropped.
``event_id`` is the message id (the interaction id for slash commands). A
message in a guild discord.py has not cached is still a group message.

Hostile input: a gateway payload discord.py cannot parse, or one it parses
but that holds the wrong types (content that is not text, ids that are not
unsigned 64-bit snowflakes, an interaction's options that are not a list of
objects), is skipped with one warning line, never a traceback, and the client
goes on. After :meth:`DiscordChannel.stop_intake` no message reaches the core
and no cursor moves, so the catch-up after the restart reads what arrived
meanwhile; the REST client keeps sending until :meth:`DiscordChannel.stop`.

Catching up: Discord never redelivers a message a disconnected client
missed. :meth:`DiscordChannel.catch_up` (called by the core after a start with
the last recorded message id per chat) reads each chat's history after that
id, oldest first and bounded, and hands it to the core as if it had arrived
live; after a reconnect that could not resume (a new READY) the adapter does
the same from the last ids it saw, and from any message the core failed to
record. A cursor key ``chat_id:thread_id`` reads that thread after its own
cursor; a plain ``chat_id`` key reads the channel and its active threads that
have no key of their own.

Outbound: Discord markdown passes through; ``@everyone`` and ``@here`` are
defused and no reply may ping anyone but the person replied to. Long replies
are split at 2,000 characters outside code blocks; in groups the first piece
references the triggering message. Replies stream by editing a draft (at most
once a second); :meth:`DiscordChannel.send` returns the last message id, and
with ``replace`` edits the draft or, if that fails for good, posts anew and
deletes it. discord.py sleeps through 429s itself (``retry_after``); the rest
is mapped once (:func:`delivery_error`) and retried through
:func:`channels.delivery.deliver`. Every try of one post carries the same
enforced nonce, so a post whose answer was lost is not posted twice; for a
reply with a ``delivery_id`` (the core's outbox key) the nonce derives from
it (``roost-7``, ``roost-7.1`` for the second piece), so a redelivery after a
restart gets the earlier message back instead of a second one, as long as
Discord still remembers the nonce (a few minutes).

Slash commands are synced as global application commands, each with an
optional ``args`` string. An interaction is deferred at once (Discord wants an
answer within 3 s) and routed to the core as ``/name args``; the command's
reply becomes the interaction's response (its first piece edits the deferred
"thinking…" message, further pieces are followups). Typed ``/name`` messages
work as well; the core parses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Hashable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
import discord
import yarl

from bot.config.settings import Settings
from bot.contracts.channel import Channel, InboundHandler, ReplyStream
from bot.contracts.messages import Attachment, ChatType, InboundMessage, OutboundMessage, clean_text
from channels.chunking import split_message
from channels.delivery import DeliveryPolicy, EditStream, RateLimited, Transient, deliver
from channels.logline import short as _short

if TYPE_CHECKING:
    from bot.contracts.commands import Command

log = logging.getLogger("roost.channels.discord")

T = TypeVar("T")

MESSAGE_LIMIT = 2000
"""Discord's limit on a message's content, in characters."""
TYPING_REFRESH = 8.0
"""A typing indicator lasts 10 s; refresh it before it lapses."""
RECENT_IDS = 2048
"""How many message ids are remembered to drop redeliveries and spot replies to the bot."""
MAX_COMMANDS = 100
"""Discord's limit on global chat-input commands."""
INTERACTION_TIMEOUT = 600.0
"""A deferred interaction nobody answered is withdrawn after this (tokens last 15 min)."""
CATCHUP_LIMIT = 100
"""Messages read back per chat when catching up (the ``discord_catchup_limit`` default)."""
NONCE_LIMIT = 25
"""Discord refuses a message nonce longer than this."""
SNOWFLAKE_LIMIT = 1 << 64
"""Discord ids are unsigned 64-bit integers; anything else is no Discord id."""

_COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
_MASS_MENTION = re.compile(r"@(everyone|here)\b")
_API_VERSION = re.compile(r"/api/v\d+$")
_ADDRESSED_TYPES = (discord.MessageType.default, discord.MessageType.reply)
_NO_PINGS = discord.AllowedMentions(everyone=False, users=False, roles=False,
                                    replied_user=True)
"""The model's text pings nobody; a reply still notifies the person it answers."""


class _Malformed(ValueError):
    """A gateway payload missing what the adapter needs, or holding the wrong types."""


class DiscordChannel(Channel):
    """Discord through discord.py's gateway client; see the module docstring."""

    name = "discord"

    def __init__(self, settings: Settings, *, guild_ready_timeout: float = 1.0,
                 ready_timeout: float = 60.0, delivery: DeliveryPolicy | None = None,
                 edit_interval: float = 1.0,
                 interaction_timeout: float = INTERACTION_TIMEOUT,
                 catchup_limit: int | None = None, call_timeout: float | None = None,
                 max_ratelimit_timeout: float = 30.0) -> None:
        """Read the token and endpoints from ``settings``; nothing connects yet.

        ``guild_ready_timeout`` is how long discord.py waits for further guilds
        before ``on_ready`` (and so :meth:`start`) returns; ``ready_timeout``
        bounds the whole start. ``delivery`` tunes retries of 5xx and connection
        errors; ``edit_interval`` spaces streaming edits. ``catchup_limit``
        bounds the messages read back per chat when catching up (default: the
        ``discord_catchup_limit`` setting if there is one, else 100).
        ``call_timeout``, if set, bounds each REST call, discord.py's own
        queueing for its rate-limit buckets included (so it must be generous;
        without it a stalled call is bounded by aiohttp's 5-minute default).
        discord.py waits out 429s up to ``max_ratelimit_timeout`` seconds by
        itself, longer ones reach :func:`deliver` as :class:`RateLimited`.
        """
        if settings.discord_bot_token is None:
            raise ValueError("DISCORD_BOT_TOKEN is not set")
        self.settings = settings
        self._token = settings.discord_bot_token.get_secret_value()
        self._api_base = _api_base(settings.discord_api_base)
        self._gateway = yarl.URL(settings.discord_gateway_url) \
            if settings.discord_gateway_url else None
        self.guild_ready_timeout = guild_ready_timeout
        self.ready_timeout = ready_timeout
        self.delivery = delivery or DeliveryPolicy()
        self.edit_interval = edit_interval
        self.interaction_timeout = interaction_timeout
        configured = getattr(settings, "discord_catchup_limit", None)
        self.catchup_limit = int(catchup_limit if catchup_limit is not None
                                 else configured if isinstance(configured, int)
                                 else CATCHUP_LIMIT)
        self.call_timeout = call_timeout
        self.max_ratelimit_timeout = max_ratelimit_timeout
        self.client: discord.Client | None = None
        self._handler: InboundHandler | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._seen = _RecentSet(RECENT_IDS)
        self._own = _RecentSet(RECENT_IDS)
        self._interactions: dict[str, _PendingInteraction] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._saved_endpoints: tuple[str, yarl.URL] | None = None
        self._cursors: dict[int, int] = {}
        """Per channel (or thread), the newest message id the core has (or was
        not meant to get): where a catch-up after a reconnect starts."""
        self._gaps: dict[int, int] = {}
        """Per channel, the id just before the oldest message the handler
        failed on: a catch-up starts there, so that message is read again."""
        self._catching_up: asyncio.Task[None] | None = None
        self._intake_open = True

    # -- lifecycle -----------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Log in, connect to the gateway and return once ``on_ready`` fired."""
        self._handler = handler
        self._redirect()
        intents = discord.Intents.default()
        intents.message_content = True
        client = _Client(self, intents=intents, guild_ready_timeout=self.guild_ready_timeout,
                         allowed_mentions=_NO_PINGS,
                         max_ratelimit_timeout=self.max_ratelimit_timeout)
        _guard_parsers(client)
        _guard_frames(client)
        self.client = client
        self._runner = asyncio.create_task(self._run(client), name="discord-gateway")
        ready = asyncio.create_task(self._ready.wait())
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
            if runner.done() and not runner.cancelled() and runner.exception() is not None:
                raise RuntimeError(f"Discord did not connect: {runner.exception()}") \
                    from runner.exception()
            raise TimeoutError(f"Discord was not ready within {self.ready_timeout:g}s")
        self._runner.add_done_callback(self._runner_done)
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

    async def stop(self) -> None:
        """Let sends in flight finish (10 s at most), then close the client."""
        self._stopping = True
        self._intake_open = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 10)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        self._restore()

    def _redirect(self) -> None:
        # discord.py reads both endpoints from class attributes, so they are
        # process-wide; they are put back on stop.
        if self._api_base is None and self._gateway is None:
            return
        gateway_cls = discord.gateway.DiscordWebSocket
        self._saved_endpoints = (discord.http.Route.BASE, gateway_cls.DEFAULT_GATEWAY)
        if self._api_base is not None:
            discord.http.Route.BASE = self._api_base
        if self._gateway is not None:
            gateway_cls.DEFAULT_GATEWAY = self._gateway

    def _restore(self) -> None:
        if self._saved_endpoints is not None:
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = \
                self._saved_endpoints
            self._saved_endpoints = None

    async def _run(self, client: discord.Client) -> None:
        """Log in and keep the gateway connected until the client is closed.

        ``connect(reconnect=True)`` already resumes after network errors and
        Discord's own close codes. Anything else escaping it (a frame that is
        not JSON, a bug) would end the client for good, so it is logged and
        the connection is made again.
        """
        await client.login(self._token)
        backoff = 0.5
        while not client.is_closed():
            started = time.monotonic()
            try:
                await client.connect(reconnect=True)
            except (discord.ClientException, discord.ConnectionClosed):
                raise  # bad token, missing intents, bad close codes: not recoverable
            except Exception:
                if client.is_closed() or self._stopping:
                    return
                log.exception("discord: unexpected gateway error; reconnecting in %.1fs",
                              backoff)
                if client.ws is not None:
                    with contextlib.suppress(Exception):
                        # 4000 keeps the session resumable on Discord's side.
                        await client.ws.close(code=4000)
                await asyncio.sleep(backoff)
                backoff = 0.5 if time.monotonic() - started > 60 else min(backoff * 2, 30.0)

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            log.error("discord: the gateway connection ended", exc_info=task.exception())

    # -- inbound ---------------------------------------------------------------

    async def _on_message(self, message: discord.Message) -> None:
        if self._intake_open:
            await self._take(message)
        else:
            log.debug("discord: message %s arrived while shutting down; the catch-up after "
                      "the restart reads it", _short(getattr(message, "id", "?"), 40))

    async def _take(self, message: discord.Message) -> None:
        """Hand one message (live or read back from history) to the core.

        Bots (this one included), webhooks and system messages are skipped
        the same way whether they arrive live or in a catch-up. A message the
        core already has (same id) is skipped; one whose handler raised
        leaves a gap that the next catch-up starts from, and the error
        propagates (a catch-up stops there, to keep the order).
        """
        client = self.client
        if client is None or client.user is None or self._handler is None:
            return
        try:
            # discord.py stores some fields as the payload had them (content,
            # ids of partial objects), so a malformed one surfaces only here.
            where = _snowflake(message.channel.id)
            author = message.author
            mine = author.id == client.user.id
            if mine:
                self._own.add(message.id)
            skipped = (author.bot or mine or message.webhook_id is not None
                       or message.type not in _ADDRESSED_TYPES)  # joins, pins, threads...
            inbound = None if skipped or message.id in self._seen \
                else self._translate(message, client.user)
        except Exception as exc:
            log.warning("discord: skipped a malformed message %s (%s)",
                        _short(getattr(message, "id", "?"), 40), _problem(exc))
            return
        if inbound is None:
            if skipped:
                self._advance(where, message.id)
            else:
                log.debug("discord: message %s delivered twice; ignored", message.id)
            return
        try:
            await self._handler(inbound)
        except BaseException:
            gap = self._gaps.get(where)
            self._gaps[where] = min(gap, message.id - 1) if gap is not None \
                else message.id - 1
            raise
        self._seen.add(message.id)
        self._advance(where, message.id)

    def _advance(self, where: int, message_id: int) -> None:
        if message_id > self._cursors.get(where, 0):
            self._cursors[where] = message_id

    async def catch_up(self, cursors: Mapping[str, str]) -> None:
        """Read back what was said while Roost was away, and hand it to the core.

        Discord never redelivers a message a disconnected client missed, so
        each chat's history after its cursor (the last message id the core
        recorded) is read, oldest first, at most :attr:`catchup_limit`
        messages a chat, and treated as if it had arrived live. A key is a
        channel or thread id, or ``chat:thread`` for a thread, read after its
        own cursor. A guild channel's active threads that have no key of
        their own are read after the channel's cursor (ids are time-ordered,
        so that covers them if the cursor is the newest id of the chat,
        threads included). The core dedupes on the message id, so reading a
        range twice is harmless. Failures are logged per chat and do not
        stop the others.
        """
        own_keys = {int(key.rsplit(":", 1)[-1]) for key in cursors
                    if ":" in key and key.rsplit(":", 1)[-1].isdigit()}
        for key, cursor in cursors.items():
            if not self._intake_open:
                return
            place = key.rsplit(":", 1)[-1]
            if not place.isdigit() or not str(cursor).isdigit():
                log.warning("discord: cannot catch up %s after %r: not Discord ids", key, cursor)
                continue
            await self._catch_up_channel(int(place), int(cursor), own_keys)

    async def _catch_up_channel(self, where: int, after: int,
                                keyed: set[int] | frozenset[int] = frozenset()) -> None:
        client = self.client
        if client is None:
            return
        try:
            channel = client.get_channel(where) or await self._deliver(
                lambda: client.fetch_channel(where), what=f"reading discord channel {where}")
        except Exception:
            log.exception("discord: could not catch up channel %s: it cannot be read", where)
            return
        if isinstance(channel, discord.abc.Messageable):
            await self._catch_up_history(channel, where, after)
        if isinstance(channel, discord.TextChannel | discord.ForumChannel):
            # A thread is a session of its own but shares its parent's chat id,
            # so the core's cursor for the chat covers its threads too (ids are
            # time-ordered): the active threads are read after the same id.
            for thread in channel.threads:
                if thread.id not in keyed:
                    await self._catch_up_history(thread, thread.id, after)

    async def _catch_up_history(self, channel: discord.abc.Messageable, where: int,
                                after: int) -> None:
        """Hand the messages of ``channel`` after ``after`` to the core, oldest first."""
        async def read() -> list[discord.Message]:
            # A fresh iterator per try: a failed one cannot be resumed.
            return [message async for message in channel.history(
                limit=self.catchup_limit, after=discord.Object(after), oldest_first=True)]

        try:
            missed = await self._deliver(read, what=f"reading discord history of {where}")
        except Exception:
            log.exception("discord: could not read the history of %s after %s", where, after)
            return
        if len(missed) >= self.catchup_limit:
            log.warning("discord: catching up %s stopped at %d messages (the limit); the "
                        "oldest ones after %s were read, newer ones were not", where,
                        len(missed), after)
        taken = 0
        for message in missed:
            if not self._intake_open:
                return  # shutting down: the next start reads the rest
            try:
                await self._take(message)
            except Exception:
                log.exception("discord: the core did not take message %s while catching up "
                              "%s; the rest waits for the next catch-up", message.id, where)
                return
            taken += 1
        if taken:
            log.info("discord: caught up %d message(s) in %s", taken, where)
        gap = self._gaps.get(where)
        if gap is not None and after <= gap:
            self._gaps.pop(where)  # the failed message was read again and taken

    def _reconnected(self) -> None:
        """A new gateway session (READY, not RESUME): Discord replayed nothing missed.

        Catch-ups run one after another; each reads from the cursors as they
        are when it starts, so a second reconnect during one is covered too.
        """
        if not self._intake_open:
            return
        previous = self._catching_up

        async def run() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            starts = {where: min(cursor, self._gaps.get(where, cursor))
                      for where, cursor in self._cursors.items()}
            for where, gap in self._gaps.items():
                starts.setdefault(where, gap)
            if starts:
                log.info("discord: new gateway session; catching up %d channel(s)",
                         len(starts))
                await self.catch_up({str(where): str(after) for where, after in starts.items()})

        self._catching_up = self._spawn(run())

    def _translate(self, message: discord.Message, me: discord.ClientUser) -> InboundMessage:
        """The core's message for ``message``; raises :class:`_Malformed` (or worse) if
        the payload was malformed."""
        _snowflake(message.id)
        _snowflake(message.author.id)
        if not isinstance(message.content, str):
            raise _Malformed("its content is not text")
        # A guild discord.py has not cached (unavailable, or an id it never
        # heard of) leaves ``guild`` None, but the channel still names it: such
        # a message is a group message, never a DM.
        guild_id = message.guild.id if message.guild is not None \
            else getattr(message.channel, "guild_id", None)
        chat_id, chat_type, thread_id = _place(message.channel, guild_id is not None)
        role = message.guild.self_role if message.guild is not None else None
        text = _strip_mentions(message.content, me.id, role.id if role else None)
        reference = message.reference
        reply_to = str(reference.message_id) if reference and reference.message_id else None
        mentioned = (chat_type == "direct" or self._addresses_me(message, me, role)
                     or text.startswith("/"))
        return InboundMessage(
            channel=self.name, chat_id=chat_id, chat_type=chat_type,
            sender_id=str(message.author.id), sender_name=str(message.author.display_name),
            text=text, message_id=str(message.id), reply_to=reply_to, thread_id=thread_id,
            mentioned=mentioned,
            attachments=tuple(_attachment(a) for a in message.attachments), raw=message,
            group_id=str(guild_id) if guild_id is not None else None,
            event_id=str(message.id))

    def _addresses_me(self, message: discord.Message, me: discord.ClientUser,
                      role: discord.Role | None) -> bool:
        if any(user.id == me.id for user in message.mentions):
            return True
        if role is not None and any(r.id == role.id for r in message.role_mentions):
            return True
        reference = message.reference
        if reference is None:
            return False
        replied = reference.resolved
        if isinstance(replied, discord.Message) and replied.author.id == me.id:
            return True
        return reference.message_id is not None and reference.message_id in self._own

    async def _on_interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        if not self._intake_open or self._handler is None:
            return
        if interaction.type is not discord.InteractionType.application_command:
            return
        try:
            name, args = _command_of(interaction.data)
            _snowflake(interaction.id)
            _snowflake(interaction.user.id)
            in_guild = interaction.guild_id is not None
            chat_id, chat_type, thread_id = _place(interaction.channel, in_guild,
                                                   interaction.channel_id)
        except Exception as exc:
            log.warning("discord: skipped a malformed interaction %s (%s)",
                        _short(interaction.id, 40), _problem(exc))
            return
        if not self._seen.add(("interaction", interaction.id)):
            return
        key = str(interaction.id)
        try:
            # Discord wants an answer within 3 s; the command may take longer.
            await interaction.response.defer()
        except discord.HTTPException as exc:
            # Discord's answer says all there is to say (an expired or unknown
            # interaction): one line, no traceback.
            log.warning("discord: could not defer interaction /%s (%s); replying in the "
                        "channel", name, _short(exc, 200))
        except Exception as exc:
            # discord.py reads more of the payload to answer it; if that fails,
            # nothing can be answered either.
            log.warning("discord: skipped a malformed interaction %s (%s)", key, _problem(exc))
            return
        else:
            pending = _PendingInteraction(interaction, thread_id or chat_id, chat_type)
            self._interactions[key] = pending
            pending.timer = self._spawn(self._expire(key))
        user = interaction.user
        await self._handler(InboundMessage(
            channel=self.name, chat_id=chat_id, chat_type=chat_type, sender_id=str(user.id),
            sender_name=str(user.display_name), text=f"/{name} {args}".strip(), message_id=key,
            thread_id=thread_id, mentioned=True, raw=interaction,
            group_id=str(interaction.guild_id) if in_guild else None,
            # Interaction ids are snowflakes too, never equal to a message id.
            event_id=key))

    async def _expire(self, key: str) -> None:
        """Withdraw a deferred answer the core never replied to (the command said nothing)."""
        await asyncio.sleep(self.interaction_timeout)
        pending = self._interactions.pop(key, None)
        if pending is not None:
            with contextlib.suppress(discord.HTTPException):
                await pending.interaction.delete_original_response()

    # -- outbound --------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; the id of its last message (``None`` for an interaction's).

        Split, referenced in groups, as the interaction's answer if one is
        pending. With ``replace`` the draft is edited into the first piece, or,
        if that edit fails for good, the reply is posted anew and the draft
        deleted. Raises when the reply was not delivered.
        """
        with self._busy():
            pieces = split_message(_escape(message.text), MESSAGE_LIMIT)
            pending = None if message.replace else self._claim_interaction(message)
            if pending is not None and await self._answer(pending, pieces):
                return None
            target = _target(message)
            return await self._deliver_reply(target, _reference(message, target), pieces,
                                             draft=message.replace or None,
                                             delivery_id=message.delivery_id)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages (``chat_id`` may be a thread); gone is fine."""
        with self._busy():
            await self._delete(int(chat_id), int(message_id))

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

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Replace the global application commands with ``commands`` (aliases included)."""
        client = self.client
        if client is None or client.application_id is None:
            raise RuntimeError("start() the Discord channel before registering commands")
        payload = _command_payload(commands)
        app_id = client.application_id
        await self._deliver(
            lambda: client.http.bulk_upsert_global_commands(app_id, cast(Any, payload)),
            what="syncing discord application commands")
        log.info("discord: %d application commands synced", len(payload))

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

    def _claim_interaction(self, message: OutboundMessage) -> _PendingInteraction | None:
        """The deferred interaction ``message`` answers, if any.

        In groups replies name the message they answer (the interaction id).
        Direct replies do not, so a reply goes to the oldest open interaction of
        that DM; only command replies can race for it, and commands of one
        chat run in order.
        """
        if not self._interactions:
            return None
        if message.reply_to is not None and message.reply_to in self._interactions:
            return self._pop_interaction(message.reply_to)
        if message.chat_type == "direct" and message.kind == "reply":
            target = message.thread_id or message.chat_id
            for key, pending in self._interactions.items():
                if pending.chat_type == "direct" and pending.target == target:
                    return self._pop_interaction(key)
        return None

    def _pop_interaction(self, key: str) -> _PendingInteraction:
        pending = self._interactions.pop(key)
        if pending.timer is not None:
            pending.timer.cancel()
        return pending

    async def _answer(self, pending: _PendingInteraction, pieces: list[str]) -> bool:
        """Answer a deferred interaction; ``False`` if the token no longer works."""
        interaction = pending.interaction
        try:
            if not pieces:
                await self._deliver(interaction.delete_original_response,
                                    what="withdrawing a discord interaction response")
                return True
            first = pieces[0]
            await self._deliver(
                lambda: interaction.edit_original_response(content=first,
                                                           allowed_mentions=_NO_PINGS),
                what="answering a discord interaction")
            for piece in pieces[1:]:
                await self._deliver(_followup(interaction, piece),
                                    what="following up a discord interaction")
        except (discord.NotFound, discord.Forbidden):
            log.warning("discord: interaction %s expired; replying in the channel",
                        interaction.id)
            return False
        return True

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

    async def _deliver(self, call: Callable[[], Awaitable[T]], *, what: str) -> T:
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

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """Count a send in flight, so :meth:`stop` can let it finish."""
        self._sending += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._sending -= 1
            if not self._sending:
                self._idle.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class _Client(discord.Client):
    """A plain client whose events go to the adapter (no command tree)."""

    def __init__(self, adapter: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self.adapter = adapter

    async def on_ready(self) -> None:
        # discord.py fires this after every READY: at start, and after a
        # reconnect that could not resume (the missed messages are lost to
        # the gateway and must be read back from the channels' history).
        if self.adapter._ready.is_set():
            self.adapter._reconnected()
        self.adapter._ready.set()

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter._on_message(message)

    async def on_interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        await self.adapter._on_interaction(interaction)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        # discord.py calls on_error from inside its except block: the exception is current.
        log.exception("discord: handling %s failed", event_method)  # noqa: LOG004


class _StreamedReply:
    """The callbacks behind one :class:`EditStream`: draft, edits, final pieces."""

    def __init__(self, channel: DiscordChannel, message: InboundMessage) -> None:
        self.channel = channel
        self.target = int(message.thread_id or message.chat_id)
        self.reference = _reference(OutboundMessage.reply_to_message(message, ""), self.target)
        self.shown: dict[str, str] = {}
        self.editing: asyncio.Task[None] | None = None
        self.stream: EditStream = EditStream(send=self.send, edit=self.edit, finalize=self.finalize,
                                 limit=MESSAGE_LIMIT, interval=channel.edit_interval)

    async def send(self, draft: str) -> str:
        text = _fit(_escape(draft))
        with self.channel._busy():
            try:
                sent = await self.channel._post(self.target, text, self.reference)
            except Exception:
                # A lost draft must not end the run: the final reply is sent whole.
                log.warning("discord: a streaming draft could not be sent", exc_info=True)
                return ""
        self.shown[str(sent.id)] = text
        return str(sent.id)

    async def edit(self, message_id: str, draft: str) -> None:
        if not message_id:
            return
        # Shielded: the stream cancels a pending edit when the reply is final,
        # but a request already sent would still be applied, possibly after
        # the final edit. finalize() waits for it instead.
        self.editing = asyncio.ensure_future(self._edit(message_id, _fit(_escape(draft))))
        await asyncio.shield(self.editing)

    async def _edit(self, message_id: str, text: str) -> None:
        with self.channel._busy():
            await self.channel._edit(self.target, int(message_id), text)
        self.shown[message_id] = text

    async def finalize(self, message_id: str | None, final_text: str | None) -> None:
        if self.editing is not None:
            await asyncio.gather(self.editing, return_exceptions=True)
        with self.channel._busy():
            pieces = split_message(_escape(final_text or ""), MESSAGE_LIMIT)
            draft = message_id or None
            last = await self.channel._deliver_reply(
                self.target, self.reference, pieces, draft=draft,
                shown=self.shown.get(draft) if draft else None)
            # The draft may have given way to a new message: name the one
            # that now carries the reply.
            self.stream.message_id = last


@dataclass(slots=True)
class _PendingInteraction:
    interaction: discord.Interaction[discord.Client]
    target: str
    chat_type: ChatType
    timer: asyncio.Task[None] | None = None


class _RecentSet:
    """The last ``size`` keys seen, for dropping redeliveries in bounded memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, key: Hashable) -> bool:
        """Remember ``key``; ``False`` if it was already there."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys


def delivery_error(exc: BaseException) -> BaseException:
    """What a REST failure means to :func:`deliver`; ``exc`` itself if it is for good.

    The one mapping of what discord.py and aiohttp raise:

    * ``discord.RateLimited`` (a 429 longer than ``max_ratelimit_timeout``) and
      an ``HTTPException`` with status 429 (a limit discord.py did not wait
      out) → :class:`RateLimited`;
    * ``DiscordServerError`` and any ``HTTPException`` with a 5xx, whatever
      the body (an HTML error page included) → :class:`Transient`;
    * aiohttp's ``ClientError`` (resets, server disconnects), ``TimeoutError``
      (a stalled call) and ``OSError`` → :class:`Transient`;
    * ``Forbidden``, ``NotFound``, any other ``HTTPException`` and everything
      else → permanent.
    """
    if isinstance(exc, discord.RateLimited):
        return RateLimited(exc.retry_after)
    if isinstance(exc, discord.HTTPException):
        if exc.status == 429:
            return RateLimited(_retry_after(exc))
        if exc.status >= 500:
            return Transient(f"Discord answered HTTP {exc.status}")
        return exc
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return Transient(f"{type(exc).__name__}: {exc}")
    return exc


def _nonce(delivery_id: str, piece: int) -> str:
    """The nonce of one piece of reply ``delivery_id``: stable, at most 25 characters.

    ``roost-<outbox id>`` fits as it is (``.n`` marks the later pieces);
    a longer key is hashed down to Discord's limit.
    """
    plain = delivery_id if piece == 0 else f"{delivery_id}.{piece}"
    if len(plain) <= NONCE_LIMIT:
        return plain
    return hashlib.sha256(plain.encode("utf-8", "surrogatepass")).hexdigest()[:NONCE_LIMIT]


def _command_of(data: object) -> tuple[str, str]:
    """``(name, args)`` of an application command interaction's ``data``.

    discord.py keeps ``data`` as the payload had it, so every type is checked.
    """
    if not isinstance(data, dict):
        raise _Malformed("it has no data object")
    name = data.get("name")
    if not isinstance(name, str) or not _COMMAND_NAME.match(name):
        raise _Malformed("it names no command")
    options = data.get("options", [])
    if not isinstance(options, list):
        raise _Malformed("its options are not a list")
    args = []
    for option in options:
        if not isinstance(option, dict):
            raise _Malformed("an option is not an object")
        value = option.get("value", "")
        if option.get("name") == "args":
            if not isinstance(value, str | int | float | bool):
                raise _Malformed("its args are not text")
            args.append(str(value))
    return name, " ".join(args)


def _followup(interaction: discord.Interaction[discord.Client],
              text: str) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await interaction.followup.send(text, allowed_mentions=_NO_PINGS, wait=True)
    return call


def _guard_parsers(client: discord.Client) -> None:
    """Make a gateway event the library cannot parse a logged, skipped event.

    discord.py calls its parsers straight from the websocket loop, so one
    malformed payload (a missing field, a bad snowflake) would otherwise
    escape ``connect()`` and end the client.
    """
    parsers = client._connection.parsers

    def guarded(event: str, parser: Callable[[Any], None]) -> Callable[[Any], None]:
        def parse(data: Any) -> None:
            try:
                parser(data)
            except Exception as exc:
                # One line: a traceback per hostile payload would flood the log.
                log.warning("discord: skipped a malformed %s payload (%s: %s)", event,
                            type(exc).__name__, _short(exc))
        return parse

    for event, parser in list(parsers.items()):
        parsers[event] = guarded(event, parser)


def _guard_frames(client: discord.Client) -> None:
    """Make a gateway frame that is not JSON a logged, skipped frame.

    discord.py decodes each frame in ``DiscordWebSocket.received_message``,
    unguarded: a frame that is not JSON, or nested past the decoder's depth,
    escapes ``connect()`` and drops the connection (and the adapter would
    reconnect after a backoff, once per such frame). Each websocket discord.py
    opens passes through ``ConnectionState._update_references``, so that is
    where its ``received_message`` gets the guard.
    """
    state = client._connection
    update_references = state._update_references

    def update(ws: discord.gateway.DiscordWebSocket) -> None:
        update_references(ws)
        received = ws.received_message

        async def guarded(msg: Any, /) -> None:
            try:
                await received(msg)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                log.warning("discord: skipped a gateway frame that could not be decoded "
                            "(%s: %s)", type(exc).__name__, _short(exc, 100))

        setattr(ws, "received_message", guarded)  # noqa: B010  (mypy: method assignment)

    setattr(state, "_update_references", update)  # noqa: B010


def _place(channel: object, in_guild: bool,
           channel_id: int | None = None) -> tuple[str, ChatType, str | None]:
    """``(chat_id, chat_type, thread_id)`` for a channel: threads keep their parent.

    Raises :class:`_Malformed` when an id is no Discord id.
    """
    ident = _snowflake(getattr(channel, "id", channel_id))
    if not in_guild:
        return str(ident), "direct", None
    if isinstance(channel, discord.Thread):
        return str(_snowflake(channel.parent_id)), "group", str(ident)
    return str(ident), "group", None


def _snowflake(value: object) -> int:
    """``value`` if it is a Discord id (an unsigned 64-bit integer); ``ValueError`` if not."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < SNOWFLAKE_LIMIT:
        return value
    raise _Malformed(f"{_short(value, 40)} is not a Discord id")


def _problem(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, _Malformed) else f"{type(exc).__name__}: {_short(exc)}"


def _strip_mentions(text: str, bot_id: int, role_id: int | None) -> str:
    pattern = rf"<@!?{bot_id}>" + (rf"|<@&{role_id}>" if role_id is not None else "")
    return re.sub(rf"[ \t]*(?:{pattern})[ \t]*", " ", text).strip()


def _attachment(attachment: discord.Attachment) -> Attachment:
    # discord.py keeps these as the payload had them, and the core stores them
    # as given (it cleans only text and names): text without lone surrogates.
    mime = clean_text(str(attachment.content_type or ""))
    kind = mime.split("/", 1)[0] if mime.split("/", 1)[0] in ("image", "audio", "video") \
        else "file"
    size = attachment.size
    return Attachment(kind=kind, name=clean_text(str(attachment.filename)),
                      url=clean_text(str(attachment.url)), mime_type=mime,
                      size=size if type(size) is int and size >= 0 else 0)


def _escape(text: str) -> str:
    # A zero-width space after "@" shows the word but is no mention; the
    # allowed-mentions setting blocks the ping as well, this keeps it readable.
    return _MASS_MENTION.sub("@\u200b\\1", text)


def _fit(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def _target(message: OutboundMessage) -> int:
    """The channel a reply is posted in: the thread if there is one."""
    return int(message.thread_id or message.chat_id)


def _reference(message: OutboundMessage, target: int) -> discord.MessageReference | None:
    if message.chat_type != "group" or not message.reply_to or not message.reply_to.isdigit():
        return None
    # fail_if_not_exists=False: if the message was deleted meanwhile, the
    # reply is still posted, just without the reference.
    return discord.MessageReference(message_id=int(message.reply_to), channel_id=target,
                                    fail_if_not_exists=False)


def _retry_after(exc: discord.HTTPException) -> float:
    header = exc.response.headers.get("Retry-After", "") if exc.response is not None else ""
    try:
        return float(header)
    except ValueError:
        return 1.0


def _api_base(value: str | None) -> str | None:
    """``DISCORD_API_BASE`` as ``Route.BASE``: ``/api/v10`` is added when missing."""
    if not value:
        return None
    base = value.rstrip("/")
    return base if _API_VERSION.search(base) else base + "/api/v10"


def _command_payload(commands: Sequence[Command]) -> list[dict[str, Any]]:
    """Application commands for ``commands``: names Discord accepts, with an ``args`` option."""
    payload: list[dict[str, Any]] = []
    seen: set[str] = set()
    for command in commands:
        for name in (command.name, *command.aliases):
            name = name.lower()
            if name in seen:
                continue
            if not _COMMAND_NAME.match(name):
                log.warning("discord: /%s is not a valid application command name; "
                            "it still works typed as a message", name)
                continue
            seen.add(name)
            payload.append({
                "name": name, "type": 1,
                "description": (command.description or name)[:100],
                "options": [{"type": 3, "name": "args", "required": False,
                             "description": (command.usage or "arguments")[:100]}],
            })
    if len(payload) > MAX_COMMANDS:
        log.warning("discord: only the first %d of %d commands are registered",
                    MAX_COMMANDS, len(payload))
    return payload[:MAX_COMMANDS]
