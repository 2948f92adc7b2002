"""A local fake of an OpenAI-compatible Chat Completions server.

Drive the real ``openai`` SDK against it::

    async with FakeOpenAI() as fake:
        fake.reply_text("Hello there")
        fake.reply_tool_calls(FunctionCall("read_file", {"path": "a.txt"}))
        client = openai.AsyncOpenAI(api_key="k", base_url=fake.base_url)
        ...
        assert fake.requests[0].body["messages"] == [...]

It serves ``POST /v1/chat/completions`` (``base_url`` already ends in ``/v1``,
as the SDK expects). Scripted responses are served first in, first out:
``reply_text``, ``reply_tool_calls`` and ``reply`` enqueue answers (streamed as
``data:`` chunks ending in ``data: [DONE]`` when ``stream`` is true, else one
JSON object), ``fail`` enqueues an HTTP error, ``fail_mid_stream`` an error
object inside the stream, ``drop_connection`` a stream whose socket closes.
A request that finds the queue empty gets ``reply_always``'s answer if one was
set, else a 400 naming the problem.

Like OpenAI it validates the transcript first (:mod:`bot.testing.openai_checks`)
and answers 400 ``invalid_request_error`` to a malformed one. Faults are
injected per test through :attr:`FakeOpenAI.faults`, the same
:class:`~bot.testing.anthropic.FaultPlan` the Anthropic fake uses (overload
here is OpenAI's 503), and :attr:`FakeOpenAI.arrivals` holds each request's
arrival time on :func:`time.monotonic`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from bot.testing.anthropic_script import FaultKind, FaultPlan, busiest
from bot.testing.openai_checks import content_error, transcript_error

__all__ = [
    "DropConnection",
    "FakeOpenAI",
    "FaultPlan",
    "FunctionCall",
    "HttpError",
    "ReceivedRequest",
    "Reply",
    "StreamError",
    "content_error",
    "transcript_error",
]


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A function tool call the fake model emits.

    ``arguments`` is serialised and streamed in small fragments; pass a string
    to send raw (possibly invalid) JSON text.
    """

    name: str
    arguments: Mapping[str, Any] | str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """One successful answer: optional text, then tool calls.

    Text given as a list of strings is streamed as exactly those deltas; a
    plain string is split into word-sized deltas. ``chunk_delay`` sleeps before
    every chunk, so a test can cancel mid-stream.
    """

    text: str | Sequence[str] = ""
    tool_calls: Sequence[FunctionCall] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 13
    completion_tokens: int = 8
    chunk_delay: float = 0.0


@dataclass(frozen=True, slots=True)
class HttpError:
    """An HTTP error answer with OpenAI's ``{"error": {...}}`` envelope."""

    status: int
    message: str
    error_type: str
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamError:
    """A 200 stream that emits ``text_before`` (if any), then ``data: {"error": ...}``."""

    message: str
    error_type: str = "server_error"
    code: str | None = None
    text_before: str = ""


_DONE = b"data: [DONE]\n\n"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}


