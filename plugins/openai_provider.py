"""OpenAI-compatible Chat Completions as an :class:`~bot.contracts.llm.LLMProvider`.

Targets OpenAI itself and the servers that copy its API (Ollama, vLLM,
llama.cpp, LM Studio): only Chat Completions with ``stream=True`` and function
tools are used. Every call streams, so text reaches the chat while the model
writes and a cancelled run closes the HTTP stream at once. The SDK's own
retries are off: :mod:`plugins.provider_retry` retries transient failures
instead (a stream cut mid-answer included), reports each retry via
``on_retry``, and holds calls behind the provider's circuit breaker during an
outage.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import openai
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionContentPartParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from plugins.openai_http import http_client
from plugins.provider_retry import (
    DEFAULT_MAX_ATTEMPTS,
    RETRYABLE_STATUSES,
    AttemptFailed,
    OnOpen,
    RetryPolicy,
    is_retryable_status,
    parse_retry_after,
    read_stream,
    tool_call_from_json,
    with_retries,
)
from roost import (
    OPENAI_SHORT_EDGE,
    ChatMessage,
    CircuitBreaker,
    DocumentData,
    ImageData,
    LLMRequest,
    LLMResponse,
    MediaReader,
    Note,
    OnRetry,
    OnText,
    ProviderError,
    Settings,
    ToolCall,
    ToolSpec,
    Usage,
)

__all__ = ["OpenAIProvider"]

_CLIENT_ERROR_TYPES = frozenset({"invalid_request_error", "BadRequestError", "NotFoundError"})


class OpenAIProvider:
    """Streams Chat Completions with function tools, retrying transient failures.

    ``max_attempts`` and ``retry_base_delay`` make its
    :class:`~plugins.provider_retry.RetryPolicy`. ``breaker`` is shared by all
    calls of this instance (a fresh :class:`roost.CircuitBreaker`
    with the default policy unless given).
    """

    name = "openai"

    def __init__(
        self,
        settings: Settings,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_base_delay: float = 0.5,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        key = settings.openai_api_key
        self._client = openai.AsyncOpenAI(
            base_url=settings.openai_base_url,
            # Local servers need no key, but the SDK refuses to start without one.
            api_key=(key.get_secret_value() if key is not None else "") or "not-needed",
            max_retries=0,
            http_client=http_client(),
        )
        self.retry = RetryPolicy(max_attempts, retry_base_delay)
        self.breaker = breaker or CircuitBreaker()
        # Adjusted once if the server rejects them; see _adapt_to.
        self._include_usage = True
        self._token_param = "max_tokens"
        self.media = MediaReader(documents=False, max_short_edge=OPENAI_SHORT_EDGE)
        """Prepares images (and PDF text) of the history, caching them between calls."""

    async def complete(
        self,
        request: LLMRequest,
        *,
        on_text: OnText | None = None,
        on_retry: OnRetry | None = None,
    ) -> LLMResponse:
        """Run one model call, streaming text to ``on_text``.

        ``on_retry(attempt, max_attempts, error)`` comes before each retry and
        voids the text streamed so far (the retry streams from the start);
        ``on_retry(0, 0, reason)`` says the call is held by the breaker during
        an outage, once per call (see :func:`plugins.provider_retry.with_retries`).
        Raises :class:`ProviderError` when the call fails for good.
        """
        files = any(m.parts for m in request.messages)
        # The note goes last, so servers that cache prompt prefixes (vLLM,
        # llama.cpp) find the system prompt and history unchanged next time.
        history = with_note(request.messages, request.note)
        if files:
            # Reading and resizing images is CPU work: keep it off the event loop.
            messages = await asyncio.to_thread(
                to_openai_messages, request.system, history,
                vision=request.vision, media=self.media)
        else:
            messages = to_openai_messages(request.system, history)
        tools = to_openai_tools(request.tools)
        try:
            return await with_retries(
                partial(self._stream_once, request, messages, tools),
                self.retry,
                on_text=on_text,
                on_retry=on_retry,
                breaker=self.breaker,
                resend=self._adapt_to,
            )
        finally:
            if files:
                # The request held megabytes of base64 (and the intake the downloaded
                # file): hand the freed heap back rather than keep it in malloc arenas.
                del messages
                self.media.release()

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        await self._client.close()

    def _adapt_to(self, error: ProviderError) -> bool:
        """Drop a request option the server rejected; True if the call should be re-sent."""
        if error.status not in (400, 422):
            return False
        text = str(error)
        # Some OpenAI-compatible servers reject stream_options outright.
        if self._include_usage and "stream_options" in text:
            self._include_usage = False
            return True
        # Newer OpenAI models accept only max_completion_tokens.
        if self._token_param == "max_tokens" and "max_completion_tokens" in text:
            self._token_param = "max_completion_tokens"
            return True
        return False

    async def _stream_once(
        self,
        request: LLMRequest,
        messages: list[ChatCompletionMessageParam],
        tools: list[ChatCompletionFunctionToolParam],
        on_text: OnText | None,
        opened: OnOpen,
    ) -> LLMResponse:
        extra: dict[str, Any] = {self._token_param: request.max_tokens}
        if self._include_usage:
            extra["stream_options"] = {"include_usage": True}
        progress = _Progress()
        await read_stream(
            lambda: self._client.chat.completions.create(
                model=request.model,
                messages=messages,
                tools=tools or openai.omit,
                temperature=openai.omit if request.temperature is None else request.temperature,
                stream=True,
                extra_body=extra,
            ),
            lambda chunk: progress.handle(chunk, on_text),
            lambda exc: _failure(exc, self._where),
            # This SDK wraps transport failures in APIError even mid-stream, so
            # anything else is a bug, not a failed call, and must not be retried.
            catch=openai.APIError,
            opened=opened,
        )
        return progress.result()

    @property
    def _where(self) -> str:
        return str(self._client.base_url).rstrip("/")


@dataclass(slots=True)
class _ToolBuffer:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def to_call(self) -> ToolCall:
        # Some local servers send no call id; the history needs one to pair
        # the tool result with its call.
        call_id = self.id or f"call_{uuid.uuid4().hex[:16]}"
        return tool_call_from_json(call_id, self.name, "".join(self.arguments))


@dataclass(slots=True)
class _Progress:
    """Accumulates one streamed attempt."""

    text_parts: list[str] = field(default_factory=list)
    tools: dict[int, _ToolBuffer] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""

    def handle(self, chunk: ChatCompletionChunk, on_text: OnText | None) -> None:
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
                cache_read_tokens=(details.cached_tokens or 0) if details is not None else 0,
            )
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                self.text_parts.append(delta.content)
                if on_text is not None:
                    on_text(delta.content)
            for call in delta.tool_calls or ():
                self._tool_delta(call)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def _tool_delta(self, call: Any) -> None:
        index = getattr(call, "index", None)
        call_id = getattr(call, "id", None)
        if not isinstance(index, int):
            # Some servers omit the index; a new id then means a new call.
            known = {b.id for b in self.tools.values()}
            if (call_id and call_id not in known) or not self.tools:
                index = len(self.tools)
            else:
                index = max(self.tools)
        buffer = self.tools.setdefault(index, _ToolBuffer())
        if call_id and not buffer.id:
            buffer.id = call_id
        function = getattr(call, "function", None)
        if function is not None:
            if function.name and not buffer.name:
                buffer.name = function.name
            if function.arguments:
                buffer.arguments.append(function.arguments)

    def result(self) -> LLMResponse:
        calls = tuple(b.to_call() for _, b in sorted(self.tools.items()))
        return LLMResponse(
            text="".join(self.text_parts),
            tool_calls=calls,
            usage=self.usage,
            stop_reason=self.finish_reason,
        )


def _failure(exc: openai.APIError, where: str) -> AttemptFailed:
    """Classify an ``openai.APIError`` raised during one attempt against ``where``."""
    if isinstance(exc, openai.APIStatusError):
        retry_after = parse_retry_after(exc.response.headers.get("retry-after"))
        return AttemptFailed(_status_error(exc, where), retry_after)
    if isinstance(exc, openai.APITimeoutError):
        return AttemptFailed(ProviderError(f"the request to {where} timed out", retryable=True))
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        reason = f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
        text = f"the connection to {where} failed: {reason}"
        return AttemptFailed(ProviderError(text, retryable=True))
    return AttemptFailed(_stream_error(exc))


def _error_detail(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body:
        return body
    return exc.message


def _status_error(exc: openai.APIStatusError, where: str) -> ProviderError:
    status = exc.status_code
    detail = _error_detail(exc)
    retryable = is_retryable_status(status)
    if status == 401:
        text = f"{where} rejected the API key (401): check OPENAI_API_KEY"
    elif status == 403:
        text = f"{where} refused the request (403 permission denied): {detail}"
    elif status == 404:
        text = f"{where} returned 404 ({detail}): check the model name and OPENAI_BASE_URL"
    elif status == 429:
        text = f"rate limit reached at {where} (429): {detail}"
    elif status >= 500:
        text = f"server error from {where} ({status}): {detail}"
    else:
        text = f"{where} rejected the request ({status}): {detail}"
    return ProviderError(text, retryable=retryable, status=status)


def _stream_error(exc: openai.APIError) -> ProviderError:
    """An error object sent inside a 200 stream (``data: {"error": ...}``)."""
    detail = _error_detail(exc)
    status: int | None = None
    code = exc.code
    if code is not None and code.isdigit():
        status = int(code)
    # Servers put an HTTP-like code or an error type in the object; treat the
    # failure as transient unless either says the request itself was bad.
    client_fault = (status is not None and 400 <= status < 500) and status not in (
        RETRYABLE_STATUSES
    )
    client_fault = client_fault or exc.type in _CLIENT_ERROR_TYPES
    return ProviderError(f"the model stream failed: {detail}", retryable=not client_fault)


def with_note(history: Sequence[ChatMessage], note: str) -> Sequence[ChatMessage]:
    """``history`` with the request's volatile ``note`` appended to its final message."""
    if not note.strip() or not history:
        return history
    last = history[-1]
    return (*history[:-1], replace(last, content=f"{last.content}\n\n{note}"))


