"""The REST API under ``/api/v10``: messages, uploads, commands, interactions."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from bot.testing.discord.cdn import Cdn
from bot.testing.discord.faults import Faults
from bot.testing.discord.state import State
from bot.testing.discord.wire import (
    API_PREFIX,
    APP_ID,
    BOT_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    MAX_FILES,
    THREAD_ID,
    USER_ID,
    FakeMessage,
    Interaction,
    RestCall,
    UploadedFile,
    bot_message_payload,
    failure_response,
    json_response,
    no_content,
    not_found,
    read_multipart,
    reset_connection,
    text_channel,
    thread_channel,
    user_payload,
)


class Rest:
    """Discord's REST routes the client uses, answered from ``state``.

    Every call is recorded; ``faults`` picks the calls that fail, and ``cdn``
    stores the files of multipart uploads.
    """

    def __init__(self, state: State, faults: Faults, cdn: Cdn) -> None:
        self._state = state
        self._faults = faults
        self._cdn = cdn

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one request under ``/api/v10``."""
        self._state.serving += 1
        try:
            return await self._serve(request)
        finally:
            self._state.serving -= 1
            async with self._state.changed:
                self._state.changed.notify_all()

    async def _serve(self, request: web.Request) -> web.Response:
        path = request.path[len(API_PREFIX):]
        body: Any = None
        files: list[tuple[str, str, bytes]] | None = None
        if request.content_type == "multipart/form-data":
            body, files = await read_multipart(request)
        elif request.can_read_body:
            raw = await request.read()
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
        failure = self._faults.take_failure(request.method, path)
        kind = failure.kind if failure is not None else ""
        if failure is not None and kind != "status":
            self._state.injected.append((request.method, path, kind))
        if kind == "stall":
            # The call takes effect after the stall, even if the client gave up.
            await asyncio.sleep(failure.stall if failure is not None else 0)
        if failure is not None and kind not in ("stall", "reset_after"):
            if kind == "reset_before":
                await self._record(RestCall(request.method, path, dict(request.query), body,
                                            dict(request.headers), 0, time.monotonic()))
                reset_connection(request)
                return web.Response(status=500)  # never written: the connection is gone
            response = failure_response(failure)
        elif not self._authorized(path, request.headers.get("Authorization", "")):
            response = json_response({"message": "401: Unauthorized", "code": 0}, status=401)
        else:
            try:
                rejected = None if files is None else self._check_upload(body, files)
                response = rejected or self._route(request.method, path, request.query, body,
                                                   files or [])
            except (KeyError, TypeError, ValueError) as exc:
                response = json_response({"message": f"400: Bad Request ({exc})", "code": 50035},
                                         status=400)
        await self._record(RestCall(request.method, path, dict(request.query), body,
                                    dict(request.headers), response.status, time.monotonic()))
        if kind == "reset_after":
            reset_connection(request)  # it took effect; the answer is lost
        return response

    async def _record(self, call: RestCall) -> None:
        async with self._state.changed:
            self._state.calls.append(call)
            self._state.changed.notify_all()

    def _authorized(self, path: str, authorization: str) -> bool:
        # Interaction callbacks and webhooks are authorized by their token in the path.
        if path.startswith(("/interactions/", "/webhooks/")):
            return True
        return authorization == f"Bot {self._state.token}"

    def _route(self, method: str, path: str, query: Mapping[str, str],
               body: Any, files: Sequence[tuple[str, str, bytes]] = ()) -> web.Response:
        if method == "GET" and path == "/users/@me":
            return json_response(user_payload(BOT_ID, "testbot", bot=True))
        if method == "GET" and path == "/oauth2/applications/@me":
            return json_response(self._application())
        if method == "GET" and path in ("/gateway", "/gateway/bot"):
            return json_response(self._gateway_info(bot=path == "/gateway/bot"))
        if m := re.fullmatch(r"/channels/(\d+)/typing", path):
            return no_content()
        if m := re.fullmatch(r"/channels/(\d+)", path):
            if method != "GET":
                return not_found()
            return self._channel(int(m[1]))
        if m := re.fullmatch(r"/channels/(\d+)/messages", path):
            if method == "GET":
                return json_response(self._history(int(m[1]), query))
            if method != "POST":
                return not_found()
            data = body if isinstance(body, dict) else {}
            nonce = data.get("nonce")
            if data.get("enforce_nonce") and nonce is not None and str(nonce) in self._state.nonces:
                earlier = self._state.messages[self._state.nonces[str(nonce)]]
                return json_response(bot_message_payload(earlier))
            if not str(data.get("content") or "") and not files and not data.get("embeds"):
                return json_response({"message": "Cannot send an empty message", "code": 50006},
                                     status=400)
            msg = self._create(int(m[1]), body, files=files)
            if nonce is not None:
                self._state.nonces[str(nonce)] = msg.id
            return json_response(bot_message_payload(msg))
        if m := re.fullmatch(r"/channels/(\d+)/messages/(\d+)/reactions/([^/]+)/@me", path):
            return self._reaction(method, int(m[2]), m[3])
        if m := re.fullmatch(r"/channels/(\d+)/messages/(\d+)", path):
            return self._change(method, int(m[2]), body)
        if m := re.fullmatch(r"/applications/(\d+)/commands", path):
            if method != "PUT":
                return not_found()
            self._state.commands = [dict(c) for c in body]
            return json_response([{**c, "id": str(next(self._state.ids)),
                                   "application_id": str(APP_ID),
                                   "version": "1", "type": c.get("type", 1),
                                   "default_member_permissions": None, "nsfw": False}
                          for c in self._state.commands])
        if m := re.fullmatch(r"/interactions/(\d+)/([^/]+)/callback", path):
            return self._callback(int(m[1]), m[2], query, body)
        if m := re.fullmatch(r"/webhooks/(\d+)/([^/]+)/messages/@original", path):
            return self._original(method, m[2], body)
        if m := re.fullmatch(r"/webhooks/(\d+)/([^/]+)", path):
            if method != "POST":
                return not_found()
            interaction = self._by_token(m[2])
            if interaction is None or not interaction.acknowledged:
                return json_response({"message": "Unknown Webhook", "code": 10015},
                                     status=404)
            if int((body or {}).get("flags") or 0) & 64:
                # Ephemeral: shown to the presser alone, kept with the interaction.
                interaction.followups.append(dict(body))
                return json_response({**bot_message_payload(FakeMessage(
                    next(self._state.ids), interaction.channel_id,
                    str(body.get("content") or ""))), "flags": 64})
            msg = self._create(interaction.channel_id, body, interaction_id=interaction.id)
            if query.get("wait") in ("true", "1", "True"):
                return json_response(bot_message_payload(msg))
            return no_content()
        return not_found()

    def _channel(self, channel_id: int) -> web.Response:
        if channel_id == CHANNEL_ID:
            return json_response(text_channel())
        if channel_id == THREAD_ID:
            return json_response(thread_channel())
        if channel_id in self._state.guilds.values():
            return json_response(text_channel(channel_id, self._state.guild_of(channel_id) or 0))
        if channel_id == DM_CHANNEL_ID:
            return json_response({"id": str(DM_CHANNEL_ID), "type": 1, "last_message_id": None,
                                  "recipients": [user_payload(USER_ID, "alice")]})
        return json_response({"message": "Unknown Channel", "code": 10003}, status=404)

    def _history(self, channel_id: int, query: Mapping[str, str]) -> list[dict[str, Any]]:
        """A page of a channel's messages, as Discord serves it.

        Newest first whatever the direction; ``after`` takes the oldest
        ``limit`` messages newer than it, ``before`` (or neither) the newest
        ``limit`` older than it; both bounds are exclusive.
        """
        limit = max(1, min(100, int(query.get("limit", "50"))))
        found = [dict(data) for data in self._state.user_messages.values()
                 if int(data["channel_id"]) == channel_id]
        found += [bot_message_payload(m) for m in self._state.messages.values()
                  if m.channel_id == channel_id and not m.deleted and m.interaction_id is None]
        found.sort(key=lambda data: int(data["id"]))
        if "after" in query:
            after = int(query["after"])
            page = [d for d in found if int(d["id"]) > after][:limit]
        else:
            before = int(query["before"]) if "before" in query else None
            older = [d for d in found if before is None or int(d["id"]) < before]
            page = older[-limit:]
        return list(reversed(page))

    def _gateway_info(self, *, bot: bool) -> dict[str, Any]:
        """``GET /gateway`` (the URL) or ``/gateway/bot`` (with the recommended shards)."""
        if not bot:
            return {"url": self._state.gateway_url}
        return {"url": self._state.gateway_url, "shards": self._state.shards_required,
                "session_start_limit": {"total": 1000, "remaining": 999,
                                        "reset_after": 14_400_000, "max_concurrency": 1}}

    def _application(self) -> dict[str, Any]:
        return {"id": str(APP_ID), "name": "testbot", "description": "", "icon": None,
                "bot_public": True, "bot_require_code_grant": False, "verify_key": "00",
                "flags": 0, "owner": user_payload(USER_ID, "owner"),
                "bot": user_payload(BOT_ID, "testbot", bot=True)}

    def _create(self, channel_id: int, body: Any, *, interaction_id: int | None = None,
                files: Sequence[tuple[str, str, bytes]] = ()) -> FakeMessage:
        data = body if isinstance(body, dict) else {}
        msg = FakeMessage(id=next(self._state.ids), channel_id=channel_id,
                          content=str(data.get("content") or ""),
                          reference=data.get("message_reference"),
                          allowed_mentions=data.get("allowed_mentions"),
                          interaction_id=interaction_id,
                          components=list(data.get("components") or []))
        for filename, content_type, blob in files:
            attachment = self._cdn.attachment(blob, filename, content_type, channel_id=channel_id)
            msg.files.append(UploadedFile(filename, content_type, blob, attachment["url"]))
        self._state.messages[msg.id] = msg
        return msg

    def _check_upload(self, body: Any, files: Sequence[tuple[str, str, bytes]],
                      ) -> web.Response | None:
        """The API's answer to a multipart body it refuses, or ``None`` if it takes it."""
        if not isinstance(body, dict):
            return json_response({"message": "Invalid Form Body", "code": 50035, "errors": {
                "payload_json": {"_errors": [{"code": "DICT_TYPE_CONVERT",
                                              "message": "Only dictionaries may be used "
                                                         "in a DictType"}]}}}, status=400)
        if len(files) > MAX_FILES:
            return json_response({"message": "Invalid Form Body", "code": 50035, "errors": {
                "files": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                       "message": f"Must be {MAX_FILES} or fewer in "
                                                  "length."}]}}}, status=400)
        if sum(len(blob) for _, _, blob in files) > self._state.upload_limit:
            return json_response({"message": "Request entity too large", "code": 40005}, status=413)
        return None

    def _change(self, method: str, message_id: int, body: Any) -> web.Response:
        msg = self._state.messages.get(message_id)
        if msg is None or msg.deleted:
            return json_response({"message": "Unknown Message", "code": 10008}, status=404)
        if method == "DELETE":
            msg.deleted = True
            return no_content()
        if method == "PATCH":
            data = body or {}
            if "content" in data:
                msg.content = str(data.get("content") or "")
            if "components" in data:
                msg.components = list(data.get("components") or [])
            msg.edits.append(msg.content)
            return json_response(bot_message_payload(msg))
        return not_found()

    def _reaction(self, method: str, message_id: int, emoji: str) -> web.Response:
        """``PUT``/``DELETE .../reactions/{emoji}/@me``: the bot's own reaction."""
        msg = self._state.messages.get(message_id)
        if (msg is None or msg.deleted) and message_id not in self._state.user_messages:
            return json_response({"message": "Unknown Message", "code": 10008}, status=404)
        if not valid_emoji(emoji):
            return json_response({"message": "Unknown Emoji", "code": 10014}, status=400)
        mine = self._state.reactions.setdefault(message_id, [])
        if method == "PUT":
            if emoji not in mine:
                mine.append(emoji)
        elif method == "DELETE":
            if emoji in mine:
                mine.remove(emoji)
        else:
            return not_found()
        return no_content()

    def _callback(self, interaction_id: int, token: str, query: Mapping[str, str],
                  body: Any) -> web.Response:
        interaction = self._state.interactions.get(interaction_id)
        if interaction is None or interaction.token != token or \
                (not interaction.acknowledged
                 and time.monotonic() - interaction.created > self._state.ack_within):
            return json_response({"message": "Unknown interaction", "code": 10062}, status=404)
        if interaction.acknowledged:
            return json_response({"message": "Interaction has already been acknowledged.",
                                  "code": 40060}, status=400)
        kind = int(body.get("type", 0))
        if kind not in (1, 4, 5, 6, 7, 8, 9, 10, 12):
            return json_response({"message": "Invalid Form Body", "code": 50035},
                                 status=400)
        interaction.acknowledged = kind
        if kind == 5:
            interaction.deferred = True
        elif kind == 4:
            data = body.get("data") or {}
            self._create(interaction.channel_id, data, interaction_id=interaction.id)
        elif kind == 7 and interaction.message_id is not None:
            self._change("PATCH", interaction.message_id, body.get("data") or {})
        if query.get("with_response") in ("1", "true", "True"):
            return json_response({"interaction": {"id": str(interaction_id), "type": 2,
                                                  "response_message_loading": kind == 5,
                                                  "response_message_ephemeral": False},
                          "resource": {"type": kind}})
        return no_content()

    def _original(self, method: str, token: str, body: Any) -> web.Response:
        interaction = self._by_token(token)
        if interaction is None:
            return not_found()
        original = next((m for m in self._state.messages.values()
                         if m.interaction_id == interaction.id), None)
        if method == "PATCH":
            if original is None:
                # The deferred "thinking" message becomes the answer on its first edit.
                original = self._create(interaction.channel_id, {},
                                        interaction_id=interaction.id)
            original.content = str((body or {}).get("content") or "")
            original.edits.append(original.content)
            original.allowed_mentions = (body or {}).get("allowed_mentions")
            return json_response(bot_message_payload(original))
        if method == "DELETE":
            if original is not None:
                original.deleted = True
            interaction.deferred = False
            return no_content()
        return not_found()

    def _by_token(self, token: str) -> Interaction | None:
        return next((i for i in self._state.interactions.values() if i.token == token), None)


def valid_emoji(emoji: str) -> bool:
    """Whether Discord knows ``emoji``: a Unicode emoji, or ``name:id`` of a custom one
    (the fake knows none)."""
    return bool(emoji) and len(emoji) <= 16 and not any(c.isascii() for c in emoji)
