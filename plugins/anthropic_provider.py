"""The Anthropic Messages API as an :class:`~bot.contracts.llm.LLMProvider`.

Every call streams, so text reaches the chat while the model writes and a
cancelled run closes the HTTP stream at once.

Prompt caching: each request carries up to four ``cache_control`` breakpoints
(:func:`cache_breakpoints`): the last tool, the system prompt, the previous
request's final message and this request's final message. The engine keeps
everything before them byte-identical from one request of a chat to the next
(volatile text travels in :attr:`~bot.contracts.llm.LLMRequest.note`, sent
after the last breakpoint), so each call reads the conversation so far from
the cache at a tenth of the input price and writes only what is new. The SDK's own retries are off:
:mod:`plugins.provider_retry` retries transient failures instead (a stream
cut mid-answer included), reports each retry via ``on_retry``, and holds
calls behind the provider's circuit breaker during an outage.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the SDK is imported only where no key is configured (see __init__)
    import anthropic
    from anthropic.types import (
        MessageParam,
        RawMessageStreamEvent,
        TextBlockParam,
        ToolParam,
    )

from plugins.anthropic_request import (
    Prefix,
    mark_messages,
    to_anthropic_messages,
    with_note,
)
from plugins.anthropic_stream import (
    ConnectFailure,
    ReadFailure,
    ReadTimeout,
    RequestTimeout,
    Route,
    StatusFailure,
    close_streams,
    open_stream,
)
from plugins.provider_retry import (
    DEFAULT_MAX_ATTEMPTS,
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
    ANTHROPIC_MAX_PIXELS,
    CircuitBreaker,
    LLMRequest,
    LLMResponse,
    MediaReader,
    OnRetry,
    OnText,
    ProviderError,
    Settings,
    ToolCall,
    Usage,
    client_tls,
)

__all__ = ["AnthropicProvider"]

_RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})
# The SDK does not wrap errors raised while reading a streamed body, and its
# HTTP stack is httpx2 in SDK 1.x/2.x but httpx in 0.x, so transport failures
# are recognised by the package that raised them.
_TRANSPORT_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio"})


class AnthropicProvider:
    """Streams Claude completions with tool use, retrying transient failures.

    ``max_attempts`` and ``retry_base_delay`` make its
    :class:`~plugins.provider_retry.RetryPolicy`. ``breaker`` is shared by all
    calls of this instance (a fresh :class:`roost.CircuitBreaker`
    with the default policy unless given).
    """

    name = "anthropic"

    def __init__(
        self,
        settings: Settings,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_base_delay: float = 0.5,
        breaker: CircuitBreaker | None = None,
        prompt_cache: bool = True,
    ) -> None:
        key = settings.anthropic_api_key
        token = os.environ.get("ANTHROPIC_AUTH_TOKEN") or None
        self._target: Route | anthropic.AsyncAnthropic
        self._missing_key = False
        if key is not None or token is not None:
            # The usual deployment: a configured key. The request is sent directly
            # (plugins.anthropic_stream), and the SDK is never imported.
            self._target = Route.direct(
                api_key=key.get_secret_value() if key is not None else None,
                auth_token=token if key is None else None,
                base_url=settings.anthropic_base_url or os.environ.get("ANTHROPIC_BASE_URL"),
                user_agent=f"roost/{_version()}")
        else:
            self._target = _sdk_client(settings)
            # If the SDK found no credentials either, every request would fail
            # with a bare TypeError; fail with the setting to fix instead.
            self._missing_key = (
                self._target.api_key is None
                and self._target.auth_token is None
                and getattr(self._target, "credentials", None) is None
            )
        client_tls()  # here, off the event loop when built by the warm-up
        self.retry = RetryPolicy(max_attempts, retry_base_delay)
        self.breaker = breaker or CircuitBreaker()
        self.media = MediaReader(documents=True, max_pixels=ANTHROPIC_MAX_PIXELS)
        """Prepares images and PDFs of the history, caching them between calls."""
        self.prompt_cache = prompt_cache
        """Whether requests carry cache breakpoints (off: every call pays full input price)."""
        self._prefix = Prefix()

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
        if self._missing_key:
            raise ProviderError("no Anthropic API key is configured: set ANTHROPIC_API_KEY")
        files = any(m.parts for m in request.messages)
        if files:
            # Reading and resizing images is CPU work: keep it off the event loop.
            messages = await asyncio.to_thread(
                to_anthropic_messages, request.messages, vision=request.vision,
                media=self.media)
        else:
            messages = to_anthropic_messages(request.messages)
        marked = self.prompt_cache and request.cache
        tools, system, encoded = self._prefix.get(request.tools, request.system, marked)
        if marked:
            mark_messages(messages)
        with_note(messages, request.note)
        try:
            return await with_retries(
                partial(self._stream_once, request, system, messages, tools, encoded),
                self.retry,
                on_text=on_text,
                on_retry=on_retry,
                breaker=self.breaker,
            )
        finally:
            if files:
                # The request held megabytes of base64 (and the intake the downloaded
                # file): hand the freed heap back rather than keep it in malloc arenas.
                del messages
                self.media.release()

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        await close_streams(self._target)
        if not isinstance(self._target, Route):
            await self._target.close()

    async def _stream_once(
        self,
        request: LLMRequest,
        system: list[TextBlockParam],
        messages: list[MessageParam],
        tools: list[ToolParam],
        encoded: tuple[str, str],
        on_text: OnText | None,
        opened: OnOpen,
    ) -> LLMResponse:
        progress = _Progress()
        await read_stream(
            # No temperature: this Messages API version no longer accepts one.
            lambda: open_stream(self._target, model=request.model,
                                max_tokens=request.max_tokens, system=system,
                                messages=messages, tools=tools, encoded=encoded),
            lambda event: progress.handle(event, on_text),
            _failure,
            # Errors of the HTTP stack arrive unwrapped mid-stream (see
            # _TRANSPORT_PACKAGES), so everything goes to _failure to sort.
            catch=Exception,
            opened=opened,
        )
        return progress.result()


@dataclass(slots=True)
class _ToolBuffer:
    id: str
    name: str
    json_parts: list[str] = field(default_factory=list)
    initial: Mapping[str, Any] | None = None

    def to_call(self) -> ToolCall:
        return tool_call_from_json(self.id, self.name, "".join(self.json_parts), self.initial)


@dataclass(slots=True)
class _Progress:
    """Accumulates one streamed attempt."""

    text_parts: list[str] = field(default_factory=list)
    blocks: dict[int, _ToolBuffer | None] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = ""
    finished: bool = False

    def _text(self, fragment: str, on_text: OnText | None) -> None:
        if not fragment:
            return
        self.text_parts.append(fragment)
        if on_text is not None:
            on_text(fragment)

    def handle(self, event: RawMessageStreamEvent, on_text: OnText | None) -> None:
        if event.type == "message_start":
            usage = event.message.usage
            self._input(usage.input_tokens, usage.cache_read_input_tokens,
                        usage.cache_creation_input_tokens)
            self.usage.output_tokens = usage.output_tokens or 0
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "text":
                self.blocks[event.index] = None
                self._text(block.text, on_text)
            elif block.type == "tool_use":
                initial = block.input if isinstance(block.input, dict) else None
                self.blocks[event.index] = _ToolBuffer(block.id, block.name, initial=initial)
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                self._text(delta.text, on_text)
            elif delta.type == "input_json_delta":
                buffer = self.blocks.get(event.index)
                if buffer is not None:
                    buffer.json_parts.append(delta.partial_json)
        elif event.type == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self.usage.output_tokens = event.usage.output_tokens
            if event.usage.input_tokens is not None:
                self._input(event.usage.input_tokens, event.usage.cache_read_input_tokens,
                            event.usage.cache_creation_input_tokens)
        elif event.type == "message_stop":
            self.finished = True

    def _input(self, uncached: int | None, read: int | None, written: int | None) -> None:
        """The API counts input after the last cache hit or write apart from the cached
        parts; :class:`Usage` counts all input with the cached parts inside it. A
        ``message_delta`` may repeat the totals, with the cache fields or without."""
        if read is not None:
            self.usage.cache_read_tokens = read
        if written is not None:
            self.usage.cache_write_tokens = written
        self.usage.input_tokens = ((uncached or 0) + self.usage.cache_read_tokens
                                   + self.usage.cache_write_tokens)

    def result(self) -> LLMResponse:
        if not self.finished:
            raise AttemptFailed(
                ProviderError("the Anthropic stream ended before message_stop", retryable=True)
            )
        calls = tuple(
            b.to_call() for _, b in sorted(self.blocks.items()) if isinstance(b, _ToolBuffer)
        )
        return LLMResponse(
            text="".join(self.text_parts),
            tool_calls=calls,
            usage=self.usage,
            stop_reason=self.stop_reason,
        )


def _failure(exc: Exception) -> AttemptFailed:
    """Classify anything one attempt raised: the direct route's failures or the SDK's."""
    if isinstance(exc, StatusFailure):
        retry_after = parse_retry_after(exc.headers.get("retry-after"))
        return AttemptFailed(_status_error(exc.status, exc.body, exc.message), retry_after)
    if isinstance(exc, RequestTimeout):
        return AttemptFailed(ProviderError("the request to Anthropic timed out", retryable=True))
    if isinstance(exc, ConnectFailure):
        text = f"could not reach Anthropic: {_cause(exc)}"
        return AttemptFailed(ProviderError(text, retryable=True))
    if isinstance(exc, ReadTimeout):
        return AttemptFailed(ProviderError("the Anthropic stream timed out", retryable=True))
    if isinstance(exc, ReadFailure):
        text = f"the connection to Anthropic failed: {_describe(exc)}"
        return AttemptFailed(ProviderError(text, retryable=True))
    if "anthropic" in sys.modules:  # an SDK client's call: its exception types
        import anthropic
        if isinstance(exc, anthropic.APIStatusError):
            retry_after = parse_retry_after(exc.response.headers.get("retry-after"))
            return AttemptFailed(_status_error(exc.status_code, exc.body, exc.message),
                                 retry_after)
        if isinstance(exc, anthropic.APITimeoutError):
            return AttemptFailed(ProviderError("the request to Anthropic timed out",
                                               retryable=True))
        if isinstance(exc, anthropic.APIConnectionError):
            text = f"could not reach Anthropic: {_cause(exc)}"
            return AttemptFailed(ProviderError(text, retryable=True))
    if type(exc).__module__.split(".")[0] in _TRANSPORT_PACKAGES:
        if "Timeout" in type(exc).__name__:
            return AttemptFailed(ProviderError("the Anthropic stream timed out", retryable=True))
        text = f"the connection to Anthropic failed: {_describe(exc)}"
        return AttemptFailed(ProviderError(text, retryable=True))
    return AttemptFailed(ProviderError(f"Anthropic call failed: {_describe(exc)}"))


def _sdk_client(settings: Settings) -> anthropic.AsyncAnthropic:
    """An SDK client, for credentials only the SDK finds (its environment and profiles)."""
    import anthropic
    try:
        return anthropic.AsyncAnthropic(base_url=settings.anthropic_base_url or None,
                                        max_retries=0)
    except anthropic.AnthropicError as exc:
        # Without a key the SDK looks for credential profiles on disk, and
        # a broken profile fails construction.
        raise ProviderError(f"Anthropic credentials could not be loaded: {exc}") from exc


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("roost")
    except PackageNotFoundError:
        return "0"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return _describe(cause) if cause is not None else _describe(exc)


def _api_message(body: object) -> tuple[str | None, str | None]:
    """``(error.type, error.message)`` from an API error body."""
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            etype, message = error.get("type"), error.get("message")
            return (
                etype if isinstance(etype, str) else None,
                message if isinstance(message, str) else None,
            )
    return None, None


def _status_error(status: int, body: object, fallback: str) -> ProviderError:
    etype, message = _api_message(body)
    detail = message or fallback
    if status < 400:
        # An ``event: error`` inside a 200 stream: classify by its type.
        retryable = etype in _RETRYABLE_STREAM_ERRORS
        kind = etype or "error"
        return ProviderError(f"Anthropic stream failed ({kind}): {detail}", retryable=retryable)
    retryable = is_retryable_status(status)
    if status == 401:
        text = "Anthropic rejected the API key (401): check ANTHROPIC_API_KEY"
    elif status == 403:
        text = f"Anthropic refused the request (403 permission denied): {detail}"
    elif status == 404:
        text = f"Anthropic returned 404 ({detail}): check the model name and ANTHROPIC_BASE_URL"
    elif status == 429:
        text = f"Anthropic rate limit reached (429): {detail}"
    elif status == 529 or etype == "overloaded_error":
        text = f"Anthropic is overloaded ({status}): {detail}"
    elif status >= 500:
        text = f"Anthropic server error ({status}): {detail}"
    else:
        text = f"Anthropic rejected the request ({status}): {detail}"
    return ProviderError(text, retryable=retryable, status=status)
