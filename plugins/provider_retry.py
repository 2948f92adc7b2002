"""Retry, backoff and stream-failure plumbing shared by the HTTP providers.

A provider runs each model call as one *attempt* that streams the answer and
raises :class:`AttemptFailed` (carrying a classified :class:`ProviderError`)
when it fails. :func:`with_retries` repeats attempts with jittered exponential
backoff and reports each retry via ``on_retry``, also after some text reached
``on_text`` (a stream cut mid-answer): the caller restarts its draft then, and
the next attempt streams the answer again from its beginning. Every attempt
passes a provider-wide :class:`roost.CircuitBreaker`, which holds
calls during an outage instead of letting each of them retry on its own.
Delays and status classification are the shared ones of
``roost.RetryPolicy``, with the providers' numbers (:class:`RetryPolicy`).
Mapping SDK exceptions to errors stays in each provider: the SDKs differ.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar

from roost import (
    CircuitBreaker,
    JitterMode,
    OnRetry,
    OnText,
    ProviderError,
    ToolCall,
    parse_retry_after,
)
from roost import RetryPolicy as SharedRetryPolicy
from roost import is_retryable_status as shared_retryable_status

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_BACKOFF",
    "MAX_RETRY_AFTER",
    "RETRYABLE_STATUSES",
    "AttemptFailed",
    "EventStream",
    "OnOpen",
    "RetryPolicy",
    "is_retryable_status",
    "parse_retry_after",
    "read_stream",
    "tool_call_from_json",
    "with_retries",
]

T = TypeVar("T")
E_co = TypeVar("E_co", covariant=True)
X = TypeVar("X", bound=Exception)

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""HTTP statuses below 500 that are worth another try."""

MAX_RETRY_AFTER = 30.0
"""The longest ``retry-after`` honoured, in seconds; a chat cannot wait longer."""

MAX_BACKOFF = 8.0
"""The longest wait between two attempts without a ``retry-after``, in seconds."""

DEFAULT_MAX_ATTEMPTS = 6
"""Attempts per call while the provider is healthy. Six, not three: with a fifth
of calls failing at random, three attempts lose about 1 call in 125 and six
about 1 in 15,000; an outage does not multiply requests, as the breaker holds
calls once failures come in a row."""


@dataclass(frozen=True, slots=True)
class RetryPolicy(SharedRetryPolicy):
    """The shared :class:`roost.RetryPolicy` with the providers' defaults.

    ``attempts`` counts the first try (below 1 means 1); retry ``n`` waits
    ``base_delay * 2**(n-1)`` seconds (at most :data:`MAX_BACKOFF`) plus up to
    10 % jitter, so clients that failed together do not retry together, and at
    least the server's ``retry-after`` (honoured up to :data:`MAX_RETRY_AFTER`).
    """

    attempts: int = DEFAULT_MAX_ATTEMPTS
    max_delay: float = MAX_BACKOFF
    max_retry_after: float = MAX_RETRY_AFTER
    jitter_mode: JitterMode = "up"


