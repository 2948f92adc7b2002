"""The :class:`MatrixChannel`: the channel contract, delegated to the parts it builds.

Its parts: :class:`MatrixApi` (login and every call), :class:`SyncSource` (the update
source), :class:`Translator` (events into the core's) and :class:`Replies` (posts, edits,
files, reactions, typing).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from plugins.matrix.api import MatrixApi, MatrixError
from plugins.matrix.config import MatrixConfig
from plugins.matrix.inbound import CHANNEL_NAME, Recent, Translator
from plugins.matrix.outbound import Replies
from plugins.matrix.render import text_content
from plugins.matrix.sync import SyncSource
from roost import (
    Attachment,
    Channel,
    ChannelHealth,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    ReplyStream,
    Settings,
)
from roost.channels import (
    ButtonRows,
    Capabilities,
    DeliveryPolicy,
    InFlight,
    RateLimited,
    SetupError,
    Transient,
    opened_files,
    short,
)

STOP_GRACE = 10.0


class MatrixChannel(Channel):
    """Matrix through matrix-nio; see :mod:`plugins.matrix` for the mapping."""

    name = CHANNEL_NAME
    marks_sending = True
    capabilities = Capabilities(edit=True, react=True, edits_in=True, deletions_in=True,
                                reactions_in=True)

    def __init__(self, settings: Settings, config: MatrixConfig, *,
                 policy: DeliveryPolicy | None = None, timeout: float = 30.0) -> None:
        """Build the parts; nothing connects until :meth:`start`."""
        self.settings = settings
        self.config = config
        policy = policy or DeliveryPolicy()
        self.inflight = InFlight()
        self.api = MatrixApi(config, policy=policy, store=settings.data_dir / "matrix",
                             timeout=timeout + config.sync_timeout)
        posted = Recent()
        self.translator = Translator(self.api.user_id, lambda: self.api.display_name, posted,
                                     self.sender_of)
        self.replies = Replies(self.api, self.inflight, posted, self.translator.bot_threads,
                               edit_interval=config.edit_interval)
        self.sync = SyncSource(self.api, self.translator, settings,
                               timeout=config.sync_timeout,
                               timeline_limit=config.timeline_limit,
                               auto_join=config.auto_join, policy=policy, tell=self.tell)

    async def start(self, handler: InboundHandler) -> None:
        """Log in, then sync in the background (the leader only, with replicas)."""
        if not self.config.configured():
            raise SetupError("the matrix channel needs MATRIX_HOMESERVER, MATRIX_USER_ID and "
                             "MATRIX_ACCESS_TOKEN (or MATRIX_PASSWORD)")
        await self.api.open(self.state)
        self.sync.start(handler, self.state, self.leadership)

    def health(self) -> ChannelHealth:
        """Ready once a sync answered (see :meth:`SyncSource.health`)."""
        return self.sync.health()

    async def stop_intake(self) -> None:
        """Stop syncing; replies keep going out until :meth:`stop`."""
        await self.sync.close()

    async def stop(self) -> None:
        """Stop syncing, let the calls in flight finish (up to 10 s), close the sessions."""
        await self.sync.close()
        await self.inflight.wait_idle(STOP_GRACE)
        await self.inflight.cancel_tasks()
        await self.api.close()

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply (see :meth:`Replies.send`); a file over the homeserver's
        upload limit raises :class:`~roost.MediaTooLarge` before anything is posted."""
        with opened_files(message.files, self.replies.check_file) as opened:
            return await self.replies.send(message, opened)

    async def tell(self, room_id: str, text: str) -> str:
        """Post a notice (``m.notice``, which bots do not answer) into ``room_id``."""
        content = {**text_content(text), "msgtype": "m.notice"}
        return await self.replies.post(room_id, content, None, mark=False)

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft edited in place (``m.replace``), unless streaming is off for Matrix."""
        if not self.api.started or not self.settings.streams(self.name):
            return None
        reply_to = message.message_id if message.chat_type == "group" else None
        return self.replies.open_stream(message.chat_id, reply_to or None, message.thread_id)

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Typing notices in the room while the block runs."""
        async with self.replies.typing(message.chat_id):
            yield

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """Edit one of the bot's messages (``m.replace``); ``False`` if it cannot be."""
        return await self.replies.replace(chat_id, message_id, text_content(text or "…"),
                                          None)

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """The bot's ``m.reaction`` on a message, replacing its earlier one (``replacing``:
        the one the core believes it set, looked up when this process does not know it)."""
        return await self.replies.react(chat_id, message_id, emoji, replacing)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Redact one of the bot's messages."""
        await self.replies.withdraw(chat_id, message_id)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The file's bytes from the authenticated media endpoint, at most ``limit``."""
        return await self.api.download(attachment.url, limit,
                                       f"downloading {short(attachment.name, 60)} from Matrix")

    async def sender_of(self, room_id: str, event_id: str) -> str | None:
        """Who sent ``event_id`` (asked of the server), or ``None`` if it cannot be read."""
        client = self.api.client
        try:
            answer = await self.api.once("event", lambda: client.room_get_event(room_id,
                                                                                 event_id))
        except (MatrixError, RateLimited, Transient):
            return None
        return str(getattr(answer.event, "sender", "") or "") or None

