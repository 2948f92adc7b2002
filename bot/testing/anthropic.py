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
A request that finds the queue empty gets ``reply_always``'s answer if one was
set, else a 400 naming the problem, so a test that under-scripts fails loudly
instead of hanging.

Like the real API it validates the transcript first (see
:func:`transcript_error`) and answers 400 ``invalid_request_error`` to a
malformed one, so a code path that builds an invalid history fails its test.
Prompt caching is accounted as the real API documents it
(:mod:`bot.testing.anthropic_cache`): ``usage`` carries ``cache_read_input_tokens``
and ``cache_creation_input_tokens`` (also in the stream's ``message_start``),
``input_tokens`` counts the rest, more than 4 ``cache_control`` blocks get a 400,
and :attr:`FakeAnthropic.cache` (with its injectable clock) holds the entries.
Input tokens are estimated from the request unless a reply scripts them.
Faults are injected per test through :attr:`FakeAnthropic.faults` (a share of
calls failing with 529, 500, 429 + ``retry-after`` or a stream cut after a few
deltas, and an outage mode where every call gets 529); these come before the
script, so a failed call leaves its scripted answer for the retry.
:attr:`FakeAnthropic.arrivals` holds each request's arrival time (on
:func:`time.monotonic`, the event loop's clock) for counting request rates.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

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
    "FAULT_KINDS",
    "DropConnection",
    "FakeAnthropic",
    "FaultKind",
    "FaultPlan",
    "HttpError",
    "ReceivedRequest",
    "Reply",
    "StreamError",
    "ToolUse",
    "busiest",
    "media_error",
    "transcript_error",
]
from bot.testing.anthropic_cache import CacheUsage, PromptCache
from bot.testing.anthropic_checks import cache_control_error, media_error, transcript_error
from bot.testing.anthropic_script import (
    FAULT_KINDS,
    FaultKind,
    FaultPlan,
    HttpError,
    Reply,
    StreamError,
    ToolUse,
    busiest,
)

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

    def __init__(self, *, api_key: str | None = None, model: str = "fake-claude",
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(api_key=api_key, model=model)
        self.cache = PromptCache(clock)
        """The prompt cache; ``clock`` (seconds) decides when its entries expire."""
        self.cache_usage: list[CacheUsage] = []
        """How each answered request's input split into cache reads, writes and the rest."""
        self.faults = FaultPlan()
        """Faults to inject, checked before the script on every valid request."""
        self.arrivals: list[float] = []
        """When each recorded request arrived (:func:`time.monotonic`), as :attr:`requests`."""
        self.default_reply: Reply | None = None
        """Served when the script is empty; set with :meth:`reply_always`."""

    # -- scripting ---------------------------------------------------------

    def reply(
        self,
        *blocks: str | Sequence[str] | ToolUse,
        stop_reason: str | None = None,
        input_tokens: int | None = None,
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

    def reply_always(
        self, *blocks: str | Sequence[str] | ToolUse, chunk_delay: float = 0.0
    ) -> None:
        """Answer every request the script does not cover with these blocks."""
        self.default_reply = Reply(blocks=blocks, chunk_delay=chunk_delay)

    def busiest(self, window: float, *, since: float = float("-inf")) -> int:
        """The most requests that arrived within any ``window`` seconds after ``since``."""
        return busiest([at for at in self.arrivals if at >= since], window)

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

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        body = await super()._receive(request, api_key)
        self.arrivals.append(time.monotonic())
        return body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        api_key = request.headers.get("X-Api-Key")
        auth = request.headers.get("Authorization", "")
        if api_key is None and auth.lower().startswith("bearer "):
            api_key = auth[7:].strip()
        body = await self._receive(request, api_key)

        if not api_key or (self.api_key is not None and api_key != self.api_key):
            return _error_response(401, "authentication_error", "invalid x-api-key")
        problem = transcript_error(body) or media_error(body) or cache_control_error(body)
        if problem is not None:
            return _error_response(400, "invalid_request_error", problem)
        stream = bool(body.get("stream"))
        fault = self.faults.draw()
        if fault is not None:
            return await self._inject(request, body, fault, stream)
        item = self._next_item()
        if item is None:
            item = self.default_reply
        if item is None:
            return _error_response(
                400, "invalid_request_error", "FakeAnthropic: no scripted response queued"
            )
        if isinstance(item, HttpError):
            return _error_response(item.status, item.error_type, item.message, item.headers)

        if isinstance(item, DropConnection):
            return await self._drop(request, item)
        if isinstance(item, StreamError):
            if not stream:
                return _error_response(529, item.error_type, item.message)
            return await self._stream_error(request, item)
        usage = self._account(body, item)
        if not stream:
            return self._json_reply(body, item, usage)
        return await self._stream_reply(request, body, item, usage)

    def _account(self, body: Mapping[str, Any], reply: Reply) -> dict[str, int]:
        """The answer's input ``usage``, with the prompt cache read and written."""
        split = self.cache.account(body)
        self.cache_usage.append(split)
        uncached = split.uncached if reply.input_tokens is None else reply.input_tokens
        return {"input_tokens": uncached, "cache_creation_input_tokens": split.written,
                "cache_read_input_tokens": split.read}

    def _message_id(self) -> str:
        return f"msg_{next(self._ids):04d}"

    def _tool_id(self, tool: ToolUse) -> str:
        return tool.id or f"toolu_{next(self._ids):04d}"

    def _stop_reason(self, reply: Reply) -> str:
        if reply.stop_reason is not None:
            return reply.stop_reason
        has_tool = any(isinstance(b, ToolUse) for b in reply.blocks)
        return "tool_use" if has_tool else "end_turn"

    def _json_reply(self, body: Mapping[str, Any], reply: Reply,
                    usage: Mapping[str, int]) -> web.Response:
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
            "usage": {**usage, "output_tokens": reply.output_tokens},
        }
        return web.json_response(message)

    def _start_event(self, body: Mapping[str, Any], usage: Mapping[str, int]) -> dict[str, Any]:
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
                "usage": {**usage, "output_tokens": 1},
            },
        }

    async def _inject(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        fault: FaultKind | Literal["outage"],
        stream: bool,
    ) -> web.StreamResponse:
        if fault in ("outage", "overloaded"):
            return _error_response(529, "overloaded_error", "Overloaded")
        if fault == "server_error":
            return _error_response(500, "api_error", "Internal server error")
        if fault == "rate_limit":
            # The real API sends whole seconds; tests may use fractions.
            wait = f"{self.faults.retry_after:g}"
            message = "Number of request tokens has exceeded your per-minute rate limit"
            return _error_response(429, "rate_limit_error", message, {"retry-after": wait})
        if not stream:
            return await drop_after(request, [])
        # The network cuts what the model was about to say: the answer the
        # script holds for the retry, cut after a few deltas, no error event.
        # An empty script leaves _next_item to a subclass that computes its
        # answers from the request; the base class then consumes nothing.
        head = self._script[0] if self._script else self._next_item()
        reply = head if isinstance(head, Reply) else self.default_reply
        reply = reply or Reply(blocks=("An answer cut short",))
        # Cut before the answer finished: nothing is cached, the input estimated.
        events = self._reply_events(body, reply, {
            "input_tokens": reply.input_tokens if reply.input_tokens is not None
            else self.cache.estimate(body)})
        kept: list[_Event] = []
        deltas = 0
        for name, data in events[:-2]:
            if name == "content_block_delta" and deltas >= self.faults.cut_after:
                break
            deltas += name == "content_block_delta"
            kept.append((name, data))
        return await drop_after(request, _frames(kept))

    def _reply_events(self, body: Mapping[str, Any], reply: Reply,
                      usage: Mapping[str, int]) -> list[_Event]:
        events: list[_Event] = [("message_start", self._start_event(body, usage))]
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
        return events

    async def _stream_reply(
        self, request: web.Request, body: Mapping[str, Any], reply: Reply,
        usage: Mapping[str, int],
    ) -> web.StreamResponse:
        response = await open_sse(request)
        await self._send(response, _frames(self._reply_events(body, reply, usage)),
                         reply.chunk_delay)
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
        events: list[_Event] = [("message_start", self._start_event({}, {"input_tokens": 5}))]
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
    payload = {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": f"req_fake{random.getrandbits(40):010x}",
    }
    return json_error(status, payload, headers)
