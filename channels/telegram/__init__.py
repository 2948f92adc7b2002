"""The Telegram channel: Bot API updates in, HTML replies out, through aiogram.

The adapter only translates. A ``message`` update becomes an
:class:`InboundMessage` (private chats are ``direct``; groups and supergroups
``group``; a forum topic is its own ``thread_id``) and goes to the core, which
applies the DM and group policies; the adapter's part is to say whether the
bot was addressed (``mentioned``). What comes with a message besides text
(photos, files, voice, a location, a contact, a sticker, a poll...) becomes
described attachments; files are not downloaded. A message sent on behalf of
a chat (a linked channel's automatic forward, an anonymous admin) comes from
that chat. Other update kinds are confirmed and ignored. Replies are rendered
from the model's Markdown to Telegram HTML, cut at 4,096 characters, and sent
with retries.

Receiving is durable. Updates arrive by Roost's own long-polling loop
(``getUpdates``) or, when ``telegram_webhook_url`` is set, on an aiohttp
server that Telegram POSTs to, checked with the secret-token header. Either
way an update is acknowledged to Telegram (the next ``getUpdates`` offset, a
webhook's 200) only after the core's handler returned for it, that is once the
message is in the core's inbox; if the handler raises, Telegram delivers the
update again. A malformed update is skipped with one warning and acknowledged,
so it cannot wedge the updates behind it; one whose id Telegram cannot have
given is skipped without moving the offset (the server would read it as
"forget the queue"). ``stop_intake`` stops receiving at once (the webhook
answers 503 from then on) while replies can still be sent until ``stop``.

Sending honours Telegram's limits (``channels.delivery``): after a 429 nothing
goes to that chat until ``retry_after`` has passed, a proactive budget keeps
the documented rates, and streaming drafts and typing indicators give way to
final replies. Every aiogram error is mapped in :func:`translated`.

The package, by job: :mod:`.channel` (lifecycle, the core-facing methods,
delegated to the parts it builds), :mod:`.client` (the one way of calling the Bot
API, its errors mapped, what is known of each chat), :mod:`.receiving` (updates
in: the tolerant session, long polling, each update handed to the core once) and
:mod:`.webhook`, :mod:`.inbound` (a message as the core sees it), :mod:`.sender`
(replies rendered, cut and sent), :mod:`.drafts` (streamed replies),
:mod:`.outcomes` (sends whose outcome is unknown), :mod:`.uploads` and
:mod:`.media` (files out and in), :mod:`.malformed` (updates Telegram cannot have
sent as they are), :mod:`.warmup` (aiogram's validators built ahead of use).
"""

from __future__ import annotations

# Before any aiogram import: it makes aiogram's types build on first use
# (importing aiogram otherwise costs about 2.4 s and 150 MB). Every submodule
# is imported through this package, so this runs first.
from channels.telegram_lazy import LAZY  # isort: split

from channels.telegram.channel import TelegramChannel
from channels.telegram.client import ChatMigrated, translated
from channels.telegram.malformed import MAX_UPDATE_ID, result_elements
from channels.telegram.receiving import parse_update

__all__ = [
    "LAZY",
    "MAX_UPDATE_ID",
    "ChatMigrated",
    "TelegramChannel",
    "parse_update",
    "result_elements",
    "translated",
]
