"""Socket Mode: the connection (the leader's, with replicas), frames screened, envelopes
acked once the core recorded them.

:class:`SocketMode` connects with the app token, hands each envelope to
:class:`Inbound` and acks it only once that returned; :class:`SocketClient` is
slack_sdk's client reading each frame defensively.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from bot.contracts.channel import READY, ChannelHealth, Leadership
from channels.inflight import InFlight
from channels.logline import short as _short
from channels.slack.api import SlackApi
from channels.slack.common import (
    CONNECT_TIMEOUT,
    NotRecorded,
    body_problem,
    caused_by,
    error_code,
    log,
    problem_text,
    sdk_log,
)
from channels.slack.inbound import Inbound

LEAD_RETRY = 5.0
"""Seconds between Socket Mode connect attempts of a leader whose connect failed."""
STANDBY = ChannelHealth(True, "standby: another replica holds the Socket Mode connection")
"""A follower's health: ready to send; the leader receives."""


class SocketClient(SocketModeClient):
    """slack_sdk's Socket Mode client, reading each frame defensively.

    The SDK parses a frame with ``json.loads`` and builds the request with
    ``SocketModeRequest.from_dict`` unguarded: a frame that is not JSON or
    is nested too deeply, or an envelope whose fields have the wrong types,
    is logged with a traceback and never acked, so Slack keeps sending it.
    Here such a frame costs one warning line, and an envelope that names
    its id is acked (a redelivery would be just as broken).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._listening: set[asyncio.Future[None]] = set()

    async def process_message(self) -> None:
        raw = await self.message_queue.get()
        if raw is None:
            return
        message = _socket_frame(raw)
        if message is None:
            return
        if "envelope_id" in message:
            problem = _envelope_problem(message)
            if problem:
                log.warning("Slack: Socket Mode envelope skipped: %s", problem)
                envelope_id = message["envelope_id"]
                if isinstance(envelope_id, str) and envelope_id:
                    await ack_envelope(self, envelope_id)
                return
        # As the SDK does: listeners run in a task of their own, so a core that
        # takes its time recording one envelope does not hold up the others.
        task = asyncio.ensure_future(self.run_message_listeners(message, raw))
        self._listening.add(task)
        task.add_done_callback(self._listening.discard)


async def ack_envelope(client: AsyncBaseSocketModeClient, envelope_id: str,
               payload: dict[str, Any] | None = None) -> None:
    """Acknowledge a Socket Mode envelope; a lost ack only means Slack sends it again."""
    try:
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=envelope_id, payload=payload))
    except Exception as exc:
        log.warning("Slack: could not ack envelope %s (%s); Slack will deliver it again",
                    envelope_id, problem_text(exc))


def _socket_frame(raw: str | bytes) -> dict[str, Any] | None:
    """A Socket Mode frame as a JSON object, or ``None`` (logged) if it is not one."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        log.warning("Slack: skipped a Socket Mode frame that is not JSON (%s)",
                    type(exc).__name__)
        return None
    if not isinstance(message, dict):
        log.warning("Slack: skipped a Socket Mode frame that is not a JSON object")
        return None
    return message


def _envelope_problem(message: Mapping[str, Any]) -> str | None:
    """What is wrong with a Socket Mode envelope's own fields, if anything."""
    envelope_id = message.get("envelope_id")
    if not isinstance(envelope_id, str) or not envelope_id:
        return "its envelope_id is not a string"
    if not isinstance(message.get("type"), str):
        return f"envelope {_short(envelope_id, 60)} has no type"
    if not isinstance(message.get("payload"), dict | str):
        return f"envelope {_short(envelope_id, 60)} has no payload object"
    for key, kinds in (("retry_attempt", int), ("retry_reason", str),
                       ("accepts_response_payload", bool)):
        value = message.get(key)
        if value is not None and not isinstance(value, kinds):
            return f"envelope {_short(envelope_id, 60)} has a bad {key}"
    return None


def ack_payload(response: BoltResponse) -> dict[str, Any] | None:
    """What bolt answered, as a Socket Mode ack payload (``None``: a bare ack)."""
    if response.status != 200 or not response.body:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if content_type.startswith("application/json"):
        loaded = json.loads(response.body)
        return loaded if isinstance(loaded, dict) else None
    return {"text": response.body}


