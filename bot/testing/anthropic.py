"""A local fake of the Anthropic Messages API (``POST /v1/messages``).

Drive the real ``anthropic`` SDK against it::

    async with FakeAnthropic() as fake:
        fake.reply_text("Hello there")
        fake.reply_tool_calls(ToolUse("read_file", {"path": "a.txt"}))
        client = anthropic.AsyncAnthropic(api_key="k", base_url=fake.base_url)
        ...
        assert fake.requests[0].body["messages"] == [...]

Scripted responses are served first in, first out: ``reply_text``,
``reply_tool_calls`` and ``reply`` enqueue answers (streamed as SSE when the
request asks for ``stream: true``, else one JSON message), ``fail`` enqueues an
HTTP error, ``fail_mid_stream`` an ``event: error`` after the stream started,
``drop_connection`` a stream whose socket closes mid-body.
A request that finds the queue empty gets a 400 naming the problem, so a test
that under-scripts fails loudly instead of hanging.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot.testing._server import (
    DropConnection,
    FakeServer,
    ReceivedRequest,
    drop_after,
    json_error,
    open_sse,
    split_json,
    split_words,
    sse,
)

__all__ = [
    "DropConnection",
    "FakeAnthropic",
    "HttpError",
    "ReceivedRequest",
    "Reply",
    "StreamError",
    "ToolUse",
]


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A ``tool_use`` block the fake model emits.

    ``input`` is streamed as ``input_json_delta`` fragments; pass a string to
    send raw (possibly invalid) JSON text instead of a serialised dict.
    """

    name: str
    input: Mapping[str, Any] | str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """One successful answer: text (``str``) and ``ToolUse`` blocks in order.

    A text block given as a list of strings is streamed as exactly those
    deltas; a plain string is split into word-sized deltas. ``chunk_delay``
    sleeps before every SSE event, so a test can cancel mid-stream.
    """

    blocks: Sequence[str | Sequence[str] | ToolUse]
    stop_reason: str | None = None
    input_tokens: int = 11
    output_tokens: int = 7
    chunk_delay: float = 0.0
    ping: bool = True


