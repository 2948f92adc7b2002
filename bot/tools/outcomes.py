"""How a tool call ended: :class:`ToolOutcome` (what the model reads and what
happened on the way), :class:`RawError` (everything known about a failure, for
the error store), the texts the model and the user read about failures, and the
decision records the executor appends to a call's trace span."""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from bot.contracts.llm import ContentPart, ToolCall
from bot.contracts.tools import ToolError, ToolResult
from bot.observability.tracing import Span
from bot.resilience.breaker import BreakerState
from bot.tools.classify import Classification

__all__ = [
    "Decision",
    "Failure",
    "RawError",
    "SkipReason",
    "ToolOutcome",
    "default_failure_text",
    "describe_error",
    "record_decision",
    "turn_timeout_notice",
]

SkipReason = Literal["dependency", "turn_timeout"]
Decision = Literal["retry", "fail", "skip", "open"]


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
    parts: tuple[ContentPart, ...] = ()
    """Files the tool's result carries for the model (:attr:`ToolResult.parts`)."""
    only_tools: frozenset[str] | None = None
    """The tools the rest of the run is narrowed to (:attr:`ToolResult.only_tools`)."""

    @property
    def result(self) -> ToolResult:
        return ToolResult(self.content, self.is_error, self.parts, self.only_tools)

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


@dataclass(slots=True)
class Failure:
    """One failed attempt, as the executor saw it."""

    message: str
    code: str
    classification: Classification
    details: Mapping[str, Any]
    exception: BaseException | None
    timed_out: bool


def record_decision(span: Span, tool: str, decision: Decision, reason: str, *,
                    failure: Failure | None = None, retry_count: int,
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
