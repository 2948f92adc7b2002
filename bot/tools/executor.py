"""Resilient tool execution: classification, retries, circuit breakers, timeouts, cascades.

One model answer's tool calls are a *batch*. :class:`ToolExecutor` runs a batch
concurrently and gives back one :class:`ToolOutcome` per call, in call order:

- every failure (a raised :class:`~bot.contracts.tools.ToolError`, any unexpected
  exception, an ``is_error`` result, a per-tool timeout) is classified
  ``transient`` or ``permanent`` (:func:`classify`);
- transient failures are retried with exponential backoff and jitter
  (:func:`next_delay`), invisibly to the model, within the tool's
  :class:`~bot.contracts.tools.ToolRetry` policy;
- a :class:`CircuitBreaker` per tool (shared by every session through one
  :class:`Breakers` registry) fails calls fast after repeated transient failures;
- a call whose ``requires`` failed in the same batch is skipped or given its
  ``default``; independent calls go on;
- the per-turn timeout keeps finished results and skips the calls still running.

Every decision is appended to the call's trace span (``attributes["decisions"]``)
and counted in :class:`ToolMetrics`. All waiting between attempts goes through the
injected ``sleep`` and ``clock`` so tests control time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from bot.config.settings import Settings
from bot.contracts.llm import ToolCall
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolResult, ToolRetry
from bot.observability.tracing import RunTrace, Span

log = logging.getLogger("roost.tools.executor")

Classification = Literal["transient", "permanent"]
BreakerState = Literal["closed", "open", "half_open"]
Decision = Literal["retry", "fail", "skip", "open"]
SkipReason = Literal["dependency", "turn_timeout"]
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]
OnCall = Callable[[ToolCall], Awaitable[None]]
OnResult = Callable[["ToolOutcome"], Awaitable[None]]
OnFailure = Callable[[ToolCall, "RawError"], Awaitable[str]]

DEFAULT_RETRY = ToolRetry()

# --------------------------------------------------------------------------- classification

TRANSIENT_CODES = frozenset({
    "TIMEOUT", "TIMED_OUT", "PARTIAL_TIMEOUT", "NETWORK", "NETWORK_ERROR", "CONNECTION",
    "CONNECTION_ERROR", "CONNECTION_RESET", "OS_ERROR", "RATE_LIMIT", "RATE_LIMITED",
    "TOO_MANY_REQUESTS", "UNAVAILABLE", "SERVICE_UNAVAILABLE", "TEMPORARILY_UNAVAILABLE",
    "CIRCUIT_OPEN",
})
PERMANENT_CODES = frozenset({
    "INVALID_INPUT", "INVALID_ARGUMENT", "INVALID_ARGUMENTS", "BAD_REQUEST", "VALIDATION",
    "VALIDATION_ERROR", "AUTH", "AUTH_FAILED", "AUTHENTICATION", "UNAUTHORIZED", "FORBIDDEN",
    "PERMISSION_DENIED", "NOT_FOUND", "UNSUPPORTED", "NOT_SUPPORTED", "UNSUPPORTED_OPERATION",
    "SCHEMA", "SCHEMA_ERROR", "SCHEMA_VALIDATION", "UNKNOWN_TOOL", "TOOL_NOT_FOUND",
    "TOOL_DISABLED",
})
TRANSIENT_STATUSES = frozenset({408, 425, 429})
"""4xx statuses that are worth retrying; every 5xx is transient, every other 4xx permanent."""

_DEFAULT_TOOL_ERROR_CODE = "TOOL_ERROR"
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


def _status_of(error: BaseException) -> int | None:
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


def error_code(error: BaseException | str) -> str:
    """The machine-readable code of ``error``, upper-case.

    In order: an explicit :class:`ToolError` code; an HTTP status attribute
    (``status_code``, ``status``, ``response.status_code``...) as digits; the
    exception type (timeouts, connection and OS errors, permissions, missing
    files, ``NotImplementedError``, ``*Validation*``/``*Schema*`` errors); an
    HTTP status or telling phrase in the message; else ``TOOL_ERROR`` for tool
    reports (``ToolError``, ``is_error`` text) and the type name for anything else.
    """
    if isinstance(error, str):
        return _code_in_text(error) or _DEFAULT_TOOL_ERROR_CODE
    if isinstance(error, ToolError) and error.code and error.code != _DEFAULT_TOOL_ERROR_CODE:
        return error.code.upper()
    if (status := _status_of(error)) is not None:
        return str(status)
    type_code = _code_of_type(error)
    if type_code is not None:
        return type_code
    if (text_code := _code_in_text(str(error))) is not None:
        return text_code
    if isinstance(error, ToolError):
        return _DEFAULT_TOOL_ERROR_CODE
    if isinstance(error, OSError):
        return "OS_ERROR"
    return type(error).__name__


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


def classify(error: BaseException | str, tool: Tool | None = None, *,
             code: str | None = None) -> Classification:
    """``transient`` (worth retrying) or ``permanent``.

    ``error`` is an exception or the text of an ``is_error`` result. In order:
    the tool's ``permanent_codes``/``transient_codes`` (matched case-insensitively
    against :func:`error_code`, so a tool may also name a type such as
    ``"ValueError"``); ``ToolError(retryable=True)``; the known codes and HTTP
    statuses (408/425/429/5xx transient, other 4xx permanent); a tool's own report
    with no transient sign (``ToolError``, ``is_error`` text) is permanent; anything
    unknown is transient.
    """
    code = (code or error_code(error)).upper()
    if tool is not None:
        if code in {c.upper() for c in tool.permanent_codes}:
            return "permanent"
        if code in {c.upper() for c in tool.transient_codes}:
            return "transient"
    if isinstance(error, ToolError) and error.retryable:
        return "transient"
    if code in TRANSIENT_CODES:
        return "transient"
    if code in PERMANENT_CODES:
        return "permanent"
    if code.isdigit():
        status = int(code)
        if status >= 500 or status in TRANSIENT_STATUSES:
            return "transient"
        if 400 <= status < 500:
            return "permanent"
    if isinstance(error, (ToolError, str)):
        return "permanent"
    return "transient"


# --------------------------------------------------------------------------- backoff

def next_delay(attempt: int, policy: ToolRetry, rng: random.Random) -> float:
    """Seconds to wait before retry ``attempt`` (1 = the wait before the second attempt).

    ``min(initial_delay * multiplier**(attempt-1), max_delay)`` scaled by a random
    factor in ``[1 - jitter, 1 + jitter]``.
    """
    base = min(policy.initial_delay * policy.multiplier ** (attempt - 1), policy.max_delay)
    return max(0.0, base * (1.0 + rng.uniform(-policy.jitter, policy.jitter)))


def backoff_delays(policy: ToolRetry, rng: random.Random) -> list[float]:
    """The waits between ``policy.max_attempts`` attempts (before the total-time cap)."""
    return [next_delay(n, policy, rng) for n in range(1, policy.max_attempts)]


# --------------------------------------------------------------------------- circuit breaker

@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a tool's breaker opens, how long it stays open, and when it closes again."""

    failure_threshold: int = 5
    """Consecutive transient failures that open the breaker."""
    success_threshold: int = 2
    """Successful half-open trials that close it."""
    reset_timeout: float = 30.0
    """Seconds open before one trial call is let through (half-open)."""


