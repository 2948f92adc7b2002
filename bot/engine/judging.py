"""Judges inside a run: the reply is judged and corrected, every verdict a ``judge`` span."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from bot.agents.judge import self_correct
from bot.agents.router import Agent, JudgeStats
from bot.contracts.judge import Judge, Verdict
from bot.contracts.llm import BudgetRefused, ChatMessage
from bot.contracts.sanitize import Sanitizer, run_pipeline
from bot.observability.tracing import RunTrace, Span
from bot.tools.outcomes import describe_error

log = logging.getLogger("roost.engine.judging")

Generate = Callable[[list[ChatMessage]], Awaitable[tuple[str, list[ChatMessage]]]]
"""``convo -> (answer, convo)``: the run's model iterations on a conversation."""


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


async def judge_reply(
    agent: Agent, convo: list[ChatMessage], first: tuple[str, str], request_text: str,
    generate: Generate, *, trace: RunTrace, sanitizers: Sequence[Sanitizer],
    stats: JudgeStats, run_id: str,
) -> tuple[str, str]:
    """Judge the reply; regenerate with the judges' feedback until it passes.

    ``first`` is ``(raw, sanitized)`` of the reply the run produced. Returns
    ``(raw, sanitized)`` of the reply to deliver. A judge that fails (its
    provider is down) leaves the latest reply unjudged rather than failing the
    run; cancellation (``/stop``) and a budget refusing a judge's or a correction's
    model call propagate.
    """
    config = agent.config.judge
    assert config is not None
    latest = first
    attempts = 0
    spans: list[Span] = []

    async def attempt(correction: str | None) -> str:
        nonlocal latest, convo, attempts
        attempts += 1
        if correction is None:
            return latest[1]
        log.info("run %s: reply rejected by the judges; attempt %d", run_id[:8], attempts)
        convo.append(ChatMessage("assistant", latest[0]))
        convo.append(ChatMessage("user", correction))
        raw, convo = await generate(convo)
        latest = (raw, run_pipeline(raw, sanitizers))
        return latest[1]

    judges = [TracedJudge(j, trace, lambda: attempts, spans, config.strategy, config.threshold)
              for j in agent.judges]
    try:
        result = await self_correct(attempt, judges, strategy=config.strategy,
                                    threshold=config.threshold,
                                    max_retries=config.max_retries,
                                    request_text=request_text)
    except BudgetRefused:
        raise  # no budget left to judge or correct: the run ends with the refusal
    except Exception as exc:
        stats.failed()
        trace.root.attributes["judge_error"] = describe_error(exc)
        log.warning("run %s: a judge failed (%s); the reply goes out unjudged",
                    run_id[:8], describe_error(exc))
        return latest
    stats.record(result)
    for span in spans:
        index = span.attributes["attempt"] - 1
        if index < len(result.scores):
            span.attributes["aggregate_score"] = round(result.scores[index], 4)
            span.attributes["passed"] = result.passed and index == result.attempts - 1
    trace.root.attributes.update(judge_attempts=result.attempts, judge_passed=result.passed,
                                 judge_score=round(result.score, 4))
    return latest
