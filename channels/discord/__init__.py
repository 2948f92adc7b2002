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

Sharding: with ``discord_shard_count`` above 1 each shard is a gateway session
of its own (Discord sends a guild's events to shard ``(guild_id >> 22) %
count``, DMs to shard 0); one process runs them all, and replicas on
PostgreSQL share them through advisory-lock leases, one replica per shard, a
dead replica's taken over within the lease (see :mod:`channels.discord.shards`).

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

Files: a message's attachments become :class:`~bot.contracts.messages.Attachment`
items (kind ``photo``, ``video``, ``audio``, ``voice`` for a voice message,
``document``, or ``file`` without a type; ``url`` the CDN link, size and
dimensions as declared); :meth:`DiscordChannel.download` fetches one from the
CDN with a byte limit. A reply's files are uploaded after its text, one
message each with the caption as text, up to ``discord_max_upload_mb`` (10 MB
by default; larger raises ``MediaTooLarge`` before anything is posted). See
:mod:`channels.discord.media`.

Slash commands are synced as global application commands, each with an
optional ``args`` string. An interaction is deferred at once (Discord wants an
answer within 3 s) and routed to the core as ``/name args``; the command's
reply becomes the interaction's response (its first piece edits the deferred
"thinking…" message, further pieces are followups). Typed ``/name`` messages
work as well; the core parses them.
"""

from channels.discord.channel import DiscordChannel
from channels.discord.common import MESSAGE_LIMIT
from channels.discord.errors import delivery_error

__all__ = ["MESSAGE_LIMIT", "DiscordChannel", "delivery_error"]