class CircuitBreaker:
    """closed → (N consecutive transient failures) → open → (timeout) → half_open.

    Half-open lets one trial call through at a time: a success counts toward
    ``success_threshold`` (then closed), a transient failure re-opens it and
    restarts the timeout. Permanent errors never count.
    """

    def __init__(self, policy: BreakerPolicy | None = None, *,
                 clock: Clock = time.monotonic) -> None:
        self.policy = policy or BreakerPolicy()
        self.clock = clock
        self._state: BreakerState = "closed"
        self.failures = 0
        self.successes = 0
        self.opened_at = 0.0
        self.opens = 0
        self._trial = False

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose timeout has passed is half-open)."""
        if self._state == "open" and self.clock() - self.opened_at >= self.policy.reset_timeout:
            self._state = "half_open"
            self.successes = 0
            self._trial = False
        return self._state

    def allow(self) -> bool:
        """May a call go ahead now? Taking the half-open trial reserves it."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._trial:
            return False
        self._trial = True
        return True

    def record_success(self) -> None:
        state = self.state
        if state == "half_open":
            self._trial = False
            self.successes += 1
            if self.successes >= self.policy.success_threshold:
                self._state, self.failures, self.successes = "closed", 0, 0
        elif state == "closed":
            self.failures = 0

    def record_failure(self) -> bool:
        """Count a transient failure; True when this failure opened the breaker."""
        state = self.state
        if state == "open":
            return False
        if state == "half_open":
            self._open()
            return True
        self.failures += 1
        if self.failures >= self.policy.failure_threshold:
            self._open()
            return True
        return False

    def release(self) -> None:
        """Give back a half-open trial that ended without a verdict (permanent error,
        cancellation)."""
        self._trial = False

    def retry_after(self) -> float:
        """Seconds until an open breaker lets a trial through (0 unless open)."""
        if self.state != "open":
            return 0.0
        return max(0.0, self.policy.reset_timeout - (self.clock() - self.opened_at))

    def snapshot(self) -> dict[str, Any]:
        return {"state": self.state, "consecutive_failures": self.failures,
                "opens": self.opens, "retry_after": round(self.retry_after(), 3)}

    def _open(self) -> None:
        self._state = "open"
        self.opened_at = self.clock()
        self.opens += 1
        self.successes = 0
        self._trial = False


