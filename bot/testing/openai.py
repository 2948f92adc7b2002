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
A request that finds the queue empty gets a 400 naming the problem.
"""

from __future__ import annotations

import json
import time
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
    "FakeOpenAI",
    "FunctionCall",
    "HttpError",
    "ReceivedRequest",
    "Reply",
    "StreamError",
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        api_key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        api_key = api_key or request.headers.get("X-Api-Key")
        body = await self._receive(request, api_key)

        if self.api_key is not None and api_key != self.api_key:
            return _error_response(
                401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"
            )
        item = self._next_item()
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
) -> web.Response:
    payload = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return json_error(status, payload, headers)