def to_openai_messages(
    system: str,
    history: Sequence[ChatMessage],
    *,
    vision: bool = True,
    media: MediaReader | None = None,
) -> list[ChatCompletionMessageParam]:
    """Convert neutral history to Chat Completions ``messages``.

    Consecutive user messages are joined into one, as some local chat
    templates insist that user and assistant turns alternate.

    A user message's images become ``image_url`` parts holding data URLs after
    its text (``media`` prepares them; a fresh reader without a cache if not
    given); PDFs become their extracted text. With ``vision=False``, or for a
    file that is gone or unreadable, a text note is sent instead, and a
    message without images stays plain text, which every server takes.
    Reads files: call it off the event loop.
    """
    reader = media or MediaReader(documents=False, max_short_edge=OPENAI_SHORT_EDGE)
    result: list[ChatCompletionMessageParam] = []
    if system:
        result.append({"role": "system", "content": system})
    for message in _join_user_runs(history):
        if message.role == "user":
            result.append({"role": "user", "content": _user_content(message, reader, vision)})
        elif message.role == "assistant":
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(dict(call.arguments), ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ]
            if calls:
                result.append(
                    {"role": "assistant", "content": message.content, "tool_calls": calls}
                )
            else:
                result.append({"role": "assistant", "content": message.content})
        else:
            result.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": _with_notes(message),
                }
            )
    return result