class Breakers:
    """The circuit breakers of every tool; one per process so sessions share them."""

    def __init__(self, policy: BreakerPolicy | None = None, *,
                 clock: Clock = time.monotonic) -> None:
        self.policy = policy or BreakerPolicy()
        self.clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, tool: str) -> CircuitBreaker:
        breaker = self._breakers.get(tool)
        if breaker is None:
            breaker = self._breakers[tool] = CircuitBreaker(self.policy, clock=self.clock)
        return breaker

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {name: b.snapshot() for name, b in sorted(self._breakers.items())}


# --------------------------------------------------------------------------- metrics

@dataclass(slots=True)
class ToolMetrics:
    """Counters of one tool since the process started.

    ``error_count`` counts failed attempts (``transient_error_count`` +
    ``permanent_error_count``); ``retry_count`` the retries made and
    ``retry_successes`` those that succeeded.
    """

    calls: int = 0
    error_count: int = 0
    transient_error_count: int = 0
    permanent_error_count: int = 0
    retry_count: int = 0
    retry_successes: int = 0
    circuit_breaker_opens: int = 0
    short_circuits: int = 0
    """Calls failed fast because the breaker was open."""
    timeout_count: int = 0
    skipped: int = 0

    @property
    def retry_success_rate(self) -> float | None:
        """Share of retries that succeeded (``None`` before the first retry)."""
        return self.retry_successes / self.retry_count if self.retry_count else None

    def error(self, classification: Classification) -> None:
        self.error_count += 1
        if classification == "transient":
            self.transient_error_count += 1
        else:
            self.permanent_error_count += 1

    def snapshot(self) -> dict[str, int | float | None]:
        return {
            "calls": self.calls, "error_count": self.error_count,
            "transient_error_count": self.transient_error_count,
            "permanent_error_count": self.permanent_error_count,
            "retry_count": self.retry_count, "retry_successes": self.retry_successes,
            "retry_success_rate": self.retry_success_rate,
            "circuit_breaker_opens": self.circuit_breaker_opens,
            "short_circuits": self.short_circuits, "timeout_count": self.timeout_count,
            "skipped": self.skipped,
        }


