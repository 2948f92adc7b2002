"""A local fake of Discord: the REST API and the gateway websocket on 127.0.0.1.

The real ``discord.py`` client runs against it unchanged; point it there with
the ``DISCORD_API_BASE`` and ``DISCORD_GATEWAY_URL`` settings (see
:meth:`FakeDiscord.settings`)::

    async def test_hello(fake_discord: FakeDiscord) -> None:
        app = await Roost.create(Settings(**fake_discord.settings()), ...)
        await app.start_channel("discord")
        fake_discord.dm("hello")
        call = await fake_discord.wait_for_call("POST", "/channels/4000/messages")

What it speaks (see ``/work/shared/notes/fake-platform-servers.md``):

- REST under ``/api/v10``: ``users/@me``, ``oauth2/applications/@me``, channel
  messages (POST, PATCH, DELETE), typing, global application commands (PUT),
  interaction callbacks and the interaction webhook (``@original`` edit and
  delete, followups). Anything else gets a 404 in Discord's error shape, and
  a call without ``Authorization: Bot <token>`` a 401.
  Every call is recorded in :attr:`FakeDiscord.calls`, rejected ones too;
  :meth:`FakeDiscord.fail_next` makes the next matching calls answer 429
  (with ``Retry-After`` and a JSON ``retry_after``) or a 5xx.
  ``GET /channels/{id}/messages`` reads a channel's history as Discord does
  (newest first; ``after``/``before`` exclusive, ``limit`` up to 100): the
  users' messages pushed or recorded as missed (:meth:`FakeDiscord.missed`)
  and the bot's own. ``GET /channels/{id}`` describes the known channels. A
  message created with ``enforce_nonce`` and a nonce seen before returns the
  earlier message instead of a new one, as on Discord.
- Faults, the ways the real Discord fails: :meth:`FakeDiscord.inject` queues
  one of :data:`FAULTS` for matching calls and :meth:`FakeDiscord.chaos` fails
  a random share of them: ``"500"`` (JSON), ``"502"`` (an HTML page from the
  proxy), ``"503"``, ``"429"`` (JSON ``retry_after`` with ``X-RateLimit-*``
  headers), ``"reset_before"`` (TCP reset before the call took effect),
  ``"reset_after"`` (it took effect, then the reset) and ``"stall"`` (the
  answer comes ``stall`` seconds late).
- Files, as on Discord: :meth:`FakeDiscord.attachment` puts bytes on the fake
  CDN (``/attachments/{channel}/{id}/{name}?ex=..&is=..&hm=..``; an unsigned,
  expired or unknown URL gets 404 "This content is no longer available.", as
  the real CDN answers) and returns the attachment object to put in a message
  (``attachments=`` of the message helpers). :meth:`FakeDiscord.fail_cdn`
  makes the next CDN requests fail. Message creation accepts multipart
  bodies as discord.py sends them (``payload_json`` and ``files[n]``),
  validated like the API: more than 10 files or an empty message are a 400,
  files over :attr:`FakeDiscord.upload_limit` together (10 MiB) a 413 with
  code 40005 "Request entity too large". Uploaded files are kept on the
  message (:attr:`FakeMessage.files`) and served by the CDN.
- The gateway at ``/gateway``: HELLO, heartbeat ACKs, IDENTIFY → READY and one
  GUILD_CREATE (a text channel, a thread in it and the bot's managed role),
  RESUME → RESUMED. Sharding as on Discord: an IDENTIFY's ``shard: [id, count]``
  gets the guilds of that shard (:func:`shard_of`: ``(guild_id >> 22) % count``;
  :meth:`FakeDiscord.add_guild` adds guilds), each guild's events go to its
  shard's sessions and DMs to shard 0's; an invalid shard is closed with 4010
  (Invalid shard) and a count below :attr:`FakeDiscord.shards_required` with
  4011 (Sharding required), which ``GET /gateway/bot`` recommends (``shards``).
  :attr:`FakeDiscord.live_shards` lists the live sessions' shards. Helpers push
  MESSAGE_CREATE (guild, mention, reply to the bot, thread, DM, from another
  bot, malformed) and INTERACTION_CREATE.
  :meth:`FakeDiscord.invalidate_session` sends INVALID_SESSION (``d: false``):
  the client IDENTIFYs again and gets a new READY, as after a reconnect
  Discord could not resume (the events meanwhile are not replayed).

The server never closes a gateway socket by itself: the client would try to
RESUME, which is not what a test wants to see.

The modules: :mod:`.wire` (ids, payload shapes, HTTP helpers) and one per
part, each an object :class:`FakeDiscord` (:mod:`.server`) builds and holds:
:mod:`.state` (what the fake holds, shared by the others), :mod:`.faults`,
:mod:`.cdn`, :mod:`.rest`, :mod:`.gateway` and :mod:`.events` (pushing users'
messages).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from bot.testing.discord.server import FakeDiscord
from bot.testing.discord.wire import (
    APP_ID,
    BOT_ID,
    BOT_ROLE_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    FAULTS,
    GUILD_ID,
    OTHER_BOT_ID,
    THREAD_ID,
    USER_ID,
    FakeMessage,
    RestCall,
    UploadedFile,
    shard_of,
    user_payload,
)

__all__ = [
    "APP_ID",
    "BOT_ID",
    "BOT_ROLE_ID",
    "CHANNEL_ID",
    "DM_CHANNEL_ID",
    "FAULTS",
    "GUILD_ID",
    "OTHER_BOT_ID",
    "THREAD_ID",
    "USER_ID",
    "FakeDiscord",
    "FakeMessage",
    "RestCall",
    "UploadedFile",
    "fake_discord",
    "shard_of",
    "user_payload",
]


@pytest_asyncio.fixture(name="fake_discord")
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    """A started :class:`FakeDiscord`, stopped after the test.

    Named explicitly, so a test module can import it under another name
    (``from bot.testing.discord import fake_discord as _fixture``) without
    the parameter shadowing the import.
    """
    async with FakeDiscord() as fake:
        yield fake
