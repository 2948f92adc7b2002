"""Run traces: a root span per run, an LLM span per model call, a tool span per tool call.

Spans are collected in memory while the run works and stored with the run's
flush (or on their own for failed and cancelled runs), so tracing costs no
extra database round trip on the hot path. A run's :class:`RunRecord` (how it
ended, what it cost) and each span have a table row (:func:`run_row`, :func:`span_row`).

Run and span ids (:func:`hex_id`) come from a generator of this module, seeded
from the kernel once, and again in a forked child so the two processes do not
hand out the same ids. They are unique, not secret: tokens and pairing codes use
:mod:`secrets`.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def hex_id(chars: int = 32) -> str:
    """``chars`` random lowercase hex digits (32: as ``uuid.uuid4().hex``, 128 bits)."""
    return f"{_rng.getrandbits(chars * 4):0{chars}x}"

SpanKind = Literal["agent", "llm", "tool", "patterns", "judge"]

OUTPUT_PREVIEW_CHARS = 500
VERBOSE_INPUT_CHARS = 50_000


@dataclass(slots=True)
class Span:
    """One timed step of a run. ``attributes`` holds kind-specific fields.

    ``llm``: provider, model, iteration, input_tokens, output_tokens,
    cache_read_tokens and cache_write_tokens (parts of input_tokens),
    output_preview (and input when verbose). ``tool``: name, call_id, is_error, and the
    output_preview of a successful call.
    ``patterns``: matched (name: score). ``judge``: judge, attempt, strategy,
    threshold, score, reasons, then the attempt's aggregate_score and passed.
    ``agent`` (root): session_key, status, error_message.
    """

    run_id: str
    kind: SpanKind
    name: str
    started_at: float
    span_id: str = field(default_factory=lambda: hex_id(16))
    parent_id: str | None = None
    duration_ms: float = 0.0
    error: bool = False
    attributes: dict[str, Any] = field(default_factory=dict)
    _t0: float = field(default_factory=time.monotonic, repr=False)

    def end(self, *, error: bool = False, **attributes: Any) -> None:
        """Close the span now, marking ``error`` and adding ``attributes``."""
        self.duration_ms = (time.monotonic() - self._t0) * 1000
        self.error = self.error or error
        self.attributes.update(attributes)


class RunTrace:
    """Collects the spans of one run under a root ``agent`` span."""

    def __init__(self, run_id: str, session_key: str, *, verbose: bool = False) -> None:
        self.run_id = run_id
        self.verbose = verbose
        self.root = Span(run_id, "agent", "run", time.time(),
                         attributes={"session_key": session_key})
        self.spans: list[Span] = [self.root]

    def start(self, kind: SpanKind, name: str, **attributes: Any) -> Span:
        """Open a child span of the root."""
        span = Span(self.run_id, kind, name, time.time(), parent_id=self.root.span_id,
                    attributes=dict(attributes))
        self.spans.append(span)
        return span

    def finish(self, status: str, error: str = "") -> list[Span]:
        """Close the root span with the run's outcome; returns every span.

        Spans still open (a tool cut off by cancellation) are closed too, as
        errors, so a cancelled run's trace is complete.
        """
        for span in self.spans[1:]:
            if span.duration_ms == 0.0:
                span.end(error=True, interrupted=True)
        self.root.end(error=status in ("failed", "cancelled"), status=status, error_message=error)
        return self.spans


def preview(text: str, limit: int = OUTPUT_PREVIEW_CHARS) -> str:
    """The first ``limit`` characters of ``text``."""
    return text if len(text) <= limit else text[:limit]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The trace record of one run: how it ended and what it cost."""

    run_id: str
    session_key: str
    status: str
    started_at: float
    ended_at: float
    iterations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    error: str = ""
    cache_read_tokens: int = 0
    """Of ``input_tokens``, those read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the prompt cache."""


def run_row(r: RunRecord) -> tuple[Any, ...]:
    """The ``runs`` table row for ``r``."""
    return (r.run_id, r.session_key, r.status, r.started_at, r.ended_at, r.iterations,
            r.input_tokens, r.output_tokens, r.model, r.error, r.cache_read_tokens,
            r.cache_write_tokens)


def span_row(span: Span) -> tuple[Any, ...]:
    """The ``spans`` table row for ``span``."""
    return (span.span_id, span.run_id, span.parent_id, span.kind, span.name, span.started_at,
            span.duration_ms, int(span.error), json.dumps(span.attributes, default=str))


def attributes_of(raw: str) -> Mapping[str, Any]:
    """Decode a stored ``attributes`` column."""
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


class SpanExporter(Protocol):
    """Something that ships finished spans elsewhere (OpenTelemetry)."""

    def export(self, spans: Sequence[Span]) -> None:
        """Export one run's spans; must not raise."""