class ToolMetricsRegistry:
    """:class:`ToolMetrics` per tool name, in memory; one per process."""

    def __init__(self) -> None:
        self._metrics: dict[str, ToolMetrics] = {}

    def get(self, tool: str) -> ToolMetrics:
        metrics = self._metrics.get(tool)
        if metrics is None:
            metrics = self._metrics[tool] = ToolMetrics()
        return metrics

    def snapshot(self) -> dict[str, dict[str, int | float | None]]:
        return {name: m.snapshot() for name, m in sorted(self._metrics.items())}


# --------------------------------------------------------------------------- outcomes

@dataclass(frozen=True, slots=True)
class RawError:
    """Everything known about a call's final failure, for the error store.

    ``message`` is the error's own text (no "Tool 'x' failed" prefix);
    ``exception`` is ``None`` for ``is_error`` results, circuit-open and
    argument/unknown-tool failures.
    """

    tool: str
    message: str
    code: str
    classification: Classification
    details: Mapping[str, Any] = field(default_factory=dict)
    exception: BaseException | None = None
    attempts: int = 1
    timed_out: bool = False
    circuit_breaker_state: BreakerState = "closed"

    @property
    def error_type(self) -> str:
        return type(self.exception).__name__ if self.exception is not None else "ToolResult"

    @property
    def traceback(self) -> str:
        if self.exception is None:
            return ""
        return "".join(traceback.format_exception(self.exception))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description (``details`` values are stringified when needed)."""
        return {
            "tool": self.tool, "message": self.message, "code": self.code,
            "classification": self.classification, "error_type": self.error_type,
            "details": json.loads(json.dumps(dict(self.details), default=str)),
            "attempts": self.attempts, "timed_out": self.timed_out,
            "circuit_breaker_state": self.circuit_breaker_state,
            "traceback": self.traceback,
        }


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """How one call ended: the text for the model plus what happened on the way.

    ``content``/``is_error`` are what the model reads. ``attempts`` is 0 when the
    tool never ran. ``skipped`` calls were not run (``skip_reason``: a requirement
    failed, or the turn's time ran out); ``used_default`` ones got the tool's
    ``default``. ``error`` is set for calls that ran and failed, and for
    unknown-tool/invalid-argument calls.
    """

    call: ToolCall
    content: str
    is_error: bool
    classification: Classification | None = None
    attempts: int = 0
    skipped: bool = False
    skip_reason: SkipReason | None = None
    used_default: bool = False
    error: RawError | None = None

    @property
    def result(self) -> ToolResult:
        return ToolResult(self.content, self.is_error)

    @property
    def produced(self) -> bool:
        """Did the call give its dependants something to work with?"""
        return not self.is_error and (not self.skipped or self.used_default)


def describe_error(exc: BaseException) -> str:
    """The first line of ``exc`` (or its type name), at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


def default_failure_text(call: ToolCall, raw: RawError, timeout: float | None = None) -> str:
    """The model's text for a failure when no ``on_failure`` handler is plugged in."""
    if raw.timed_out and timeout is not None:
        text = f"Tool '{call.name}' timed out after {timeout:g}s."
    elif isinstance(raw.exception, ToolError) or raw.code == "CIRCUIT_OPEN":
        text = f"Tool '{call.name}' failed: [{raw.code}] {raw.message}"
    else:
        text = f"Tool '{call.name}' failed: {raw.message}"
    if raw.attempts > 1:
        text += f" (gave up after {raw.attempts} attempts)"
    return text


def turn_timeout_notice(outcomes: Sequence[ToolOutcome]) -> str:
    """A line for the user when the turn's time ran out, or ''."""
    skipped = [o.call.name for o in outcomes if o.skip_reason == "turn_timeout"]
    if not skipped:
        return ""
    done = [o.call.name for o in outcomes if o.skip_reason != "turn_timeout"]
    head = f"Finished {', '.join(done)}, but " if done else ""
    verb = "was" if len(skipped) == 1 else "were"
    return f"{head}{', '.join(skipped)} ran out of time and {verb} skipped."


# --------------------------------------------------------------------------- argument checks

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool,
    "object": dict, "array": list,
}