class AttemptFailed(Exception):
    """One attempt failed with ``error``; ``retry_after`` is the server's hint in seconds."""

    def __init__(self, error: ProviderError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class EventStream(Protocol[E_co]):
    """What both SDKs' ``AsyncStream`` offer: an async iterator that closes on exit."""

    def __aiter__(self) -> AsyncIterator[E_co]: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any: ...


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP error status may succeed on a later try (:data:`RETRYABLE_STATUSES`
    and 5xx)."""
    return shared_retryable_status(status, RETRYABLE_STATUSES)


class _Relay:
    """Forwards text to ``on_text`` and remembers whether any got through."""

    def __init__(self, on_text: OnText) -> None:
        self.on_text = on_text
        self.used = False

    def __call__(self, fragment: str) -> None:
        self.used = True
        self.on_text(fragment)


OnOpen = Callable[[], None]
"""Called by an attempt once the server accepted the call and its stream began."""


async def with_retries(
    attempt: Callable[[OnText | None, OnOpen], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_text: OnText | None,
    on_retry: OnRetry | None,
    resend: Callable[[ProviderError], bool] | None = None,
    breaker: CircuitBreaker | None = None,
) -> T:
    """Await ``attempt(on_text, on_open)`` until it succeeds or fails for good.

    ``attempt`` calls ``on_open()`` when its response stream has begun, and
    raises :class:`AttemptFailed` on failure. A retryable error is
    tried again as ``policy`` allows, even when the failed attempt already
    passed text to ``on_text``. ``resend(error)`` returning True sends the call
    again at once without counting a try: the provider changed its request to
    suit the server. Raises the final :class:`ProviderError`, caused by the SDK
    exception behind it. Only the successful attempt's result is returned.

    ``on_retry(attempt, max_attempts, error)`` is awaited before a retry:

    * ``attempt >= 1``: attempt number ``attempt`` of ``max_attempts`` is about
      to start after ``error``. Whatever this call passed to ``on_text`` so far
      is void: the next attempt streams its answer from the beginning.
    * ``attempt == 0`` (and ``max_attempts == 0``): the call is *held by the
      breaker*; ``error`` is a one-line reason. Sent once per call, when it
      first has to wait; any text shown before was already voided by a
      numbered call. The call then waits, possibly for minutes, until the
      provider recovers or it is cancelled.

    With a ``breaker``, every attempt first passes :meth:`CircuitBreaker.admit`
    and reports its outcome to it; a stream that began counts as an answer at
    once, so a probe releases the held calls without streaming its whole reply
    first. While the breaker is open, failures do not
    count against ``max_attempts`` and do not end the call: the breaker decides
    when to try again. Such a failure is reported with the unchanged
    ``attempt`` number only if it had shown text (to void it); others are not
    reported, so a long outage gives a chat one notice, not one per probe.
    """
    max_attempts = max(1, policy.attempts)
    number = 1
    held = False

    async def hold(reason: str) -> None:
        nonlocal held
        if not held:
            held = True
            if on_retry is not None:
                await on_retry(0, 0, reason)

    while True:
        ticket = await breaker.admit(hold) if breaker is not None else None
        relay = _Relay(on_text) if on_text is not None else None
        opened = _nothing
        if breaker is not None and ticket is not None:
            opened = partial(breaker.record_success, ticket)
        try:
            result = await attempt(relay, opened)
        except AttemptFailed as failed:
            error, cause, retry_after = failed.error, failed.__cause__, failed.retry_after
        except BaseException:
            if breaker is not None and ticket is not None:
                breaker.record_abandoned(ticket)
            raise
        else:
            if breaker is not None and ticket is not None:
                breaker.record_success(ticket)
            return result
        if breaker is not None and ticket is not None:
            if error.retryable:
                breaker.record_failure(ticket, str(error), retry_after)
            else:
                # The provider answered and judged the request: it is up.
                breaker.record_success(ticket)
        if resend is not None and resend(error):
            continue
        if not error.retryable:
            raise error from cause
        if breaker is not None and breaker.is_open:
            # An outage: the breaker paces the next attempt, and this one is
            # not held against the call's budget.
            if relay is not None and relay.used and on_retry is not None:
                await on_retry(number, max_attempts, str(error))
            continue
        if number >= max_attempts:
            if number > 1:
                error = ProviderError(
                    f"{error} (gave up after {number} attempts)",
                    retryable=True,
                    status=error.status,
                )
            raise error from cause
        number += 1
        if on_retry is not None:
            await on_retry(number, max_attempts, str(error))
        await asyncio.sleep(policy.delay(number - 1, retry_after=retry_after))


def _nothing() -> None:
    pass


async def read_stream(
    start: Callable[[], Awaitable[EventStream[T]]],
    handle: Callable[[T], None],
    failure: Callable[[X], AttemptFailed],
    *,
    catch: type[X],
    opened: OnOpen | None = None,
) -> None:
    """Open a stream with ``start()`` and pass each event to ``handle``.

    ``opened()`` is called once ``start()`` returned: the server accepted the
    call. An exception of type ``catch``, raised on opening or while reading, is
    turned into ``failure(exc)``, chained to it; others propagate as they are.
    The stream is closed on every
    exit, including cancellation of the awaiting task, so the HTTP response
    never outlives the call.
    """
    try:
        stream = await start()
    except catch as exc:
        raise failure(exc) from exc
    if opened is not None:
        opened()
    async with stream:
        iterator = aiter(stream)
        while True:
            try:
                event = await anext(iterator)
            except StopAsyncIteration:
                break
            except catch as exc:
                raise failure(exc) from exc
            handle(event)


def tool_call_from_json(
    call_id: str, name: str, raw: str, empty: Mapping[str, Any] | None = None
) -> ToolCall:
    """A :class:`ToolCall` from streamed JSON arguments.

    Blank ``raw`` gives ``empty`` (or no arguments). Text that is not a JSON
    object, as a stream cut short by the token limit or a small local model
    leaves, is handed on as ``_invalid_arguments`` so the tool layer can tell
    the model what went wrong instead of the run crashing.
    """
    if not raw.strip():
        return ToolCall(call_id, name, dict(empty or {}))
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return ToolCall(call_id, name, {"_invalid_arguments": raw})
    return ToolCall(call_id, name, parsed)