class FakeOpenAI(FakeServer[Reply | HttpError | StreamError]):
    """An aiohttp server on 127.0.0.1 that answers ``POST /v1/chat/completions`` from a script.

    ``api_key``: when set, requests carrying another key (``Authorization:
    Bearer`` or ``X-Api-Key``) get a 401; when ``None`` any key, or none, passes
    (local servers such as Ollama ignore keys).
    """

    route = "/v1/chat/completions"
    url_suffix = "/v1"

    def __init__(self, *, api_key: str | None = None, model: str = "fake-gpt") -> None:
        super().__init__(api_key=api_key, model=model)
        self.faults = FaultPlan()
        """Faults to inject, checked before the script on every valid request."""
        self.arrivals: list[float] = []
        """When each recorded request arrived (:func:`time.monotonic`), as :attr:`requests`."""
        self.default_reply: Reply | None = None
        """Served when the script is empty; set with :meth:`reply_always`."""

    # -- scripting ---------------------------------------------------------

    def reply(
        self,
        text: str | Sequence[str] = "",
        tool_calls: Sequence[FunctionCall] = (),
        *,
        finish_reason: str | None = None,
        prompt_tokens: int = 13,
        completion_tokens: int = 8,
        chunk_delay: float = 0.0,
    ) -> None:
        """Enqueue an answer: text, then tool calls.

        ``finish_reason`` defaults to ``tool_calls`` when a tool is called, else ``stop``.
        """
        self.enqueue(
            Reply(
                text=text,
                tool_calls=tuple(tool_calls),
                finish_reason=finish_reason,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                chunk_delay=chunk_delay,
            )
        )

    def reply_always(self, text: str | Sequence[str], *, chunk_delay: float = 0.0) -> None:
        """Answer every request the script does not cover with ``text``."""
        self.default_reply = Reply(text=text, chunk_delay=chunk_delay)

    def busiest(self, window: float, *, since: float = float("-inf")) -> int:
        """The most requests that arrived within any ``window`` seconds after ``since``."""
        return busiest([at for at in self.arrivals if at >= since], window)

    def reply_text(self, text: str | Sequence[str], **kwargs: Any) -> None:
        """Enqueue a text-only answer; a list of strings fixes the exact deltas."""
        self.reply(text, **kwargs)

    def reply_tool_calls(self, *calls: FunctionCall, text: str = "", **kwargs: Any) -> None:
        """Enqueue an answer calling ``calls``, optionally preceded by ``text``."""
        self.reply(text, calls, **kwargs)

    def fail(
        self,
        status: int,
        message: str = "scripted failure",
        *,
        error_type: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Enqueue an HTTP error; ``error_type`` defaults to OpenAI's type for ``status``."""
        error_type = error_type or _ERROR_TYPES.get(status, "server_error")
        self.enqueue(HttpError(status, message, error_type, code, dict(headers or {})))

    def fail_mid_stream(
        self,
        message: str = "scripted stream failure",
        *,
        error_type: str = "server_error",
        code: str | None = None,
        text_before: str = "",
    ) -> None:
        """Enqueue a 200 stream that sends ``text_before`` then an error object."""
        self.enqueue(StreamError(message, error_type, code, text_before))

    # -- serving -----------------------------------------------------------

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        body = await super()._receive(request, api_key)
        self.arrivals.append(time.monotonic())
        return body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        api_key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        api_key = api_key or request.headers.get("X-Api-Key")
        body = await self._receive(request, api_key)

        if self.api_key is not None and api_key != self.api_key:
            return _error_response(
                401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"
            )
        problem = transcript_error(body) or content_error(body)
        if problem is not None:
            message, param, code = problem
            return _error_response(400, message, "invalid_request_error", code, param=param)
        fault = self.faults.draw()
        if fault is not None:
            return await self._inject(request, body, fault)
        item = self._next_item()
        if item is None:
            item = self.default_reply
        if item is None:
            return _error_response(
                400, "FakeOpenAI: no scripted response queued", "invalid_request_error"
            )
        if isinstance(item, HttpError):
            return _error_response(
                item.status, item.message, item.error_type, item.code, item.headers
            )

        model = str(body.get("model", self.model))
        if not body.get("stream"):
            if isinstance(item, Reply):
                return self._json_reply(model, item)
            return _error_response(500, "stream failure outside a stream", "server_error")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk_id = f"chatcmpl-{next(self._ids):04d}"
        if isinstance(item, DropConnection):
            chunks = self._text_chunks(chunk_id, model, item.text_before)
            return await drop_after(request, _frames(chunks))
        response = await open_sse(request)
        if isinstance(item, Reply):
            chunks = self._reply_chunks(chunk_id, model, item, include_usage)
            await self._send(response, _frames(chunks), item.chunk_delay, trailer=_DONE)
        else:
            chunks = self._text_chunks(chunk_id, model, item.text_before)
            error = {
                "message": item.message,
                "type": item.error_type,
                "param": None,
                "code": item.code,
            }
            chunks.append({"error": error})
            # No [DONE]: a server that hits an error ends the stream there.
            await self._send(response, _frames(chunks), 0.0)
        return response

    async def _inject(
        self, request: web.Request, body: Mapping[str, Any], fault: FaultKind | Literal["outage"]
    ) -> web.StreamResponse:
        if fault in ("outage", "overloaded"):
            # OpenAI's overload answer; it has no 529.
            message = "The server is overloaded or not ready yet."
            return _error_response(503, message, "server_error")
        if fault == "server_error":
            message = "The server had an error while processing your request. Sorry about that!"
            return _error_response(500, message, "server_error")
        if fault == "rate_limit":
            wait = f"{self.faults.retry_after:g}"
            message = "Rate limit reached for requests. Please try again later."
            return _error_response(
                429, message, "requests", "rate_limit_exceeded", {"retry-after": wait}
            )
        if not body.get("stream"):
            return await drop_after(request, [])
        # The network cuts what the model was about to say: the answer the
        # script holds for the retry, cut after a few deltas, no error object.
        # An empty script leaves _next_item to a subclass that computes its
        # answers from the request; the base class then consumes nothing.
        head = self._script[0] if self._script else self._next_item()
        reply = head if isinstance(head, Reply) else self.default_reply
        reply = reply or Reply(text="An answer cut short")
        model = str(body.get("model", self.model))
        chunks = self._reply_chunks(f"chatcmpl-{next(self._ids):04d}", model, reply, False)
        # The opening chunk carries no content; keep it and cut_after deltas,
        # never the finishing chunk.
        kept = chunks[: min(1 + self.faults.cut_after, len(chunks) - 1)]
        return await drop_after(request, _frames(kept))

    def _call_id(self, call: FunctionCall) -> str:
        return call.id or f"call_{next(self._ids):04d}"

    def _finish_reason(self, reply: Reply) -> str:
        if reply.finish_reason is not None:
            return reply.finish_reason
        return "tool_calls" if reply.tool_calls else "stop"

    def _json_reply(self, model: str, reply: Reply) -> web.Response:
        text = reply.text if isinstance(reply.text, str) else "".join(reply.text)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self._call_id(call),
                    "type": "function",
                    "function": {"name": call.name, "arguments": _raw_arguments(call)},
                }
                for call in reply.tool_calls
            ]
        payload = {
            "id": f"chatcmpl-{next(self._ids):04d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self._finish_reason(reply)}
            ],
            "usage": _usage(reply),
        }
        return web.json_response(payload)

    def _chunk(
        self, chunk_id: str, model: str, delta: Mapping[str, Any], finish: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
        }

    def _text_chunks(
        self, chunk_id: str, model: str, text: str | Sequence[str]
    ) -> list[dict[str, Any]]:
        chunks = [self._chunk(chunk_id, model, {"role": "assistant", "content": ""})]
        pieces = split_words(text) if isinstance(text, str) else list(text)
        chunks.extend(self._chunk(chunk_id, model, {"content": p}) for p in pieces if p)
        return chunks

    def _reply_chunks(
        self, chunk_id: str, model: str, reply: Reply, include_usage: bool
    ) -> list[dict[str, Any]]:
        chunks = self._text_chunks(chunk_id, model, reply.text)
        for index, call in enumerate(reply.tool_calls):
            opening = {
                "index": index,
                "id": self._call_id(call),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            chunks.append(self._chunk(chunk_id, model, {"tool_calls": [opening]}))
            for piece in split_json(_raw_arguments(call), 6):
                fragment = {"index": index, "function": {"arguments": piece}}
                chunks.append(self._chunk(chunk_id, model, {"tool_calls": [fragment]}))
        chunks.append(self._chunk(chunk_id, model, {}, self._finish_reason(reply)))
        if include_usage:
            final = self._chunk(chunk_id, model, {})
            final["choices"] = []
            final["usage"] = _usage(reply)
            chunks.append(final)
        return chunks


def _frames(chunks: Sequence[Mapping[str, Any]]) -> list[bytes]:
    return [sse(chunk) for chunk in chunks]


def _raw_arguments(call: FunctionCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _error_response(
    status: int,
    message: str,
    error_type: str,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    param: str | None = None,
) -> web.Response:
    payload = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return json_error(status, payload, headers)