def check_arguments(tool: Tool, args: Mapping[str, Any]) -> str:
    """A one-line problem with ``args`` against the tool's schema, or ''."""
    if not isinstance(args, Mapping):
        return "arguments must be a JSON object"
    if "_invalid_arguments" in args:
        return "the arguments were not valid JSON"
    schema = tool.input_schema
    missing = [k for k in schema.get("required", ()) if k not in args]
    if missing:
        return "missing " + ", ".join(repr(k) for k in missing)
    props: Mapping[str, Any] = schema.get("properties", {})
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"unexpected argument {key!r}"
            continue
        expected = _JSON_TYPES.get(spec.get("type", ""))
        if expected and (not isinstance(value, expected) or
                         (expected is not bool and isinstance(value, bool))):
            return f"{key!r} must be {spec['type']}, got {json.dumps(value)[:40]}"
    return ""


# --------------------------------------------------------------------------- executor

@dataclass(slots=True)
class _Batch:
    """The shared state of one ``run_batch``."""

    calls: list[ToolCall]
    requires: list[list[int]]
    context: ToolContext
    trace: RunTrace
    on_result: OnResult | None
    on_failure: OnFailure | None
    outcomes: dict[int, ToolOutcome] = field(default_factory=dict)
    done: list[asyncio.Event] = field(default_factory=list)
    spans: dict[int, Span] = field(default_factory=dict)


@dataclass(slots=True)
class _Failure:
    """One failed attempt."""

    message: str
    code: str
    classification: Classification
    details: Mapping[str, Any]
    exception: BaseException | None
    timed_out: bool