class SocketMode:
    """The Socket Mode connection: envelopes to :class:`Inbound`, each acked once recorded."""

    def __init__(self, api: SlackApi, inbound: Inbound, inflight: InFlight) -> None:
        self.api = api
        self.inbound = inbound
        self.inflight = inflight
        self._socket: SocketClient | None = None
        self._standby = False
        """Replicas: another replica holds the connection."""

    def health(self) -> ChannelHealth | None:
        """The connection's health; ``None`` when there is none and this is no standby."""
        socket = self._socket
        if socket is None:
            return STANDBY if self._standby else None
        session = socket.current_session
        if socket.closed or socket.stale or session is None or session.closed:
            return ChannelHealth(False, "Socket Mode disconnected; reconnecting")
        return READY

    async def start(self, app_token: str, leadership: Leadership | None) -> None:
        """Connect now, or (replicas, ``leadership`` set) hold the connection while leading."""
        if leadership is not None:
            # Replicas: one Socket Mode connection per deployment, the leader's.
            self._standby = not leadership.is_leader
            self.inflight.spawn(self._while_leading(leadership, app_token))
            return
        await self._connect(app_token)
        log.info("Slack: connected over Socket Mode as %s", self.api.bot_user_id)

    async def close(self) -> None:
        """Close the connection, if any."""
        if self._socket is not None:
            socket, self._socket = self._socket, None
            with contextlib.suppress(Exception):
                await socket.close()  # type: ignore[no-untyped-call]  # SDK method lacks hints

    async def _while_leading(self, lead: Leadership, app_token: str) -> None:
        """Hold the Socket Mode connection while this replica leads; close it when it stops.

        Slack sends each envelope to one of an app's connections, so two replicas
        connected at once would split the events between them: only the leader
        connects. A failed connect is tried again after a pause while leading.
        """
        while self.inbound.open:
            if not lead.is_leader:
                self._standby = True
                log.info("Slack: another replica holds the Socket Mode connection")
                await lead.wait_leading()
            try:
                await self._connect(app_token)
            except Exception as exc:
                log.warning("Slack: Socket Mode connect failed while leading (%s); retrying",
                            exc)
                await asyncio.sleep(LEAD_RETRY)
                continue
            self._standby = False
            log.info("Slack: this replica leads: connected over Socket Mode as %s",
                     self.api.bot_user_id)
            await lead.wait_lost()
            socket, self._socket = self._socket, None
            if socket is not None:
                await socket.close()  # type: ignore[no-untyped-call]  # SDK method lacks hints

    async def _connect(self, app_token: str) -> None:
        web = self.api.web
        # Ask for the socket URL here: inside connect() a refused app token would
        # be retried forever instead of failing start().
        try:
            opened = await web.apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_APP_TOKEN: apps.connections.open "
                               f"answered {error_code(exc) or exc.response.status_code}") from exc
        client = SocketClient(app_token=app_token, web_client=web, logger=sdk_log)
        client.socket_mode_request_listeners.append(self._request)
        client.wss_uri = str(opened["url"])
        try:
            # The SDK's connect/close carry no type hints.
            await asyncio.wait_for(client.connect(), CONNECT_TIMEOUT)  # type: ignore[no-untyped-call]
        except BaseException:
            await client.close()  # type: ignore[no-untyped-call]
            raise
        self._socket = client

    async def _request(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        """One Socket Mode envelope: hand to bolt; ack it once the core recorded it.

        An envelope whose listener raised is not acked, so Slack delivers it
        again; a malformed one is acked (a redelivery would fail the same
        way). Nothing raises out of here: the SDK would log a traceback.
        """
        if not self.inbound.open:
            # Shutting down: unacked, Slack delivers it again later.
            log.debug("Slack: envelope %s left unacked at shutdown", req.envelope_id)
            return
        payload: dict[str, Any] | None = None
        problem = body_problem(req.payload)
        if problem:
            log.warning("Slack: Socket Mode envelope skipped: %s", problem)
        else:
            headers: dict[str, str | Sequence[str]] = {}
            if isinstance(req.retry_attempt, int):
                headers["x-slack-retry-num"] = str(req.retry_attempt)
            try:
                response = await self.inbound.dispatch(AsyncBoltRequest(
                    mode="socket_mode", body=req.payload, headers=headers))
            except Exception as exc:
                if caused_by(exc, NotRecorded):
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
            payload = ack_payload(response)
        await ack_envelope(client, req.envelope_id, payload)
