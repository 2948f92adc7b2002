"""Deliveries into the core: the Events API and Socket Mode through bolt, slash commands."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest

from bot.contracts.channel import Leadership
from bot.contracts.commands import parse_command
from bot.contracts.messages import ChatType, InboundMessage
from bot.resilience.listener import Limits, Listener
from channels.logline import short as _short
from channels.slack.base import _SlackBase
from channels.slack.common import (
    _RESPONSE_URL,
    _SIGNATURE,
    _SLACK_ID,
    _SLACK_TS,
    _SLASH,
    _SPOKEN_SUBTYPES,
    _TIMESTAMP,
    _TRIGGER_ID,
    CONNECT_TIMEOUT,
    EVENTS_PATH,
    SLASH_COMMAND,
    _caused_by,
    _command_text,
    _describe,
    _error_code,
    _event_key,
    _field,
    _header,
    _logged,
    _Malformed,
    _malformed,
    _NotRecorded,
    _problem,
    _sdk_log,
    _sender_name,
    _SlashReply,
    _team,
    log,
)
from channels.slack.media import _attachments
from channels.slack.socketmode import _ack, _ack_payload, _SocketClient
from channels.slack_format import from_slack, unescape

LEAD_RETRY = 5.0
"""Seconds between Socket Mode connect attempts of a leader whose connect failed."""


class _Inbound(_SlackBase):
    """Events and slash commands, acknowledged once the core recorded them."""

    def _build_app(self, secret: str, *, socket_mode: bool) -> AsyncApp:
        app = AsyncApp(client=self._web, signing_secret=secret, name="roost",
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
                await self._on_event(body, _header(request, "x-slack-retry-num"))
            except Exception as exc:
                raise _NotRecorded(str(exc)) from exc

        async def on_command(ack: AsyncAck, body: dict[str, Any]) -> None:
            # The core only records the command before returning, well inside
            # Slack's 3 s; the reply follows via response_url. If recording
            # failed, bolt answers 500 and Slack tells the user it failed.
            try:
                await self._on_command(body)
            except Exception as exc:
                raise _NotRecorded(str(exc)) from exc
            await ack()

        # One catch-all listener each, so every event is acked (an unhandled one
        # would get a 404 and be redelivered) and routed in one place.
        app.event(re.compile(".*"))(on_event)
        app.command(re.compile(".*"))(on_command)
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
        if isinstance(error, _NotRecorded):
            log.error("Slack: the core did not record a delivery; Slack will deliver it "
                      "again", exc_info=error.__cause__ or error)
            return None
        if isinstance(error, BoltUnhandledRequestError):
            log.warning("Slack: skipped a request nothing handles (%s)",
                        _describe(request.body))
        else:
            log.warning("Slack: skipped a malformed request (%s: %s)", type(error).__name__,
                        _short(error))
        return BoltResponse(status=200, body="")

    async def _listen_http(self, secret: str) -> None:
        self._verifier = SignatureVerifier(secret)
        shared = self.http_routes
        if shared is not None and shared.port == self.settings.slack_port:
            # slack_port is Roost's own HTTP port: the endpoint is mounted on that server.
            shared.add_post(EVENTS_PATH, self._http_request)
            self._shared = shared
            self.port = shared.port
            return
        listener = Listener(self.host, self.settings.slack_port,
                            Limits.from_settings(self.settings), name="Slack events")
        listener.app.router.add_post(EVENTS_PATH, self._http_request)
        await listener.start()
        self._listener = listener
        self.port = listener.port

    async def _socket_while_leading(self, lead: Leadership, app_token: str) -> None:
        """Hold the Socket Mode connection while this replica leads; close it when it stops.

        Slack sends each envelope to one of an app's connections, so two replicas
        connected at once would split the events between them: only the leader
        connects. A failed connect is tried again after a pause while leading.
        """
        while self._intake_open:
            if not lead.is_leader:
                self._standby = True
                log.info("Slack: another replica holds the Socket Mode connection")
                await lead.wait_leading()
            try:
                await self._connect_socket(app_token)
            except Exception as exc:
                log.warning("Slack: Socket Mode connect failed while leading (%s); retrying",
                            exc)
                await asyncio.sleep(LEAD_RETRY)
                continue
            self._standby = False
            log.info("Slack: this replica leads: connected over Socket Mode as %s",
                     self.bot_user_id)
            await lead.wait_lost()
            socket, self._socket = self._socket, None
            if socket is not None:
                await socket.close()  # type: ignore[no-untyped-call]  # SDK method lacks hints

    async def _connect_socket(self, app_token: str) -> None:
        assert self._web is not None
        # Ask for the socket URL here: inside connect() a refused app token would
        # be retried forever instead of failing start().
        try:
            opened = await self._web.apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_APP_TOKEN: apps.connections.open "
                               f"answered {_error_code(exc) or exc.response.status_code}") from exc
        client = _SocketClient(app_token=app_token, web_client=self._web, logger=_sdk_log)
        client.socket_mode_request_listeners.append(self._socket_request)
        client.wss_uri = str(opened["url"])
        try:
            # The SDK's connect/close carry no type hints.
            await asyncio.wait_for(client.connect(), CONNECT_TIMEOUT)  # type: ignore[no-untyped-call]
        except BaseException:
            await client.close()  # type: ignore[no-untyped-call]
            raise
        self._socket = client

    # -- inbound -----------------------------------------------------------------

    async def _http_request(self, request: web.Request) -> web.StreamResponse:
        """One Events API request: verify, screen, hand to bolt."""
        assert self._app is not None and self._verifier is not None
        if not self._intake_open:
            # Shutting down: Slack retries a 5xx later, when Roost is back.
            return web.Response(status=503, text="shutting down")
        raw = await request.read()
        # Bolt parses the body before verifying it and answers junk with a 500
        # and a traceback, so unsigned requests are refused here first.
        if not self._signed(raw, request.headers.get("X-Slack-Request-Timestamp"),
                            request.headers.get("X-Slack-Signature")):
            # Anyone can send these: one line a minute at most, so they cannot flood the log.
            skipped = self._refusals.ready()
            if skipped is not None:
                log.warning("Slack: refused a request with a bad signature from %s%s",
                            request.remote, f" ({skipped} more since the last such line)"
                            if skipped else "")
            return web.Response(status=401, text="invalid signature")
        try:
            bolt_request = AsyncBoltRequest(
                body=raw.decode("utf-8", errors="replace"), query=request.query_string,
                headers={k.lower(): request.headers.getall(k) for k in request.headers})
            problem = _malformed(bolt_request.body)
        except Exception as exc:
            # Bolt reads ids out of the body while building the request.
            problem = f"unparseable body ({type(exc).__name__}: {_short(exc)})"
        if problem:
            log.warning("Slack: request skipped: %s", problem)
            return web.Response(status=200)
        try:
            response = await self._app.async_dispatch(bolt_request)
        except Exception as exc:
            if _caused_by(exc, _NotRecorded):
                # Nothing was recorded: a 5xx makes Slack deliver it again.
                log.exception("Slack: the core did not record a request; answered 500 so "
                              "Slack retries it")
                return web.Response(status=500, text="not recorded")
            # Bolt itself choked on the payload: a redelivery would too.
            log.warning("Slack: malformed request skipped (%s: %s)", type(exc).__name__,
                        _short(exc))
            return web.Response(status=200)
        # A 5xx from bolt means the core did not record the event (the listener
        # raised): it goes back to Slack as is, and Slack redelivers.
        return await to_aiohttp_response(response)

    def _signed(self, body: bytes, timestamp: str | None, signature: str | None) -> bool:
        """Whether the request carries Slack's valid, fresh signature."""
        assert self._verifier is not None
        if (timestamp is None or signature is None or not _TIMESTAMP.fullmatch(timestamp)
                or not _SIGNATURE.fullmatch(signature)):
            return False
        try:
            return self._verifier.is_valid(body, timestamp, signature)
        except (TypeError, ValueError):  # the SDK's own parsing; refused all the same
            return False

    async def _socket_request(self, client: AsyncBaseSocketModeClient,
                              req: SocketModeRequest) -> None:
        """One Socket Mode envelope: hand to bolt; ack it once the core recorded it.

        An envelope whose listener raised is not acked, so Slack delivers it
        again; a malformed one is acked (a redelivery would fail the same
        way). Nothing raises out of here: the SDK would log a traceback.
        """
        assert self._app is not None
        if not self._intake_open:
            # Shutting down: unacked, Slack delivers it again later.
            log.debug("Slack: envelope %s left unacked at shutdown", req.envelope_id)
            return
        payload: dict[str, Any] | None = None
        problem = _malformed(req.payload)
        if problem:
            log.warning("Slack: Socket Mode envelope skipped: %s", problem)
        else:
            headers: dict[str, str | Sequence[str]] = {}
            if isinstance(req.retry_attempt, int):
                headers["x-slack-retry-num"] = str(req.retry_attempt)
            try:
                response = await self._app.async_dispatch(AsyncBoltRequest(
                    mode="socket_mode", body=req.payload, headers=headers))
            except Exception as exc:
                if _caused_by(exc, _NotRecorded):
                    log.exception("Slack: the core did not record envelope %s; not acked, "
                                  "so Slack delivers it again", req.envelope_id)
                    return
                # Bolt reads ids out of the body while building the request, and
                # a redelivery would fail the same way.
                log.warning("Slack: malformed Socket Mode envelope skipped (%s: %s)",
                            type(exc).__name__, _short(exc))
                response = BoltResponse(status=200, body="")
            if response.status >= 500:
                log.warning("Slack: envelope %s was not recorded; not acked, so Slack "
                            "delivers it again", req.envelope_id)
                return
            payload = _ack_payload(response)
        await _ack(client, req.envelope_id, payload)

    async def _on_event(self, body: dict[str, Any], retry: str | None) -> None:
        try:
            message = self._translate(body)
        except Exception as exc:
            # Whatever the payload holds (a list where a string belongs, an
            # unexpected shape), a redelivery would fail the same way: skip it.
            log.warning("Slack: malformed event skipped: %s", _problem(exc))
            return
        if message is not None:
            await self._hand_over(message, retry)

    async def _hand_over(self, message: InboundMessage, retry: str | None = None) -> None:
        """Give ``message`` to the core unless the core already recorded its key.

        The ``message`` and ``app_mention`` events of one post share a key, so
        whichever comes second (or a retry of either) waits for the first and
        is skipped once the core has it. A key is remembered only after the
        handler returned: if it raised, the redelivery is handed over again.
        The core dedupes on ``event_id`` as well; this only spares it the work.
        """
        if self._handler is None:
            raise RuntimeError("the Slack channel is not started")
        key = message.event_id
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
            raise _Malformed("no event object")
        kind, subtype = event.get("type"), event.get("subtype")
        if kind not in ("message", "app_mention"):
            return None
        if subtype is not None and subtype not in _SPOKEN_SUBTYPES:
            return None
        if event.get("bot_id") or event.get("user") == self.bot_user_id:
            return None
        channel, user = _field(event, "channel", _SLACK_ID), _field(event, "user", _SLACK_ID)
        ts = _field(event, "ts", _SLACK_TS)
        raw_text = event.get("text") or ""
        if not isinstance(raw_text, str):
            raise _Malformed(f"text of {ts} is not a string")
        channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "")
        direct = channel_type == "im"
        thread_ts = _field(event, "thread_ts", _SLACK_TS) if event.get("thread_ts") else None
        thread = thread_ts if thread_ts != ts else None
        text, at_bot = from_slack(raw_text, self.bot_user_id)
        mentioned = (direct or kind == "app_mention" or at_bot
                     or (thread is not None and (channel, thread) in self._bot_threads))
        chat_type: ChatType = "direct" if direct else "group"
        return InboundMessage(
            channel=self.name, chat_id=channel, chat_type=chat_type, sender_id=user,
            sender_name=_sender_name(event), text=text, message_id=ts, thread_id=thread,
            mentioned=mentioned, attachments=_attachments(event), raw=event,
            group_id=_team(body, event), event_id=_event_key(channel, ts))

    async def _on_command(self, body: dict[str, Any]) -> None:
        try:
            command, channel = _field(body, "command"), _field(body, "channel_id", _SLACK_ID)
            user = _field(body, "user_id", _SLACK_ID)
            response_url = _field(body, "response_url")
            if not _RESPONSE_URL.fullmatch(response_url):
                raise _Malformed("response_url is not an http(s) URL")
            trigger = _field(body, "trigger_id", _TRIGGER_ID) if body.get("trigger_id") else ""
            text = _command_text(command, unescape(str(body.get("text") or "")).strip())
        except Exception as exc:
            log.warning("Slack: malformed slash command skipped: %s", _problem(exc))
            return
        if parse_command(text) is None:
            # Answered in the background: bolt acks only once this returns.
            self._spawn(self._usage(response_url))
            return
        message = InboundMessage(
            channel=self.name, chat_id=channel,
            chat_type="direct" if channel.startswith("D") else "group", sender_id=user,
            sender_name=str(body.get("user_name") or ""), text=text, mentioned=True, raw=body,
            group_id=_team(body, body),
            # Slack never redelivers a command, but the inbox wants a unique key.
            event_id=f"cmd:{trigger or response_url}")
        token = _SLASH.set(_SlashReply(channel, response_url))
        try:
            await self._hand_over(message)
        finally:
            _SLASH.reset(token)

    async def _usage(self, response_url: str) -> None:
        with _logged("answering a slash command"):
            await self._respond(response_url, f"Usage: `{SLASH_COMMAND} <command> [args]`, "
                                              f"for example `{SLASH_COMMAND} help`.")
