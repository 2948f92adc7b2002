"""Judges inside a run: every verdict becomes a ``judge`` span of the run's trace."""

from __future__ import annotations

from collections.abc import Callable

from bot.contracts.judge import Judge, Verdict
from bot.observability.tracing import RunTrace, Span
from bot.tools.outcomes import describe_error


class TracedJudge:
    """A judge whose every verdict becomes a ``judge`` span of the run's trace."""

    def __init__(self, inner: Judge, trace: RunTrace, attempt: Callable[[], int],
                 spans: list[Span], strategy: str, threshold: float) -> None:
        self.inner = inner
        self.trace = trace
        self.attempt = attempt
        self.spans = spans
        self.name = inner.name
        self.weight = inner.weight
        self.strategy = strategy
        self.threshold = threshold

    async def score(self, request_text: str, reply: str,
                    criteria: str | None = None) -> Verdict:
        span = self.trace.start("judge", self.name, judge=self.name, attempt=self.attempt(),
                                strategy=self.strategy, threshold=self.threshold)
        self.spans.append(span)
        try:
            verdict = await self.inner.score(request_text, reply, criteria)
        except BaseException as exc:
            span.end(error=True, error_message=describe_error(exc))
            raise
        span.end(score=round(verdict.score, 4), reasons=verdict.reasons[:500])
        return verdict
