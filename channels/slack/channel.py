"""The :class:`SlackChannel` itself: lifecycle and the outbound entry points."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.config.settings import SetupError
from bot.contracts.channel import InboundHandler
from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.slack.common import (
    _SLASH,
    EVENTS_PATH,
    MESSAGE_LIMIT,
    STOP_GRACE,
    _api_base,
    _error_code,
    _manifest,
    _sdk_log,
    log,
)
from channels.slack.inbound import _Inbound
from channels.slack.media import _Media
from channels.slack.outbound import _Outbound
from channels.slack_format import split_for_slack

if TYPE_CHECKING:
    from bot.contracts.commands import Command


class SlackChannel(_Inbound, _Outbound, _Media):
    """Slack through slack-bolt; see the module docstring for the mapping."""

    name = "slack"

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
        self._handler = handler
        # No SDK retry handlers: deliver() owns retries, and two layers of them
        # could post one reply twice.
        self._web = AsyncWebClient(token=s.slack_bot_token.get_secret_value(),
                                   base_url=_api_base(s.slack_api_base), retry_handlers=[],
                                   logger=_sdk_log, timeout=self.timeout)
        try:
            auth = await self._web.auth_test()
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_BOT_TOKEN: auth.test answered "
                               f"{_error_code(exc) or exc.response.status_code}") from exc
        self.bot_user_id = str(auth.get("user_id") or "")
        self.bot_id = str(auth.get("bot_id") or "")
        self._app = self._build_app(secret or "", socket_mode=app_token is not None)
        if app_token is not None and self.leadership is not None:
            # Replicas: one Socket Mode connection per deployment, the leader's.
            self._standby = not self.leadership.is_leader
            self._spawn(self._socket_while_leading(self.leadership, app_token))
        elif app_token is not None:
            await self._connect_socket(app_token)
            log.info("Slack: connected over Socket Mode as %s", self.bot_user_id)
        else:
            await self._listen_http(secret or "")
            log.info("Slack: Events API on %s:%s%s as %s", self.host, self.port, EVENTS_PATH,
                     self.bot_user_id)

    async def stop_intake(self) -> None:
        """Take no more deliveries; replies keep going out until :meth:`stop`.

        The Events endpoint answers 503 from now on and Socket Mode envelopes
        are left unacked: Slack delivers both again (after the restart).
        Deliveries already being handed over finish and are acknowledged.
        """
        self._intake_open = False

    async def stop(self) -> None:
        """Stop receiving, then let Web API calls in flight finish (up to 10 s)."""
        self._intake_open = False
        if self._socket is not None:
            socket, self._socket = self._socket, None
            with contextlib.suppress(Exception):
                await socket.close()  # type: ignore[no-untyped-call]  # SDK method lacks hints
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._shared is not None:
            shared, self._shared = self._shared, None
            shared.remove_post(EVENTS_PATH)
        try:
            await asyncio.wait_for(self._idle.wait(), STOP_GRACE)
        except TimeoutError:
            log.warning("Slack: %d Web API call(s) still running at shutdown", self._in_flight)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_media()

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
        if message.files:
            self._check_files(message.files)  # before anything is posted
        thread_ts = message.thread_id or message.reply_to
        slash = _SLASH.get()
        if slash is not None and slash.channel_id == message.chat_id and not message.replace:
            if message.text.strip() or not message.files:
                await self._respond(slash.response_url, message.text)
            if message.files:
                # A response_url takes no files: they are shared in the channel.
                await self._upload_files(message.chat_id, thread_ts, message.files)
            return None
        pieces = split_for_slack(message.text, MESSAGE_LIMIT) if message.text.strip() else []
        last = await self._deliver_reply(message.chat_id, thread_ts, pieces,
                                         draft=message.replace or None,
                                         delivery_id=message.delivery_id,
                                         look_first=message.redelivery)
        if message.files:
            await self._upload_files(message.chat_id, thread_ts, message.files)
        return last

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages; one already gone counts as deleted."""
        await self._delete(chat_id, message_id)

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
                  "Add to the manifest:\n%s", _manifest(names))
