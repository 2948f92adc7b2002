"""One model call of a run: streaming its text and retry notices to the run's events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from bot.contracts.events import EventType
from bot.contracts.llm import LLMProvider, LLMRequest, LLMResponse, metered_complete
from bot.observability.tracing import Span, preview
from bot.tools.outcomes import describe_error


class Emit(Protocol):
    """A run's event emitter: ``await emit("chunk", content=...)``."""

    def __call__(self, type_: EventType, **payload: Any) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class _Retrying:
    """A provider's ``on_retry`` call, queued behind the text it voids."""

    attempt: int
    max_attempts: int
    error: str


async def call_model(provider: LLMProvider, request: LLMRequest, span: Span, emit: Emit, *,
                     streaming: bool) -> LLMResponse:
    """Ask ``provider``; fragments become ``chunk`` events and retries ``run.retrying``.

    ``span`` (started by the caller) is ended here with the usage or the error. The call
    is reserved and settled on the run's meter (:mod:`bot.contracts.llm`).
    """
    on_text = None
    pump: asyncio.Task[None] | None = None
    queue: asyncio.Queue[str | _Retrying | None] = asyncio.Queue()
    if streaming:
        # Providers call on_text synchronously from their stream loop; a pump
        # task forwards fragments so slow observers never stall the stream.
        on_text = queue.put_nowait
        pump = asyncio.create_task(_pump(queue, emit))

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        retrying = _Retrying(attempt, max_attempts, error)
        if pump is not None:
            # Through the same queue as the text: the draft restarts after the
            # failed attempt's last fragment, never before it.
            queue.put_nowait(retrying)
        else:
            await _emit_retrying(emit, retrying)

    try:
        response = await metered_complete(provider, request, on_text=on_text,
                                          on_retry=on_retry)
    except BaseException as exc:
        span.end(error=True, error_message=describe_error(exc))
        raise
    finally:
        if pump is not None:
            queue.put_nowait(None)
            await pump
    usage = response.usage
    span.end(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
             cache_read_tokens=usage.cache_read_tokens,
             cache_write_tokens=usage.cache_write_tokens,
             output_preview=preview(response.text), tool_calls=len(response.tool_calls))
    return response


async def _pump(queue: asyncio.Queue[str | _Retrying | None], emit: Emit) -> None:
    while (item := await queue.get()) is not None:
        if isinstance(item, _Retrying):
            await _emit_retrying(emit, item)
        else:
            await emit("chunk", content=item)


async def _emit_retrying(emit: Emit, retrying: _Retrying) -> None:
    await emit("run.retrying", attempt=retrying.attempt, maxAttempts=retrying.max_attempts,
               error=retrying.error)
