"""What Slack sends the app: events over HTTP (signed) and Socket Mode, slash commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from bot.testing.slack.faults import Faults
from bot.testing.slack.interactive import action_body
from bot.testing.slack.state import State
from bot.testing.slack.wire import ALICE, APP_ID, Delivery, SlashResult, channel_type_of, sign


class Events:
    """Events and commands built and delivered as Slack does, over HTTP and Socket Mode.

    Reads and records in ``state``; waits for acks through ``faults``.
    """

    def __init__(self, state: State, faults: Faults) -> None:
        self._state = state
        self._faults = faults

    def mention(self, text: str) -> str:
        """``text`` with the bot's ``<@U0BOT>`` mention in front."""
        return f"<@{self._state.bot_user_id}> {text}"

    def message(self, text: str, *, user: str = ALICE, channel: str | None = None,
                ts: str | None = None, thread_ts: str | None = None,
                channel_type: str | None = None, **extra: Any) -> dict[str, Any]:
        """A ``message`` event; ``channel_type`` follows the channel id (``D``… is ``im``)."""
        channel = channel or self._state.channel
        ts = ts or self._state.next_ts()
        event: dict[str, Any] = {
            "type": "message", "channel": channel, "user": user, "text": text, "ts": ts,
            "event_ts": ts, "channel_type": channel_type or channel_type_of(channel),
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        event.update(extra)
        self._state.user_messages.add((channel, ts))
        return event

    def direct_message(self, text: str, *, user: str = ALICE, **extra: Any) -> dict[str, Any]:
        """A ``message`` event in the DM channel (``channel_type: im``)."""
        return self.message(text, user=user, channel=self._state.dm_channel, **extra)

    def app_mention(self, text: str, *, user: str = ALICE, channel: str | None = None,
                    ts: str | None = None, thread_ts: str | None = None,
                    **extra: Any) -> dict[str, Any]:
        """An ``app_mention`` event (these carry no ``channel_type``)."""
        event = self.message(text, user=user, channel=channel, ts=ts, thread_ts=thread_ts,
                             **extra)
        event["type"] = "app_mention"
        del event["channel_type"]
        return event

    def bot_message(self, text: str, *, bot_id: str = "B0OTHER", channel: str | None = None,
                    **extra: Any) -> dict[str, Any]:
        """A message another bot posted (``subtype: bot_message``, ``bot_id``)."""
        event = self.message(text, channel=channel, **extra)
        del event["user"]
        event.update(subtype="bot_message", bot_id=bot_id)
        return event

    def envelope(self, event: Mapping[str, Any] | Any,
                 event_id: str | None = None) -> dict[str, Any]:
        """The ``event_callback`` body Slack wraps an event in."""
        return {
            "token": "legacy-verification-token", "team_id": self._state.team_id,
            "api_app_id": APP_ID, "event": event, "type": "event_callback",
            "event_id": event_id or self.next_event_id(), "event_time": int(time.time()),
            "authorizations": [{"team_id": self._state.team_id, "user_id": self._state.bot_user_id,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False,
        }

    def next_event_id(self) -> str:
        """A fresh event id (``Ev0000000001``)."""
        return f"Ev{next(self._state.ids):010d}"

    # -- Events API over HTTP ------------------------------------------------------

    async def post_event(self, event: Mapping[str, Any] | Any, *, event_id: str | None = None,
                         retry_num: int | None = None, retry_reason: str = "http_timeout",
                         forge: bool = False) -> Delivery:
        """Send ``event`` in an ``event_callback``; reuse ``event_id`` to redeliver.

        ``retry_num`` adds ``X-Slack-Retry-Num``/``-Reason`` as Slack does on
        redeliveries; ``forge`` signs with the wrong secret.
        """
        body = self.envelope(event, event_id)
        headers: dict[str, str] = {}
        if retry_num is not None:
            headers = {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": retry_reason}
        delivery = await self.post_body(json.dumps(body), headers=headers, forge=forge)
        return Delivery(delivery.status, delivery.body, delivery.elapsed, body["event_id"])

    async def deliver_event(self, event: Mapping[str, Any] | Any, *,
                            event_id: str | None = None, retries: int = 3,
                            answer_within: float = 3.0) -> list[Delivery]:
        """Deliver ``event`` as Slack does: again while the app fails to answer 2xx.

        An answer other than 2xx, or none within ``answer_within`` (Slack's 3 s), is
        followed by a redelivery of the same ``event_id`` with
        ``X-Slack-Retry-Num`` 1, 2, ... and ``X-Slack-Retry-Reason``
        (``http_error``/``http_timeout``), at most ``retries`` times. Returns
        every delivery; one that timed out has status 0.
        """
        body = self.envelope(event, event_id)
        raw = json.dumps(body)
        deliveries: list[Delivery] = []
        reason = ""
        for attempt in range(retries + 1):
            headers = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": reason} \
                if attempt else {}
            started = time.perf_counter()
            try:
                answer = await asyncio.wait_for(self.post_body(raw, headers=headers),
                                                answer_within)
            except TimeoutError:
                deliveries.append(Delivery(0, "", time.perf_counter() - started,
                                           body["event_id"]))
                reason = "http_timeout"
                continue
            deliveries.append(Delivery(answer.status, answer.body, answer.elapsed,
                                       body["event_id"]))
            if 200 <= answer.status < 300:
                break
            reason = "http_error"
        return deliveries

    async def url_verification(self, challenge: str = "challenge-token") -> Delivery:
        """Send the ``url_verification`` request Slack makes when the URL is configured."""
        body = {"token": "legacy-verification-token", "challenge": challenge,
                "type": "url_verification"}
        return await self.post_body(json.dumps(body))

    async def post_body(self, body: str | bytes, *, content_type: str = "application/json",
                        headers: Mapping[str, str] | None = None, forge: bool = False,
                        timestamp: int | str | None = None,
                        signature: str | None = None) -> Delivery:
        """POST raw ``body`` (signed unless ``forge``) to :attr:`events_url`.

        ``timestamp`` may be any header text (``"1.5"``, ``""``): the body is
        signed over it as given, the way a hostile client with the secret
        would. ``signature`` replaces the computed signature header.
        """
        if self._state.events_url is None or self._state.session is None:
            raise RuntimeError("set FakeSlack.events_url (and start the fake) first")
        raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        stamp = int(time.time()) if timestamp is None else timestamp
        secret = "not-" + self._state.signing_secret if forge else self._state.signing_secret
        all_headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": str(stamp),
                       "X-Slack-Signature": sign(raw, stamp, secret) if signature is None
                       else signature,
                       "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
                       **(headers or {})}
        started = time.perf_counter()
        async with self._state.session.post(self._state.events_url, data=raw,
                                            headers=all_headers) as resp:
            text = await resp.text()
            return Delivery(resp.status, text, time.perf_counter() - started)

    async def slash_command(self, text: str = "", *, command: str = "/roost", user: str = ALICE,
                            user_name: str = "alice", channel: str | None = None,
                            forge: bool = False) -> SlashResult:
        """Invoke a slash command over HTTP (form-encoded, like Slack).

        The answer must come within 3 s (Slack's limit); the app's reply then
        arrives at ``result.response_url`` (see :attr:`responses`).
        """
        form = self._slash_payload(text, command, user, user_name, channel)
        body = urllib.parse.urlencode(form)
        result = await self.post_body(body, content_type="application/x-www-form-urlencoded",
                                      forge=forge)
        return SlashResult(result.status, result.body, result.elapsed, form["response_url"])

    def _slash_payload(self, text: str, command: str, user: str, user_name: str,
                       channel: str | None) -> dict[str, str]:
        channel = channel or self._state.channel
        n = next(self._state.ids)
        return {
            "token": "legacy-verification-token", "team_id": self._state.team_id,
            "team_domain": "fake", "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user, "user_name": user_name, "command": command, "text": text,
            "api_app_id": APP_ID, "is_enterprise_install": "false",
            "response_url": f"{self._state.url}/response/{n}", "trigger_id": f"trigger.{n}",
        }

    # -- Socket Mode ---------------------------------------------------------------

    async def serve_socket(self, request: web.Request) -> web.WebSocketResponse:
        """Serve one Socket Mode connection: ``hello``, then record the app's acks."""
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._state.sockets.append(ws)
        self._state.socket_connections += 1
        await ws.send_str(json.dumps({
            "type": "hello", "num_connections": 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 3600},
            "connection_info": {"app_id": APP_ID}}))
        await self._state.notify()
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    frame = json.loads(msg.data)
                    if isinstance(frame, dict) and "envelope_id" in frame:
                        self._state.acks[str(frame["envelope_id"])] = frame
                        await self._state.notify()
        finally:
            self._state.sockets.remove(ws)
            await self._state.notify()
        return ws

    async def socket_event(self, event: Mapping[str, Any] | Any, *,
                           event_id: str | None = None,
                           retry_attempt: int | None = None) -> str:
        """Push ``event`` as an ``events_api`` envelope; returns the envelope id."""
        payload = self.envelope(event, event_id)
        frame: dict[str, Any] = {"type": "events_api", "payload": payload,
                                 "accepts_response_payload": False}
        if retry_attempt is not None:
            frame.update(retry_attempt=retry_attempt, retry_reason="timeout")
        return await self.socket_send(frame)

    async def deliver_socket_event(self, event: Mapping[str, Any] | Any, *,
                                   event_id: str | None = None, retries: int = 3,
                                   ack_timeout: float = 1.0) -> list[str]:
        """Push ``event`` and push it again while it is not acked, as Slack does.

        An envelope not acked within ``ack_timeout`` is sent again (a new
        envelope id, the same ``event_id``, ``retry_attempt`` 1, 2, ...), at most
        ``retries`` times. Returns the envelope ids sent; the last one is acked
        unless every try went unanswered (see :attr:`acks`).
        """
        payload = self.envelope(event, event_id)
        sent: list[str] = []
        for attempt in range(retries + 1):
            frame: dict[str, Any] = {"type": "events_api", "payload": payload,
                                     "accepts_response_payload": False}
            if attempt:
                frame.update(retry_attempt=attempt, retry_reason="timeout")
            envelope_id = await self.socket_send(frame)
            sent.append(envelope_id)
            try:
                await self._faults.wait_for_ack(envelope_id, limit=ack_timeout)
            except AssertionError:
                continue
            break
        return sent

    async def post_action(self, payload: Mapping[str, Any]) -> Delivery:
        """POST an interactivity payload (``block_actions``) to :attr:`events_url`,
        form-encoded and signed as Slack does; the app must answer within 3 s."""
        return await self.post_body(action_body(payload),
                                    content_type="application/x-www-form-urlencoded")

    async def socket_action(self, payload: Mapping[str, Any]) -> str:
        """Push an interactivity payload as an ``interactive`` envelope; its id."""
        return await self.socket_send({"type": "interactive", "payload": dict(payload),
                                       "accepts_response_payload": False})

    async def socket_slash_command(self, text: str = "", *, command: str = "/roost",
                                   user: str = ALICE, user_name: str = "alice",
                                   channel: str | None = None) -> tuple[str, str]:
        """Push a ``slash_commands`` envelope; returns (envelope id, response_url)."""
        payload = self._slash_payload(text, command, user, user_name, channel)
        envelope_id = await self.socket_send({"type": "slash_commands", "payload": payload,
                                              "accepts_response_payload": True})
        return envelope_id, payload["response_url"]

    async def socket_send(self, frame: dict[str, Any] | str) -> str:
        """Send a raw frame on the newest socket (an ``envelope_id`` is added to dicts)."""
        open_sockets = [ws for ws in self._state.sockets if not ws.closed]
        if not open_sockets:
            raise AssertionError("no Socket Mode connection is open")
        envelope_id = ""
        if isinstance(frame, dict):
            envelope_id = str(frame.setdefault("envelope_id", f"env-{next(self._state.ids)}"))
            frame = json.dumps(frame)
        await open_sockets[-1].send_str(frame)
        return envelope_id

    async def wait_for_socket(self, *, limit: float = 5.0) -> None:
        """Wait until a Socket Mode connection is open."""
        await self._state.wait_until(lambda: any(not ws.closed for ws in self._state.sockets),
                                     limit=limit, what="a Socket Mode connection")