@dataclass(frozen=True, slots=True)
class HttpError:
    """An HTTP error answer with the API's error envelope."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamError:
    """A stream that starts fine, emits ``text_before`` (if any), then an ``event: error``."""

    error_type: str
    message: str
    text_before: str = ""


_Event = tuple[str, dict[str, Any]]

_ERROR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class FakeAnthropic(FakeServer[Reply | HttpError | StreamError]):
    """An aiohttp server on 127.0.0.1 that answers ``POST /v1/messages`` from a script.

    ``api_key``: when set, requests carrying another key (in ``X-Api-Key`` or
    ``Authorization: Bearer``) get a 401; when ``None`` any non-empty key passes.
    Requests with no key at all always get a 401.
    """

    route = "/v1/messages"

    def __init__(self, *, api_key: str | None = None, model: str = "fake-claude") -> None:
        super().__init__(api_key=api_key, model=model)

    # -- scripting ---------------------------------------------------------

    def reply(
        self,
        *blocks: str | Sequence[str] | ToolUse,
        stop_reason: str | None = None,
        input_tokens: int = 11,
        output_tokens: int = 7,
        chunk_delay: float = 0.0,
    ) -> None:
        """Enqueue an answer made of text and ``ToolUse`` blocks, in order.

        ``stop_reason`` defaults to ``tool_use`` when a tool is called, else ``end_turn``.
        """
        self.enqueue(
            Reply(
                blocks=blocks,
                stop_reason=stop_reason,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                chunk_delay=chunk_delay,
            )
        )

    def reply_text(self, text: str | Sequence[str], **kwargs: Any) -> None:
        """Enqueue a text-only answer; a list of strings fixes the exact deltas."""
        self.reply(text, **kwargs)

    def reply_tool_calls(self, *calls: ToolUse, text: str = "", **kwargs: Any) -> None:
        """Enqueue an answer calling ``calls``, optionally preceded by ``text``."""
        blocks: list[str | Sequence[str] | ToolUse] = [text] if text else []
        blocks.extend(calls)
        self.reply(*blocks, **kwargs)

    def fail(
        self,
        status: int,
        error_type: str | None = None,
        message: str = "scripted failure",
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Enqueue an HTTP error; ``error_type`` defaults to the API's type for ``status``."""
        error_type = error_type or _ERROR_STATUS.get(status, "api_error")
        self.enqueue(HttpError(status, error_type, message, dict(headers or {})))

    def fail_mid_stream(
        self,
        error_type: str = "overloaded_error",
        message: str = "Overloaded",
        *,
        text_before: str = "",
    ) -> None:
        """Enqueue a 200 stream that sends ``text_before`` then ``event: error``."""
        self.enqueue(StreamError(error_type, message, text_before))

    # -- serving -----------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        api_key = request.headers.get("X-Api-Key")
        auth = request.headers.get("Authorization", "")
        if api_key is None and auth.lower().startswith("bearer "):
            api_key = auth[7:].strip()
        body = await self._receive(request, api_key)

        if not api_key or (self.api_key is not None and api_key != self.api_key):
            return _error_response(401, "authentication_error", "invalid x-api-key")
        item = self._next_item()
        if item is None:
            return _error_response(
                400, "invalid_request_error", "FakeAnthropic: no scripted response queued"
            )
        if isinstance(item, HttpError):
            return _error_response(item.status, item.error_type, item.message, item.headers)

        stream = bool(body.get("stream"))
        if isinstance(item, DropConnection):
            return await self._drop(request, item)
        if isinstance(item, StreamError):
            if not stream:
                return _error_response(529, item.error_type, item.message)
            return await self._stream_error(request, item)
        if not stream:
            return self._json_reply(body, item)
        return await self._stream_reply(request, body, item)

    def _message_id(self) -> str:
        return f"msg_{next(self._ids):04d}"

    def _tool_id(self, tool: ToolUse) -> str:
        return tool.id or f"toolu_{next(self._ids):04d}"

    def _stop_reason(self, reply: Reply) -> str:
        if reply.stop_reason is not None:
            return reply.stop_reason
        has_tool = any(isinstance(b, ToolUse) for b in reply.blocks)
        return "tool_use" if has_tool else "end_turn"

    def _json_reply(self, body: Mapping[str, Any], reply: Reply) -> web.Response:
        content: list[dict[str, Any]] = []
        for block in reply.blocks:
            if isinstance(block, ToolUse):
                raw = block.input if isinstance(block.input, str) else json.dumps(block.input)
                content.append(
                    {
                        "type": "tool_use",
                        "id": self._tool_id(block),
                        "name": block.name,
                        "input": json.loads(raw),
                    }
                )
            else:
                text = block if isinstance(block, str) else "".join(block)
                content.append({"type": "text", "text": text})
        message = {
            "id": self._message_id(),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", self.model),
            "content": content,
            "stop_reason": self._stop_reason(reply),
            "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
        }
        return web.json_response(message)

    def _start_event(self, body: Mapping[str, Any], input_tokens: int) -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                "id": self._message_id(),
                "type": "message",
                "role": "assistant",
                "model": body.get("model", self.model),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            },
        }

    async def _stream_reply(
        self, request: web.Request, body: Mapping[str, Any], reply: Reply
    ) -> web.StreamResponse:
        response = await open_sse(request)
        events: list[_Event] = [("message_start", self._start_event(body, reply.input_tokens))]
        if reply.ping:
            events.append(("ping", {"type": "ping"}))
        for index, block in enumerate(reply.blocks):
            events.extend(self._block_events(index, block))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason(reply), "stop_sequence": None},
                    "usage": {"output_tokens": reply.output_tokens},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        await self._send(response, _frames(events), reply.chunk_delay)
        return response

    def _block_events(self, index: int, block: str | Sequence[str] | ToolUse) -> list[_Event]:
        events: list[_Event] = []
        if isinstance(block, ToolUse):
            start = {
                "type": "tool_use",
                "id": self._tool_id(block),
                "name": block.name,
                "input": {},
            }
            raw = block.input if isinstance(block.input, str) else json.dumps(block.input)
            pieces = split_json(raw, 7) or [""]
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
        else:
            start = {"type": "text", "text": ""}
            pieces = split_words(block) if isinstance(block, str) else list(block)
            deltas = [{"type": "text_delta", "text": p} for p in pieces]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        for delta in deltas:
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return events

    def _opening(self, text_before: str) -> list[_Event]:
        """A stream's start, with ``text_before`` in an unfinished text block."""
        events: list[_Event] = [("message_start", self._start_event({}, 5))]
        if text_before:
            events.extend(self._block_events(0, [text_before])[:-1])
        return events

    async def _stream_error(self, request: web.Request, item: StreamError) -> web.StreamResponse:
        response = await open_sse(request)
        events = self._opening(item.text_before)
        events.append(
            (
                "error",
                {"type": "error", "error": {"type": item.error_type, "message": item.message}},
            )
        )
        await self._send(response, _frames(events), 0.0)
        return response

    async def _drop(self, request: web.Request, item: DropConnection) -> web.StreamResponse:
        return await drop_after(request, _frames(self._opening(item.text_before)))


def _frames(events: list[_Event]) -> list[bytes]:
    return [sse(data, name) for name, data in events]


def _error_response(
    status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    payload = {"type": "error", "error": {"type": error_type, "message": message}}
    return json_error(status, payload, headers)