def _user_content(
    message: ChatMessage, media: MediaReader, vision: bool
) -> str | list[ChatCompletionContentPartParam]:
    """The text of ``message``, with its images as ``image_url`` parts when it has any."""
    if not message.parts:
        return message.content
    notes: list[str] = []
    images: list[ChatCompletionContentPartParam] = []
    for item in media.read_all(message.parts, vision=vision):
        if isinstance(item, ImageData):
            url = f"data:{item.mime_type};base64,{item.data}"
            images.append({"type": "image_url", "image_url": {"url": url}})
        elif isinstance(item, Note):
            notes.append(item.text)
        elif isinstance(item, DocumentData):  # not produced for this API (documents=False)
            notes.append(f"[document: {item.part.path}]")
    text = "\n\n".join(x for x in (message.content, *notes) if x)
    if not images:
        return text
    parts: list[ChatCompletionContentPartParam] = []
    if text:
        parts.append({"type": "text", "text": text})
    parts.extend(images)
    return parts


def _with_notes(message: ChatMessage) -> str:
    """A tool result's text, with a note for each file: tool messages take no images."""
    if not message.parts:
        return message.content
    notes = [f"[{p.kind}: {p.path}]" for p in message.parts]
    return "\n\n".join(x for x in (message.content, *notes) if x)


def _join_user_runs(history: Sequence[ChatMessage]) -> list[ChatMessage]:
    joined: list[ChatMessage] = []
    for message in history:
        if message.role == "user" and joined and joined[-1].role == "user":
            last = joined[-1]
            content = "\n\n".join(x for x in (last.content, message.content) if x)
            joined[-1] = replace(last, content=content, parts=last.parts + message.parts)
        else:
            joined.append(message)
    return joined


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    """Convert tool specs to Chat Completions function ``tools``."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": dict(tool.input_schema),
            },
        }
        for tool in tools
    ]
