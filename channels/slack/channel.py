"""The :class:`SlackChannel`: the channel contract, delegated to the parts it builds.

Its parts: :class:`SlackApi` (the Web API and response_urls), :class:`Inbound`
(events and commands into the core), one update source (:class:`EventsEndpoint`
over HTTP or :class:`SocketMode`), :class:`Replies` (posts, drafts, deletes)
and :class:`Media` (downloads and uploads).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from slack_sdk.errors import SlackApiError

from bot.config.settings import SetupError
from bot.contracts.channel import (
    READY,
    Capabilities,
    Channel,
    ChannelHealth,
    InboundHandler,
    ReplyStream,
)
from bot.contracts.files import OpenFile
from bot.contracts.messages import (
    Attachment,
    ButtonPress,
    ButtonRows,
    InboundMessage,
    OutboundMessage,
)
from channels.delivery import DeliveryPolicy
from channels.inflight import InFlight
from channels.slack.api import SlackApi
from channels.slack.changes import NAMES, Reactions, blocks_of
from channels.slack.common import (
    CHANNEL_NAME,
    EVENTS_PATH,
    MESSAGE_LIMIT,
    REMEMBERED,
    SLASH_REPLY,
    STOP_GRACE,
    RecentKeys,
    error_code,
    log,
    manifest,
)
from channels.slack.events_api import EventsEndpoint
from channels.slack.inbound import Inbound
from channels.slack.media import Media
from channels.slack.outbound import Replies
from channels.slack.socketmode import SocketMode
from channels.slack_format import split_for_slack
from channels.uploading import opened_files

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.contracts.commands import Command


class SlackChannel(Channel):
    """Slack through slack-bolt; see the package docstring for the mapping."""

    name = CHANNEL_NAME
    capabilities = Capabilities(buttons=True, edit=True, react=True,
                                reaction_emoji=frozenset(NAMES), edits_in=True,
                                deletions_in=True, reactions_in=True)

    def __init__(self, settings: Settings, *, host: str = "0.0.0.0",
                 policy: DeliveryPolicy | None = None, edit_interval: float = 1.0,
                 timeout: int = 30) -> None:
        """Build the parts; nothing connects yet.

        ``host`` is the address the Events API listener binds; ``policy`` tunes
        retries; ``edit_interval`` spaces streaming edits; ``timeout`` bounds each
        Web API call (seconds), an answer that takes longer counts as a transient
        failure.
        """
        self.settings = settings
        policy = policy or DeliveryPolicy()
        bot_threads: RecentKeys[tuple[str, str]] = RecentKeys(REMEMBERED)
        self.inflight = InFlight()
        self.api = SlackApi(settings, self.inflight, policy=policy, timeout=timeout)
        self.media = Media(settings, self.api, self.inflight, bot_threads, policy=policy)
        self.inbound = Inbound(self.api, self.inflight, bot_threads)
        self.replies = Replies(self.api, self.inflight, bot_threads, policy=policy,
                               edit_interval=edit_interval)
        self.events = EventsEndpoint(settings, self.inbound, host=host)
        self.socket = SocketMode(self.api, self.inbound, self.inflight)
        self.reactions = Reactions(self.api)
        self._manifest_logged = False

    @property
    def bot_user_id(self) -> str:
        """The bot's user id (``auth.test`` at start)."""
        return self.api.bot_user_id

    @property
    def bot_id(self) -> str:
        """The bot's bot id (``auth.test`` at start)."""
        return self.api.bot_id

    @property
    def port(self) -> int | None:
        """The HTTP port the Events API is served on (``slack_port`` may be 0 in tests)."""
        return self.events.port

    @property
    def events_url(self) -> str:
        """The local Events API URL (HTTP mode, once started)."""
        if self.events.port is None:
            raise RuntimeError("the Slack channel is not listening over HTTP")
        return f"http://127.0.0.1:{self.events.port}{EVENTS_PATH}"

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the bot token, then listen (HTTP) or connect (Socket Mode)."""
        s = self.settings
        if s.slack_bot_token is None:
            raise ValueError("SLACK_BOT_TOKEN is not set")
        app_token = s.slack_app_token.get_secret_value() if s.slack_app_token else None
        secret = s.slack_signing_secret.get_secret_value() if s.slack_signing_secret else None
        if app_token is None and secret is None:
            raise SetupError("the slack channel needs SLACK_APP_TOKEN (Socket Mode) or "
                             "SLACK_SIGNING_SECRET (Events API over HTTP) next to "
                             "SLACK_BOT_TOKEN")
        await self.api.open(s.slack_bot_token.get_secret_value())
        self.inbound.start(handler, secret or "", socket_mode=app_token is not None)
        if app_token is not None:
            await self.socket.start(app_token, self.leadership)
        else:
            await self.events.listen(secret or "", self.http_routes)
            log.info("Slack: Events API on %s:%s%s as %s", self.events.host, self.events.port,
                     EVENTS_PATH, self.api.bot_user_id)

    def health(self) -> ChannelHealth:
        """Ready once ``auth.test`` passed and the Events endpoint listens or the Socket
        Mode connection is up; not while the socket is down (the SDK reconnects it)."""
        socket = self.socket.health()
        if socket is not None:
            return socket
        if self.events.listening:
            return READY
        return ChannelHealth(False, "connecting" if self.inbound.open else "stopped")

    async def stop_intake(self) -> None:
        """Take no more deliveries; replies keep going out until :meth:`stop`.

        The Events endpoint answers 503 from now on and Socket Mode envelopes
        are left unacked: Slack delivers both again (after the restart).
        Deliveries already being handed over finish and are acknowledged.
        """
        self.inbound.close()

    async def stop(self) -> None:
        """Stop receiving, then let Web API calls in flight finish (up to 10 s)."""
        self.inbound.close()
        await self.socket.close()
        await self.events.close()
        if not await self.inflight.wait_idle(STOP_GRACE):
            log.warning("Slack: %d Web API call(s) still running at shutdown",
                        self.inflight.count)
        await self.inflight.cancel_tasks()
        await self.media.close()

    # -- outbound ----------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; the ``ts`` of its last message (``None`` via response_url).

        A slash command's reply goes to its response_url. Otherwise the reply is
        posted (threaded as the module doc says); with ``replace`` the draft is
        edited into the first piece, or, if that fails for good, the reply is
        posted anew and the draft deleted. ``message.files`` are uploaded after
        the text into the same channel and thread (the returned ``ts`` stays
        the text's); one over 1 GB raises :class:`MediaTooLarge` before
        anything is posted.
        """
        # Every file opened once and checked before anything is posted; uploads read
        # from those descriptors.
        with opened_files(message.files, self.media.check_file) as opened:
            return await self.send_opened(message, opened)

    async def send_opened(self, message: OutboundMessage,
                          opened: Sequence[OpenFile]) -> str | None:
        """:meth:`send` once the reply's files are open (``opened``, in their order)."""
        thread_ts = message.thread_id or message.reply_to
        slash = SLASH_REPLY.get()
        if slash is not None and slash.channel_id == message.chat_id and not message.replace:
            if message.text.strip() or not message.files:
                await self.api.respond(slash.response_url, message.text)
            if message.files:
                # A response_url takes no files: they are shared in the channel.
                await self.media.upload_files(message.chat_id, thread_ts, message.files, opened)
            return None
        pieces = split_for_slack(message.text, MESSAGE_LIMIT) if message.text.strip() else []
        last = await self.replies.deliver_reply(message.chat_id, thread_ts, pieces,
                                                draft=message.replace or None,
                                                delivery_id=message.delivery_id,
                                                look_first=message.redelivery,
                                                buttons=message.buttons)
        if message.files:
            await self.media.upload_files(message.chat_id, thread_ts, message.files, opened)
        return last

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """The press was acknowledged on arrival; ``note`` goes to the presser alone
        (an ephemeral message through its ``response_url``; Slack has no alerts)."""
        await self.reactions.answer(press, note)

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """``chat.update`` with ``buttons`` in place of the old ones (none: removed);
        ``False`` if the message is gone."""
        pieces = split_for_slack(text, MESSAGE_LIMIT) if text.strip() else []
        shown = pieces[0] if pieces else "…"
        try:
            await self.api.call("chat.update", self.api.web.chat_update, self.replies.policy,
                                channel=chat_id, ts=message_id, text=shown,
                                blocks=blocks_of(shown, buttons))
        except SlackApiError as exc:
            if error_code(exc) not in ("message_not_found", "cant_update_message"):
                raise
            log.info("Slack: message %s to edit is gone (%s)", message_id, error_code(exc))
            return False
        return True

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """``reactions.add``/``.remove`` (tried once: a rate-limited one is dropped)."""
        return await self.reactions.react(chat_id, message_id, emoji, replacing=replacing)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages; one already gone counts as deleted."""
        await self.replies.delete(chat_id, message_id)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment`` from Slack (see :meth:`Media.download`)."""
        return await self.media.download(attachment, limit)

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """An edited draft in the reply's place, unless streaming is off for Slack."""
        if not self.api.started or not self.settings.streams(self.name):
            return None
        return self.replies.open_stream(message)

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Nothing: Slack offers bots no typing indicator in channels (see the module doc)."""
        yield

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Log (once, at debug level) the manifest entries Slack needs; nothing is called."""
        if self._manifest_logged:
            return
        self._manifest_logged = True
        names = ", ".join(sorted({c.name for c in commands}))
        log.debug("Slack slash commands live in the app manifest, not in the API. "
                  "Add to the manifest:\n%s", manifest(names))
