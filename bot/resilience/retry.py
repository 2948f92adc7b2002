"""One retry policy and one error classifier for every layer.

:class:`RetryPolicy` says how often and how patiently something is tried again:
exponential backoff with jitter and caps, a server's ``retry-after`` honoured up
to a limit, an optional total-time budget, or a fixed schedule of delays. The
classifier says whether a failure is worth another try: ``transient``,
``rate_limited`` (transient, and the server may say for how long) or
``permanent``, read from HTTP statuses, error codes, exception types and text.

Who uses it (each with its own numbers, kept as configuration):

- tool calls (:mod:`bot.tools.executor`, :mod:`bot.tools.classify`);
- model providers (:mod:`plugins.provider_retry`) and the provider circuit
  breaker's probe delays (:mod:`bot.resilience.breaker`);
- platform delivery (:mod:`channels.delivery`) and the adapters' reconnects;
- redelivery of committed replies and scheduled-job retries (fixed schedules).

Pure computation: nothing here sleeps, so callers keep their injected clocks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, overload

__all__ = [
    "PERMANENT_CODES",
    "RATE_LIMIT_CODES",
    "TRANSIENT_CODES",
    "TRANSIENT_STATUSES",
    "Classification",
    "JitterMode",
    "RetryPolicy",
    "classify",
    "classify_code",
    "classify_status",
    "code_of",
    "error_code",
    "is_retryable_status",
    "parse_retry_after",
    "status_of",
]

Classification = Literal["transient", "rate_limited", "permanent"]
JitterMode = Literal["both", "up"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently something is tried again.

    ``attempts`` counts the first try (below 1 means 1). Retry ``n`` (1 = the
    wait before the second attempt) waits ``min(base_delay * multiplier**(n-1),
    max_delay)`` seconds, or ``delays[n-1]`` when a fixed schedule is given (its
    last delay repeats). Jitter then scales the wait by a random factor in
    ``[1 - jitter, 1 + jitter]`` (``jitter_mode="both"``) or ``[1, 1 + jitter]``
    (``"up"``: never shorter than the nominal delay), so clients that failed
    together do not retry together. A server's ``retry-after`` is honoured up
    to ``max_retry_after`` seconds. ``max_total`` (if set) bounds the time
    spent on one operation; the caller checks it with :meth:`within_total`.

    The defaults suit calls to chat platforms (five attempts, 0.5 s doubling
    to 30 s, ±10 %, a retry-after up to a minute); other users name theirs.
    """

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_retry_after: float = 60.0
    jitter: float = 0.1
    jitter_mode: JitterMode = "both"
    multiplier: float = 2.0
    max_total: float | None = None
    delays: tuple[float, ...] = ()

    @classmethod
    def fixed(cls, *delays: float) -> RetryPolicy:
        """A schedule of exact delays without jitter: one retry per delay."""
        return cls(attempts=len(delays) + 1, delays=tuple(delays), jitter=0.0)

    @property
    def retries(self) -> int:
        """How many retries follow the first attempt."""
        return max(1, self.attempts) - 1

    def backoff(self, retry: int) -> float:
        """The nominal wait before retry ``retry`` (from 1), before jitter."""
        if self.delays:
            return self.delays[min(max(1, retry), len(self.delays)) - 1]
        try:
            # The exponent is bounded so a long outage cannot overflow it.
            grown = self.base_delay * self.multiplier ** min(max(0, retry - 1), 64)
        except OverflowError:
            grown = self.max_delay
        return min(grown, self.max_delay)

    def delay(self, retry: int, *, retry_after: float | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``retry`` (from 1): backoff with jitter,
        at least the server's ``retry_after`` (capped by :attr:`max_retry_after`).

        ``rng`` draws the jitter (the module's generator when ``None``).
        """
        draw = rng if rng is not None else random
        spread = max(0.0, self.jitter)
        low = -spread if self.jitter_mode == "both" else 0.0
        wait = self.backoff(retry)
        if spread:
            wait *= 1.0 + draw.uniform(low, spread)
        wait = max(0.0, wait)
        if retry_after is not None:
            wait = max(wait, self.honour(retry_after))
        return wait

    def honour(self, retry_after: float) -> float:
        """The wait a server asked for, within ``[0, max_retry_after]``."""
        return min(max(0.0, retry_after), self.max_retry_after)

    def within_total(self, elapsed: float) -> bool:
        """Whether ``elapsed`` seconds (spent plus about to be waited) fit ``max_total``."""
        return self.max_total is None or elapsed <= self.max_total


# --------------------------------------------------------------------------- classification

RATE_LIMIT_CODES = frozenset({"RATE_LIMIT", "RATE_LIMITED", "TOO_MANY_REQUESTS"})
TRANSIENT_CODES = frozenset({
    "TIMEOUT", "TIMED_OUT", "PARTIAL_TIMEOUT", "NETWORK", "NETWORK_ERROR", "CONNECTION",
    "CONNECTION_ERROR", "CONNECTION_RESET", "OS_ERROR", "UNAVAILABLE", "SERVICE_UNAVAILABLE",
    "TEMPORARILY_UNAVAILABLE", "CIRCUIT_OPEN",
}) | RATE_LIMIT_CODES
PERMANENT_CODES = frozenset({
    "INVALID_INPUT", "INVALID_ARGUMENT", "INVALID_ARGUMENTS", "BAD_REQUEST", "VALIDATION",
    "VALIDATION_ERROR", "AUTH", "AUTH_FAILED", "AUTHENTICATION", "UNAUTHORIZED", "FORBIDDEN",
    "PERMISSION_DENIED", "NOT_FOUND", "UNSUPPORTED", "NOT_SUPPORTED", "UNSUPPORTED_OPERATION",
    "SCHEMA", "SCHEMA_ERROR", "SCHEMA_VALIDATION", "UNKNOWN_TOOL", "TOOL_NOT_FOUND",
    "TOOL_DISABLED",
})
TRANSIENT_STATUSES = frozenset({408, 425, 429})
"""4xx statuses worth retrying by default; every 5xx is transient, every other 4xx
permanent. Callers that know their server pass their own set (providers add 409)."""

_STATUS_ATTRS = ("status_code", "status", "http_status")
_STATUS_IN_TEXT = re.compile(
    r"\b(?:https?(?:/\d(?:\.\d)?)?|status(?:[ _]code)?|error|code)\s*[:=#]?\s*([1-5]\d\d)\b",
    re.IGNORECASE,
)
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), code) for pattern, code in (
        (r"too many requests|rate[ _-]?limit", "RATE_LIMITED"),
        (r"service unavailable|temporarily unavailable", "UNAVAILABLE"),
        (r"timed? ?out\b|timeout", "TIMEOUT"),
        (r"connection (?:reset|refused|aborted|closed|dropped)|network (?:error|unreachable)",
         "NETWORK"),
        (r"unauthori[sz]ed|forbidden|permission denied|authentication|invalid (?:api )?key",
         "AUTH"),
        (r"not supported|unsupported", "UNSUPPORTED"),
        (r"\bschema\b", "SCHEMA"),
        (r"\bvalidation\b|\binvalid\b|malformed", "INVALID_INPUT"),
        (r"not found|does not exist|no such", "NOT_FOUND"),
    )
)


def classify_status(status: int,
                    retryable: Collection[int] = TRANSIENT_STATUSES) -> Classification | None:
    """What an HTTP status says: 429 is ``rate_limited``; 5xx and ``retryable``
    are ``transient``; other 4xx ``permanent``; ``None`` below 400 (no error)."""
    if status == 429:
        return "rate_limited"
    if status >= 500 or status in retryable:
        return "transient"
    if 400 <= status < 500:
        return "permanent"
    return None


def is_retryable_status(status: int, retryable: Collection[int] = TRANSIENT_STATUSES) -> bool:
    """Whether an HTTP error status may succeed on a later try."""
    return classify_status(status, retryable) in ("transient", "rate_limited")


@overload
def parse_retry_after(value: object) -> float | None: ...


@overload
def parse_retry_after(value: object, default: float) -> float: ...


def parse_retry_after(value: object, default: float | None = None) -> float | None:
    """Seconds from a ``retry-after`` value (header text or bytes, or a number), never
    negative; ``default`` when it is absent or not a number."""
    if value is None or isinstance(value, bool):
        return default
    if not isinstance(value, str | bytes | int | float):
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        return default


def status_of(error: BaseException) -> int | None:
    """An HTTP-ish status carried by ``error`` or its ``response``, if any."""
    for holder in (error, getattr(error, "response", None)):
        if holder is None:
            continue
        for attr in _STATUS_ATTRS:
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def _code_in_text(text: str) -> str | None:
    if match := _STATUS_IN_TEXT.search(text):
        return match.group(1)
    for pattern, code in _PHRASES:
        if pattern.search(text):
            return code
    return None


def _code_of_type(error: BaseException) -> str | None:
    if isinstance(error, TimeoutError):
        return "TIMEOUT"
    if isinstance(error, ConnectionError):
        return "NETWORK"
    if isinstance(error, PermissionError):
        return "PERMISSION_DENIED"
    if isinstance(error, FileNotFoundError):
        return "NOT_FOUND"
    if isinstance(error, NotImplementedError):
        return "UNSUPPORTED"
    name = type(error).__name__.lower()
    if "validation" in name:
        return "VALIDATION"
    if "schema" in name:
        return "SCHEMA"
    return None


def code_of(error: BaseException | str) -> str | None:
    """A telling code for ``error``, or ``None`` when nothing about it tells.

    For text: an HTTP status or telling phrase in it. For an exception, in
    order: an HTTP status attribute (``status_code``, ``status``,
    ``response.status_code``...) as digits; the exception type (timeouts,
    connection errors, permissions, missing files, ``NotImplementedError``,
    ``*Validation*``/``*Schema*`` types); a status or phrase in its message.
    """
    if isinstance(error, str):
        return _code_in_text(error)
    if (status := status_of(error)) is not None:
        return str(status)
    return _code_of_type(error) or _code_in_text(str(error))


def error_code(error: BaseException | str, default: str = "ERROR") -> str:
    """The machine-readable code of ``error``, upper-case: :func:`code_of`, else
    ``default`` for text, ``OS_ERROR`` for other OS errors, the type's name otherwise."""
    if (code := code_of(error)) is not None:
        return code
    if isinstance(error, str):
        return default
    if isinstance(error, OSError):
        return "OS_ERROR"
    return type(error).__name__


def classify_code(code: str,
                  retryable: Collection[int] = TRANSIENT_STATUSES) -> Classification | None:
    """What a code says (case-insensitive): the known codes, then digits as an HTTP
    status (:func:`classify_status`); ``None`` when it says nothing."""
    code = code.upper()
    if code in RATE_LIMIT_CODES:
        return "rate_limited"
    if code in TRANSIENT_CODES:
        return "transient"
    if code in PERMANENT_CODES:
        return "permanent"
    if code.isdigit():
        return classify_status(int(code), retryable)
    return None


def classify(error: BaseException | str, *, code: str | None = None,
             unknown: Classification | None = None,
             retryable: Collection[int] = TRANSIENT_STATUSES) -> Classification:
    """``transient``, ``rate_limited`` or ``permanent`` for an exception or error text.

    ``code`` (default :func:`error_code`) is read with :func:`classify_code`. A
    failure nothing tells about is ``unknown``, by default ``permanent`` for
    text (a report someone wrote) and ``transient`` for an exception (a crash
    that may not recur).
    """
    found = classify_code(code or error_code(error), retryable)
    if found is not None:
        return found
    if unknown is not None:
        return unknown
    return "permanent" if isinstance(error, str) else "transient"
