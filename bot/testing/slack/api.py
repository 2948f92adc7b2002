"""The Web API under ``/api/{method}``: tokens checked, faults served, messages kept."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from bot.testing.slack.faults import Faults
from bot.testing.slack.files import Files
from bot.testing.slack.interactive import Interactive, blocks_error, parsed_blocks
from bot.testing.slack.state import State
from bot.testing.slack.wire import (
    BAD_GATEWAY_PAGE,
    MAX_TEXT,
    Call,
    Failure,
    Posted,
    ResponsePost,
    reset_connection,
)


class Api:
    """The Web API methods the app calls, answered from ``state``.

    ``faults`` picks the calls that fail; ``files`` answers the file methods.
    """

    def __init__(self, state: State, faults: Faults, files: Files,
                 interactive: Interactive) -> None:
        self._state = state
        self._faults = faults
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.delete": self._delete,
            "apps.connections.open": self._connections_open,
            "conversations.info": self._conversation_info,
            "conversations.history": self._history,
            "conversations.replies": self._replies,
            "files.info": files.info,
            "files.getUploadURLExternal": files.get_upload_url,
            "files.completeUploadExternal": files.complete_upload,
            "reactions.add": interactive.reactions_add,
            "reactions.remove": interactive.reactions_remove,
        }
        """The Web API methods the fake answers, and what answers each."""

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one Web API call (``/api/{method}``)."""
        method = request.match_info["method"]
        params: dict[str, Any] = {}
        if request.can_read_body:
            if request.content_type == "application/json":
                loaded = await request.json()
                params = dict(loaded) if isinstance(loaded, dict) else {}
            else:
                params = dict((await request.post()).items())
        params.update(request.query.items())
        auth = request.headers.get("Authorization", "")
        token = str(params.pop("token", "")) or (auth[7:] if auth.startswith("Bearer ") else "")
        call = Call(method, params, token, time.perf_counter())
        self._state.calls.append(call)
        failure = self._faults.take_failure(method)
        if failure is not None and failure.kind != "status":
            self._state.injected.append((method, failure.kind))
            return await self._fault(request, call, failure)
        status, data, headers = self._answer(method, params, token, failure)
        return await self._finish(call, status, data, headers)

    async def _finish(self, call: Call, status: int, data: dict[str, Any],
                      headers: Mapping[str, str]) -> web.Response:
        call.status, call.ok = status, bool(data.get("ok"))
        call.error = str(data.get("error", ""))
        call.done = True
        await self._state.notify()
        return web.json_response(data, status=status, headers=headers)

    async def _fault(self, request: web.Request, call: Call, failure: Failure) -> web.Response:
        """Serve an injected fault the way Slack's infrastructure fails."""
        kind = failure.kind
        if kind == "502":
            call.status, call.ok, call.error, call.done = 502, False, "bad_gateway", True
            await self._state.notify()
            return web.Response(status=502, text=BAD_GATEWAY_PAGE, content_type="text/html")
        if kind == "500":
            return await self._finish(call, 500, {"ok": False, "error": "internal_error"}, {})
        if kind == "429":
            return await self._finish(call, 429, {"ok": False, "error": "ratelimited"},
                                      {"Retry-After": str(max(1, round(failure.retry_after)))})
        if kind in ("reset_before", "disconnect"):
            call.status, call.ok, call.error, call.done = 0, False, kind, True
            await self._state.notify()
            reset_connection(request, hard=kind == "reset_before")
            return web.Response(status=500)  # never written: the connection is gone
        if kind == "truncated":
            call.status, call.ok, call.error, call.done = 200, False, "truncated", True
            await self._state.notify()
            return web.Response(status=200, text='{"ok": true, "chan',
                                content_type="application/json")
        if kind == "stall":
            # The call takes effect once the stall is over, even if the
            # client gave up waiting meanwhile (as a slow Slack does).
            await asyncio.sleep(failure.stall)
        status, data, headers = self._answer(call.method, call.params, call.token, None)
        response = await self._finish(call, status, data, headers)
        if kind == "reset_after":
            call.error = "reset_after"  # took effect; the answer is lost
            reset_connection(request)
        return response

    def _answer(self, method: str, params: dict[str, Any], token: str,
                failure: Failure | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        state = self._state
        expected = state.app_token if method == "apps.connections.open" else state.bot_token
        if token != expected:
            return 200, {"ok": False, "error": "invalid_auth" if token else "not_authed"}, {}
        if failure is not None:
            headers = {"Retry-After": str(max(1, round(failure.retry_after)))} \
                if failure.status == 429 else {}
            return failure.status, {"ok": False, "error": failure.error}, headers
        handler = self._methods.get(method)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        return 200, handler(params), {}

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake Team",
                "user": "roost", "team_id": self._state.team_id, "user_id": self._state.bot_user_id,
                "bot_id": self._state.bot_id, "is_enterprise_install": False}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, text = str(params.get("channel") or ""), params.get("text")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not isinstance(text, str) or not text.strip():
            return {"ok": False, "error": "no_text"}
        if len(text) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        blocks = params.get("blocks")
        if blocks is not None and (error := blocks_error(blocks)) is not None:
            return {"ok": False, "error": error}
        ts = self._state.next_ts()
        thread_ts = params.get("thread_ts")
        metadata = params.get("metadata")
        if isinstance(metadata, str):  # form-encoded calls send it as JSON text
            with contextlib.suppress(ValueError):
                metadata = json.loads(metadata)
        posted = Posted(channel, ts, text, str(thread_ts) if thread_ts else None,
                        metadata=metadata if isinstance(metadata, dict) else None,
                        blocks=parsed_blocks(blocks))
        self._state.messages[ts] = posted
        return {"ok": True, "channel": channel, "ts": ts,
                "message": self._message_object(posted, with_metadata=False)}

    def _message_object(self, posted: Posted, *, with_metadata: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "message", "user": self._state.bot_user_id,
                                   "bot_id": self._state.bot_id, "text": posted.text,
                                   "ts": posted.ts}
        if posted.thread_ts:
            message["thread_ts"] = posted.thread_ts
        if with_metadata and posted.metadata is not None:
            message["metadata"] = posted.metadata
        return message

    def _history(self, params: dict[str, Any]) -> dict[str, Any]:
        """``conversations.history``: top-level messages after ``oldest``, newest first.

        Only the bot's own messages are known to the fake; metadata is included
        with ``include_all_metadata``, as on Slack.
        """
        channel = str(params.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        found = [m for m in self._read_back(params) if m.channel == channel and not m.thread_ts]
        return self._page(list(reversed(found)), params)

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        """``conversations.replies``: a thread's messages after ``oldest``, oldest first."""
        channel, thread = str(params.get("channel") or ""), str(params.get("ts") or "")
        if not channel or not thread:
            return {"ok": False, "error": "thread_not_found"}
        found = [m for m in self._read_back(params)
                 if m.channel == channel and (m.thread_ts == thread or m.ts == thread)]
        return self._page(found, params)

    def _read_back(self, params: dict[str, Any]) -> list[Posted]:
        oldest = float(params.get("oldest") or 0)
        return [m for m in self._state.messages.values() if not m.deleted and float(m.ts) > oldest]

    def _page(self, found: list[Posted], params: dict[str, Any]) -> dict[str, Any]:
        limit = int(params.get("limit") or 100)
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        return {"ok": True, "has_more": len(found) > limit,
                "messages": [self._message_object(m, with_metadata=with_metadata)
                             for m in found[:limit]]}

    def _find(self, params: dict[str, Any]) -> Posted | dict[str, Any]:
        posted = self._state.messages.get(str(params.get("ts") or ""))
        if posted is None or posted.deleted or posted.channel != params.get("channel"):
            return {"ok": False, "error": "message_not_found"}
        return posted

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._find(params)
        if not isinstance(found, Posted):
            return found
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            return {"ok": False, "error": "no_text"}
        if len(text) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        blocks = params.get("blocks")
        if blocks is not None and (error := blocks_error(blocks)) is not None:
            return {"ok": False, "error": error}
        found.edits.append(found.text)
        found.text = text
        if blocks is not None:
            found.blocks = parsed_blocks(blocks)
        return {"ok": True, "channel": found.channel, "ts": found.ts, "text": text}

    def _delete(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._find(params)
        if not isinstance(found, Posted):
            return found
        found.deleted = True
        return {"ok": True, "channel": found.channel, "ts": found.ts}

    def _connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        ws_url = self._state.url.replace("http://", "ws://", 1)
        return {"ok": True, "url": f"{ws_url}/socket?ticket={next(self._state.ids)}"}

    def _conversation_info(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        is_im = channel.startswith("D")
        return {"ok": True, "channel": {"id": channel, "name": "" if is_im else "general",
                                        "is_channel": channel.startswith("C"),
                                        "is_group": channel.startswith("G"), "is_im": is_im,
                                        "is_private": not channel.startswith("C")}}

    async def response_url(self, request: web.Request) -> web.Response:
        """A POST to a slash command's ``response_url``: recorded, or a scripted failure."""
        url = f"{self._state.url}{request.path}"
        failure = self._faults.take_failure("response_url")
        if failure is not None:
            headers = {"Retry-After": str(max(1, round(failure.retry_after)))} \
                if failure.status == 429 else {}
            return web.Response(status=failure.status, text=failure.error, headers=headers)
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self._state.responses.append(ResponsePost(url, body if isinstance(body, dict) else {},
                                                  time.perf_counter()))
        await self._state.notify()
        return web.Response(text="ok")
