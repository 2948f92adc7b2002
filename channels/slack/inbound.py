"""Deliveries into the core: events and slash commands, routed by bolt.

:class:`Inbound` translates each event into an
:class:`~bot.contracts.messages.InboundMessage` and hands it to the core once
per message; the update source (:class:`EventsEndpoint` or
:class:`SocketMode`) acknowledges the delivery only after that returned.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.contracts.channel import InboundHandler
from bot.contracts.messages import (
    ChatType,
    InboundMessage,
    MessageDeletion,
    MessageEdit,
    ReactionEvent,
    parse_command,
)
from channels.inflight import InFlight
from channels.logline import short as _short
from channels.slack.api import SlackApi
from channels.slack.changes import change_of, press_of
from channels.slack.common import (
    CHANNEL_NAME,
    REMEMBERED,
    RESPONSE_URL,
    SLACK_ID,
    SLACK_TS,
    SLASH_COMMAND,
    SLASH_REPLY,
    SPOKEN_SUBTYPES,
    TRIGGER_ID,
    KeyedLocks,
    Malformed,
    NotRecorded,
    RecentKeys,
    SlashReply,
    command_text,
    describe_request,
    event_key,
    field_of,
    header_value,
    log,
    logged,
    problem_text,
    sender_name,
    team_of,
)
from channels.slack.media import attachments_of
from channels.slack_format import from_slack, unescape

Delivered = InboundMessage | MessageEdit | MessageDeletion | ReactionEvent
"""What an event delivery hands the core (presses come as interactivity payloads)."""


class Inbound:
    """Events and slash commands translated and handed to the core once each."""

    def __init__(self, api: SlackApi, inflight: InFlight,
                 bot_threads: RecentKeys[tuple[str, str]]) -> None:
        """``bot_threads`` holds the threads the bot posted in (a reply there addresses it)."""
        self.api = api
        self.inflight = inflight
        self.bot_threads = bot_threads
        self.open = True
        """Whether deliveries are taken (``False`` from :meth:`close` on)."""
        self._handler: InboundHandler | None = None
        self._app: AsyncApp | None = None
        self._handled: RecentKeys[str] = RecentKeys(REMEMBERED)
        """Delivery keys the core has recorded (see :func:`event_key`)."""
        self._handling = KeyedLocks()

    def start(self, handler: InboundHandler, secret: str, *, socket_mode: bool) -> None:
        """Hand deliveries to ``handler`` from now on, through a bolt app verifying
        requests with ``secret`` (Socket Mode's are not signed)."""
        self._handler = handler
        self._app = self._build_app(secret, socket_mode=socket_mode)

    def close(self) -> None:
        """Take no more deliveries (shutdown): the update sources leave them unacknowledged."""
        self.open = False

    async def dispatch(self, request: AsyncBoltRequest) -> BoltResponse:
        """Route one request through bolt; a 5xx answer means the core did not record it."""
        assert self._app is not None
        return await self._app.async_dispatch(request)

    def _build_app(self, secret: str, *, socket_mode: bool) -> AsyncApp:
        app = AsyncApp(client=self.api.web, signing_secret=secret, name="roost",
                       logger=logging.getLogger("roost.channels.slack.bolt"),
                       # Socket Mode requests are not signed; the socket is authenticated.
                       request_verification_enabled=not socket_mode,
                       # Bolt answers only once the listener returned: a delivery
                       # is acknowledged after the core recorded it, and a
                       # listener that raised is answered with a 500 (Slack retries).
                       process_before_response=True,
                       # A request no listener takes (block_actions, a type Slack
                       # invents later, junk) reaches the error handler below, which
                       # answers 200, instead of a 404 that Slack would retry.
                       raise_error_for_unhandled_request=True)

        # A closure, not the bound method: bolt passes arguments by parameter name.
        async def on_error(error: Exception, request: AsyncBoltRequest) -> BoltResponse | None:
            return self._bolt_error(error, request)

        app.error(on_error)

        # Bolt builds listener arguments from parameter names, so these are plain
        # closures named the way it expects (a bound method would expose ``self``).
        async def on_event(body: dict[str, Any], request: AsyncBoltRequest) -> None:
            try:
                await self._on_event(body, header_value(request, "x-slack-retry-num"))
            except Exception as exc:
                raise NotRecorded(str(exc)) from exc

        async def on_action(ack: AsyncAck, body: dict[str, Any]) -> None:
            # Acknowledged within Slack's 3 s: bolt answers once this returns, and the
            # core only records the press first.
            try:
                await self._on_action(body)
            except Exception as exc:
                raise NotRecorded(str(exc)) from exc
            await ack()

        async def on_command(ack: AsyncAck, body: dict[str, Any]) -> None:
            # The core only records the command before returning, well inside
            # Slack's 3 s; the reply follows via response_url. If recording
            # failed, bolt answers 500 and Slack tells the user it failed.
            try:
                await self._on_command(body)
            except Exception as exc:
                raise NotRecorded(str(exc)) from exc
            await ack()

        # One catch-all listener each, so every event is acked (an unhandled one
        # would get a 404 and be redelivered) and routed in one place.
        app.event(re.compile(".*"))(on_event)
        app.command(re.compile(".*"))(on_command)
        app.action(re.compile(".*"))(on_action)
        return app

    def _bolt_error(self, error: Exception, request: AsyncBoltRequest) -> BoltResponse | None:
        """Bolt's error handler, for listener and middleware errors alike.

        Only a failure of the core's handler is worth a retry: bolt's 500
        stands. Anything else is the payload's fault (bolt's middleware
        choked on it, or nothing handles its type), and a redelivery would
        fail the same way: acknowledged with 200 and dropped with one warning
        line, as bolt recommends for unhandled requests (a 404 or a 500 would
        make Slack retry it).
        """
        if isinstance(error, NotRecorded):
            log.error("Slack: the core did not record a delivery; Slack will deliver it "
                      "again", exc_info=error.__cause__ or error)
            return None
        if isinstance(error, BoltUnhandledRequestError):
            log.warning("Slack: skipped a request nothing handles (%s)",
                        describe_request(request.body))
        else:
            log.warning("Slack: skipped a malformed request (%s: %s)", type(error).__name__,
                        _short(error))
        return BoltResponse(status=200, body="")

    async def _on_action(self, body: dict[str, Any]) -> None:
        try:
            press = press_of(body)
        except Exception as exc:
            log.warning("Slack: malformed button press skipped: %s", problem_text(exc))
            return
        if self._handler is None:
            raise RuntimeError("the Slack channel is not started")
        await self._handler(press)

    async def _on_event(self, body: dict[str, Any], retry: str | None) -> None:
        try:
            change = change_of(body, self.api.bot_user_id, self._translate)
        except Exception as exc:
            log.warning("Slack: malformed event skipped: %s", problem_text(exc))
            return
        if change is not None:
            await self._hand_over(change, retry)
            return
        try:
            message = self._translate(body)
        except Exception as exc:
            # Whatever the payload holds (a list where a string belongs, an
            # unexpected shape), a redelivery would fail the same way: skip it.
            log.warning("Slack: malformed event skipped: %s", problem_text(exc))
            return
        if message is not None:
            await self._hand_over(message, retry)

    async def _hand_over(self, message: Delivered, retry: str | None = None) -> None:
        """Give ``message`` to the core unless the core already recorded its key.

        The ``message`` and ``app_mention`` events of one post share a key, so
        whichever comes second (or a retry of either) waits for the first and
        is skipped once the core has it. A key is remembered only after the
        handler returned: if it raised, the redelivery is handed over again.
        The core dedupes on ``event_id`` as well; this only spares it the work.
        """
        if self._handler is None:
            raise RuntimeError("the Slack channel is not started")
        key = message.message.event_id if isinstance(message, MessageEdit) \
            else message.event_id
        async with self._handling.hold(key):
            if key in self._handled:
                log.info("Slack: %s delivered again (retry %s): already recorded, skipped",
                         key, retry or "-")
                return
            await self._handler(message)
            self._handled.add(key)

    def _translate(self, body: Mapping[str, Any]) -> InboundMessage | None:
        """The inbound message for one event, or ``None`` when it is not for the core."""
        event = body.get("event")
        if not isinstance(event, dict):
            raise Malformed("no event object")
        kind, subtype = event.get("type"), event.get("subtype")
        if kind not in ("message", "app_mention"):
            return None
        if subtype is not None and subtype not in SPOKEN_SUBTYPES:
            return None
        if event.get("bot_id") or event.get("user") == self.api.bot_user_id:
            return None
        channel, user = field_of(event, "channel", SLACK_ID), field_of(event, "user", SLACK_ID)
        ts = field_of(event, "ts", SLACK_TS)
        raw_text = event.get("text") or ""
        if not isinstance(raw_text, str):
            raise Malformed(f"text of {ts} is not a string")
        channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "")
        direct = channel_type == "im"
        thread_ts = field_of(event, "thread_ts", SLACK_TS) if event.get("thread_ts") else None
        thread = thread_ts if thread_ts != ts else None
        text, at_bot = from_slack(raw_text, self.api.bot_user_id)
        mentioned = (direct or kind == "app_mention" or at_bot
                     or (thread is not None and (channel, thread) in self.bot_threads))
        chat_type: ChatType = "direct" if direct else "group"
        return InboundMessage(
            channel=CHANNEL_NAME, chat_id=channel, chat_type=chat_type, sender_id=user,
            sender_name=sender_name(event), text=text, message_id=ts, thread_id=thread,
            mentioned=mentioned, attachments=attachments_of(event), raw=event,
            group_id=team_of(body, event), event_id=event_key(channel, ts))

    async def _on_command(self, body: dict[str, Any]) -> None:
        try:
            command, channel = field_of(body, "command"), field_of(body, "channel_id", SLACK_ID)
            user = field_of(body, "user_id", SLACK_ID)
            response_url = field_of(body, "response_url")
            if not RESPONSE_URL.fullmatch(response_url):
                raise Malformed("response_url is not an http(s) URL")
            trigger = field_of(body, "trigger_id", TRIGGER_ID) if body.get("trigger_id") else ""
            text = command_text(command, unescape(str(body.get("text") or "")).strip())
        except Exception as exc:
            log.warning("Slack: malformed slash command skipped: %s", problem_text(exc))
            return
        if parse_command(text) is None:
            # Answered in the background: bolt acks only once this returns.
            self.inflight.spawn(self._usage(response_url))
            return
        message = InboundMessage(
            channel=CHANNEL_NAME, chat_id=channel,
            chat_type="direct" if channel.startswith("D") else "group", sender_id=user,
            sender_name=str(body.get("user_name") or ""), text=text, mentioned=True, raw=body,
            group_id=team_of(body, body),
            # Slack never redelivers a command, but the inbox wants a unique key.
            event_id=f"cmd:{trigger or response_url}")
        token = SLASH_REPLY.set(SlashReply(channel, response_url))
        try:
            await self._hand_over(message)
        finally:
            SLASH_REPLY.reset(token)

    async def _usage(self, response_url: str) -> None:
        with logged("answering a slash command"):
            await self.api.respond(response_url, f"Usage: `{SLASH_COMMAND} <command> [args]`, "
                                                  f"for example `{SLASH_COMMAND} help`.")