class ToolExecutor:
    """Runs batches of tool calls with retries, breakers, timeouts and cascades.

    ``breakers`` and ``metrics`` are process-wide: pass the engine's so every
    run and session shares them (each executor makes its own otherwise).
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        settings: Settings,
        *,
        breakers: Breakers | None = None,
        metrics: ToolMetricsRegistry | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.tools = tools
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.rng = rng if rng is not None else random.Random()
        self.breakers = breakers if breakers is not None else Breakers(clock=clock)
        self.metrics = metrics if metrics is not None else ToolMetricsRegistry()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Metrics and breaker state per tool, for ``/status`` and observers."""
        breakers = self.breakers.snapshot()
        return {name: {**values, "breaker": breakers.get(name, {"state": "closed"})}
                for name, values in self.metrics.snapshot().items()}

    async def run_batch(
        self,
        calls: Sequence[ToolCall],
        context: ToolContext,
        *,
        trace: RunTrace,
        on_call: OnCall | None = None,
        on_result: OnResult | None = None,
        on_failure: OnFailure | None = None,
    ) -> list[ToolOutcome]:
        """Run ``calls`` concurrently (dependants after their requirements).

        ``on_call`` is awaited for every call before any runs, ``on_result`` once
        per call as it ends (skipped ones included); ``on_failure(call, raw)``
        returns the model's text for a failed call. Within ``turn_timeout`` the
        calls still running are cancelled and reported as skipped. Returns one
        outcome per call, in call order; raises only ``CancelledError`` (and
        what the callbacks raise, ``on_failure`` excepted).
        """
        batch = _Batch(list(calls), self._requirements(calls), context, trace, on_result,
                       on_failure, done=[asyncio.Event() for _ in calls])
        if not batch.calls:
            return []
        if on_call is not None:
            for call in batch.calls:
                await on_call(call)
        tasks = [asyncio.create_task(self._run_one(batch, i)) for i in range(len(calls))]
        turn_timeout = self.settings.turn_timeout
        try:
            async with asyncio.timeout(turn_timeout):
                await asyncio.wait(tasks)
        except TimeoutError:
            log.warning("tool calls of run %s passed the %gs turn limit; skipping %d",
                        context.run_id, turn_timeout, sum(not t.done() for t in tasks))
        finally:
            pending = [t for t in tasks if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for task in tasks:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
        outcomes: list[ToolOutcome] = []
        for i in range(len(batch.calls)):
            outcome = batch.outcomes.get(i)
            if outcome is None:
                outcome = self._skip_for_turn_timeout(batch, i)
                if on_result is not None:
                    await on_result(outcome)
            outcomes.append(outcome)
        return outcomes

    # ---- dependencies

    def _requirements(self, calls: Sequence[ToolCall]) -> list[list[int]]:
        """For each call, the calls of the batch it must wait for (cycles broken)."""
        edges: list[list[int]] = []
        for i, call in enumerate(calls):
            tool = self.tools.get(call.name)
            needs = set(tool.requires) if tool is not None else set()
            edges.append([j for j, other in enumerate(calls) if j != i and other.name in needs])
        # Drop the edges that close a cycle, so no call waits for itself.
        colour = [0] * len(calls)  # 0 new, 1 on the current path, 2 finished

        def visit(i: int) -> None:
            colour[i] = 1
            for j in list(edges[i]):
                if colour[j] == 1:
                    edges[i].remove(j)
                elif colour[j] == 0:
                    visit(j)
            colour[i] = 2

        for i in range(len(calls)):
            if colour[i] == 0:
                visit(i)
        return edges

    async def _run_one(self, batch: _Batch, i: int) -> None:
        needs = batch.requires[i]
        if needs:
            await asyncio.gather(*(batch.done[j].wait() for j in needs))
            failed = [batch.calls[j].name for j in needs if not batch.outcomes[j].produced]
            outcome = (self._skip_for_dependency(batch, i, failed) if failed
                       else await self._call(batch, i))
        else:
            outcome = await self._call(batch, i)
        batch.outcomes[i] = outcome
        batch.done[i].set()
        if batch.on_result is not None:
            await batch.on_result(outcome)

    # ---- one call

    def _span(self, batch: _Batch, i: int) -> Span:
        span = batch.spans.get(i)
        if span is None:
            call = batch.calls[i]
            span = batch.trace.start("tool", call.name, call_id=call.id, decisions=[])
            batch.spans[i] = span
        return span

    async def _call(self, batch: _Batch, i: int) -> ToolOutcome:
        call = batch.calls[i]
        span = self._span(batch, i)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            text = f"Unknown tool '{call.name}'. Available tools: {known}."
            failure = _Failure(text, "UNKNOWN_TOOL", "permanent", {}, None, False)
            _decide(span, call.name, "fail", "permanent", failure=failure, retry_count=0,
                    breaker_state=None)
            return self._fail_preflight(span, call, failure, text)
        problem = check_arguments(tool, call.arguments)
        if problem:
            text = f"Tool '{call.name}' was called with invalid arguments: {problem}"
            failure = _Failure(problem, "INVALID_ARGUMENTS", "permanent", {}, None, False)
            metrics = self.metrics.get(tool.name)
            metrics.calls += 1
            metrics.error("permanent")
            _decide(span, call.name, "fail", "permanent", failure=failure, retry_count=0,
                    breaker_state=self.breakers.get(tool.name).state)
            return self._fail_preflight(span, call, failure, text)
        return await self._call_with_retries(batch, span, call, tool)

    def _fail_preflight(self, span: Span, call: ToolCall, failure: _Failure,
                        text: str) -> ToolOutcome:
        raw = RawError(call.name, failure.message, failure.code, "permanent", attempts=0)
        span.end(error=True, is_error=True, attempts=0, classification="permanent",
                 error_code=failure.code)
        return ToolOutcome(call, text, True, "permanent", 0, error=raw)

    async def _call_with_retries(self, batch: _Batch, span: Span, call: ToolCall,
                                 tool: Tool) -> ToolOutcome:
        policy = tool.retry or DEFAULT_RETRY
        breaker = self.breakers.get(tool.name)
        metrics = self.metrics.get(tool.name)
        metrics.calls += 1
        timeout = tool.timeout or self.settings.tool_timeout
        started = self.clock()
        attempts = 0
        failure: _Failure | None = None
        timed_out = False
        while True:
            if not breaker.allow():
                metrics.short_circuits += 1
                wait = breaker.retry_after()
                failure = _Failure(
                    f"'{tool.name}' failed repeatedly and is paused; it can be tried again "
                    f"in {wait:.0f}s.", "CIRCUIT_OPEN", "transient",
                    {"retry_after": round(wait, 3)}, None, False)
                _decide(span, tool.name, "open", "breaker open", failure=failure,
                        retry_count=max(0, attempts - 1), breaker_state=breaker.state)
                break
            trial = breaker.state == "half_open"  # allow() gave this call the one trial
            attempts += 1
            if attempts > 1:
                metrics.retry_count += 1
            try:
                failure, result = await self._attempt(tool, call, batch.context, timeout)
            except BaseException:
                if trial:
                    breaker.release()
                raise
            if failure is None:
                breaker.record_success()
                if attempts > 1:
                    metrics.retry_successes += 1
                span.end(is_error=False, attempts=attempts, retries=attempts - 1,
                         timed_out=timed_out, circuit_breaker_state=breaker.state)
                return ToolOutcome(call, result, False, None, attempts)
            metrics.error(failure.classification)
            if failure.timed_out:
                metrics.timeout_count += 1
                timed_out = True
            retries = attempts - 1
            if failure.classification == "permanent":
                if trial:
                    breaker.release()
                _decide(span, tool.name, "fail", "permanent", failure=failure,
                        retry_count=retries, breaker_state=breaker.state)
                break
            if breaker.record_failure():
                metrics.circuit_breaker_opens += 1
                log.warning("circuit breaker opened for tool %s", tool.name)
                _decide(span, tool.name, "open", "breaker opened", failure=failure,
                        retry_count=retries, breaker_state=breaker.state)
                break
            if attempts >= policy.max_attempts:
                _decide(span, tool.name, "fail", "max attempts", failure=failure,
                        retry_count=retries, breaker_state=breaker.state)
                break
            delay = next_delay(attempts, policy, self.rng)
            if self.clock() - started + delay > policy.max_total:
                _decide(span, tool.name, "fail", "max total time", failure=failure,
                        retry_count=retries, breaker_state=breaker.state,
                        elapsed_ms=round((self.clock() - started) * 1000, 1))
                break
            _decide(span, tool.name, "retry", "transient", failure=failure,
                    retry_count=retries, breaker_state=breaker.state,
                    delay_ms=round(delay * 1000, 1))
            await self.sleep(delay)
        raw = RawError(tool.name, failure.message, failure.code, failure.classification,
                       failure.details, failure.exception, attempts, failure.timed_out,
                       breaker.state)
        text = await self._failure_text(batch, call, raw, timeout)
        span.end(error=True, is_error=True, attempts=attempts, retries=max(0, attempts - 1),
                 classification=raw.classification, error_code=raw.code, timed_out=timed_out,
                 circuit_breaker_state=breaker.state)
        return ToolOutcome(call, text, True, raw.classification, attempts, error=raw)

    async def _attempt(self, tool: Tool, call: ToolCall, context: ToolContext,
                       limit: float) -> tuple[_Failure | None, str]:
        """Run the tool once: (None, text) on success, (failure, '') otherwise."""
        error: BaseException | str
        try:
            async with asyncio.timeout(limit) as scope:
                out = await tool.execute(context, call.arguments)
        except TimeoutError as exc:
            if scope.expired():
                code = "TIMEOUT"
                return _Failure(f"timed out after {limit:g}s", code,
                                classify(exc, tool, code=code), {"timeout": limit}, exc,
                                True), ""
            error = exc
        except Exception as exc:
            if not isinstance(exc, ToolError):
                log.warning("tool %s raised", tool.name, exc_info=exc)
            error = exc
        else:
            if not isinstance(out, ToolResult):
                return None, str(out)
            if not out.is_error:
                return None, out.content
            error = out.content
        code = error_code(error)
        if isinstance(error, str):
            return _Failure(error, code, classify(error, tool, code=code), {}, None, False), ""
        details = error.details if isinstance(error, ToolError) else {}
        message = str(error) if isinstance(error, ToolError) else describe_error(error)
        return _Failure(message, code, classify(error, tool, code=code), details, error,
                        isinstance(error, TimeoutError)), ""

    async def _failure_text(self, batch: _Batch, call: ToolCall, raw: RawError,
                            limit: float) -> str:
        if batch.on_failure is not None:
            try:
                return await batch.on_failure(call, raw)
            except Exception:
                log.exception("the failure handler raised for tool %s", call.name)
        return default_failure_text(call, raw, limit)

    # ---- skips

    def _skip_for_dependency(self, batch: _Batch, i: int, failed: list[str]) -> ToolOutcome:
        call = batch.calls[i]
        tool = self.tools[call.name]  # only known tools have requirements
        span = self._span(batch, i)
        self.metrics.get(tool.name).skipped += 1
        names = ", ".join(f"'{n}'" for n in dict.fromkeys(failed))
        if tool.default is not None:
            content, is_error, reason = tool.default, False, "requirement failed; default used"
        elif tool.optional:
            content = (f"Tool '{call.name}' was skipped (optional): it needs the result of "
                       f"{names}, which failed.")
            is_error, reason = False, "requirement failed; optional"
        else:
            content = (f"Tool '{call.name}' was not run: it needs the result of {names}, "
                       "which failed.")
            is_error, reason = True, "requirement failed"
        _decide(span, call.name, "skip", reason, retry_count=0,
                breaker_state=self.breakers.get(tool.name).state, failed_requirements=failed,
                used_default=tool.default is not None)
        span.end(error=is_error, is_error=is_error, attempts=0, skipped=True,
                 skip_reason="dependency")
        return ToolOutcome(call, content, is_error, None, 0, skipped=True,
                           skip_reason="dependency", used_default=tool.default is not None)

    def _skip_for_turn_timeout(self, batch: _Batch, i: int) -> ToolOutcome:
        call = batch.calls[i]
        span = self._span(batch, i)
        limit = self.settings.turn_timeout
        if call.name in self.tools:
            self.metrics.get(call.name).skipped += 1
        content = (f"Tool '{call.name}' was skipped: the time limit for this turn's tool "
                   f"calls ({limit:g}s) ran out before it finished.")
        _decide(span, call.name, "skip", "turn timeout", retry_count=0, breaker_state=None,
                turn_timeout=limit)
        span.end(error=True, is_error=True, skipped=True, skip_reason="turn_timeout",
                 timed_out=True)
        return ToolOutcome(call, content, True, "transient", 0, skipped=True,
                           skip_reason="turn_timeout")


def _decide(span: Span, tool: str, decision: Decision, reason: str, *,
            failure: _Failure | None = None, retry_count: int,
            breaker_state: BreakerState | None, **extra: Any) -> None:
    """Append one decision to the call's span (spec 8.2's ``ToolError`` record)."""
    record: dict[str, Any] = {
        "event_type": "ToolError" if failure is not None else "ToolSkipped",
        "tool_id": tool,
        "decision": decision,
        "reason": reason,
        "retry_count": retry_count,
        "circuit_breaker_state": breaker_state,
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }
    if failure is not None:
        record.update(error=failure.message[:300], code=failure.code,
                      classification=failure.classification, timed_out=failure.timed_out)
    record.update(extra)
    span.attributes.setdefault("decisions", []).append(record)
