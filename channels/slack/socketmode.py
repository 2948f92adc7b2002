"""Socket Mode: the SDK client read defensively, frames screened, envelopes acked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from slack_bolt.response import BoltResponse
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.response import SocketModeResponse

from channels.logline import short as _short
from channels.slack.common import _problem, log


class _SocketClient(SocketModeClient):
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
                    await _ack(self, envelope_id)
                return
        # As the SDK does: listeners run in a task of their own, so a core that
        # takes its time recording one envelope does not hold up the others.
        task = asyncio.ensure_future(self.run_message_listeners(message, raw))
        self._listening.add(task)
        task.add_done_callback(self._listening.discard)


async def _ack(client: AsyncBaseSocketModeClient, envelope_id: str,
               payload: dict[str, Any] | None = None) -> None:
    """Acknowledge a Socket Mode envelope; a lost ack only means Slack sends it again."""
    try:
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=envelope_id, payload=payload))
    except Exception as exc:
        log.warning("Slack: could not ack envelope %s (%s); Slack will deliver it again",
                    envelope_id, _problem(exc))


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


def _ack_payload(response: BoltResponse) -> dict[str, Any] | None:
    """What bolt answered, as a Socket Mode ack payload (``None``: a bare ack)."""
    if response.status != 200 or not response.body:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if content_type.startswith("application/json"):
        loaded = json.loads(response.body)
        return loaded if isinstance(loaded, dict) else None
    return {"text": response.body}
