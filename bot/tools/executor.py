"""Resilient tool execution: retries, circuit breakers, timeouts, cascades.

One model answer's tool calls are a *batch*. :class:`ToolExecutor` runs a batch
concurrently and gives back one :class:`~bot.tools.outcomes.ToolOutcome` per
call, in call order:

- every failure (a raised :class:`~bot.contracts.tools.ToolError`, any unexpected
  exception, an ``is_error`` result, a per-tool timeout) is classified
  ``transient`` or ``permanent`` (:func:`bot.tools.classify.classify`);
- transient failures are retried with exponential backoff and jitter
  (:func:`retry_policy`: the tool's :class:`~bot.contracts.tools.ToolRetry` as a
  :class:`~bot.resilience.retry.RetryPolicy`), invisibly to the model;
- a circuit breaker per tool (per tool and key for a tool with a ``breaker_key``;
  shared by every session through one :class:`~bot.tools.breakers.Breakers`
  registry) fails calls fast after repeated transient failures;
- a call whose ``requires`` failed in the same batch is skipped or given its
  ``default``; independent calls go on;
- the per-turn timeout keeps finished results and skips the calls still running.

Every decision is appended to the call's trace span (``attributes["decisions"]``)
and counted in :class:`~bot.tools.metrics.ToolMetrics`. All waiting between
attempts goes through the injected ``sleep`` and ``clock`` so tests control time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.config.settings import Settings
from bot.contracts.llm import ToolCall
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolResult, ToolRetry
from bot.observability.tracing import RunTrace, Span, preview
from bot.resilience.breaker import CircuitBreaker
from bot.resilience.retry import RetryPolicy
from bot.tools.args import check_arguments
from bot.tools.breakers import Breakers
from bot.tools.classify import classify, error_code
from bot.tools.dependencies import requirements
from bot.tools.metrics import ToolMetricsRegistry
from bot.tools.outcomes import (
    Failure,
    RawError,
    ToolOutcome,
    default_failure_text,
    describe_error,
    record_decision,
)

__all__ = ["DEFAULT_RETRY", "ToolExecutor", "retry_policy"]

log = logging.getLogger("roost.tools.executor")

_EMPTY = ToolResult("")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]
OnCall = Callable[[ToolCall], Awaitable[None]]
OnResult = Callable[[ToolOutcome], Awaitable[None]]
OnFailure = Callable[[ToolCall, RawError], Awaitable[str]]

DEFAULT_RETRY = ToolRetry()


def retry_policy(retry: ToolRetry) -> RetryPolicy:
    """A tool's declared :class:`ToolRetry` as the shared policy type (jitter both ways)."""
    return RetryPolicy(attempts=retry.max_attempts, base_delay=retry.initial_delay,
                       multiplier=retry.multiplier, max_delay=retry.max_delay,
                       jitter=retry.jitter, max_total=retry.max_total)


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
        batch = _Batch(list(calls), requirements(calls, self.tools), context, trace, on_result,
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
            failure = Failure(text, "UNKNOWN_TOOL", "permanent", {}, None, False)
            record_decision(span, call.name, "fail", "permanent", failure=failure, retry_count=0,
                            breaker_state=None)
            return self._fail_preflight(span, call, failure, text)
        problem = check_arguments(tool, call.arguments)
        if problem:
            text = f"Tool '{call.name}' was called with invalid arguments: {problem}"
            failure = Failure(problem, "INVALID_ARGUMENTS", "permanent", {}, None, False)
            metrics = self.metrics.get(tool.name)
            metrics.calls += 1
            metrics.error("permanent")
            record_decision(span, call.name, "fail", "permanent", failure=failure, retry_count=0,
                            breaker_state=self._breaker(tool, batch.context, call).state)
            return self._fail_preflight(span, call, failure, text)
        return await self._call_with_retries(batch, span, call, tool)

    def _fail_preflight(self, span: Span, call: ToolCall, failure: Failure,
                        text: str) -> ToolOutcome:
        raw = RawError(call.name, failure.message, failure.code, "permanent", attempts=0)
        span.end(error=True, is_error=True, attempts=0, classification="permanent",
                 error_code=failure.code)
        return ToolOutcome(call, text, True, "permanent", 0, error=raw)

    async def _call_with_retries(self, batch: _Batch, span: Span, call: ToolCall,
                                 tool: Tool) -> ToolOutcome:
        policy = retry_policy(tool.retry or DEFAULT_RETRY)
        breaker = self._breaker(tool, batch.context, call)
        metrics = self.metrics.get(tool.name)
        metrics.calls += 1
        timeout = tool.timeout or self.settings.tool_timeout
        started = self.clock()
        attempts = 0
        failure: Failure | None = None
        timed_out = False
        while True:
            ticket = breaker.try_admit()
            if ticket is None:
                metrics.short_circuits += 1
                wait = breaker.retry_after()
                failure = Failure(
                    f"'{tool.name}' failed repeatedly and is paused; it can be tried again "
                    f"in {wait:.0f}s.", "CIRCUIT_OPEN", "transient",
                    {"retry_after": round(wait, 3)}, None, False)
                record_decision(span, tool.name, "open", "breaker open", failure=failure,
                                retry_count=max(0, attempts - 1), breaker_state=breaker.state)
                break
            attempts += 1
            if attempts > 1:
                metrics.retry_count += 1
            try:
                failure, result = await self._attempt(tool, call, batch.context, timeout)
            except BaseException:
                breaker.record_abandoned(ticket)
                raise
            if failure is None:
                breaker.record_success(ticket)
                if attempts > 1:
                    metrics.retry_successes += 1
                span.end(is_error=False, attempts=attempts, retries=attempts - 1,
                         timed_out=timed_out, circuit_breaker_state=breaker.state,
                         output_preview=preview(result.content))
                return ToolOutcome(call, result.content, False, None, attempts,
                                   parts=result.parts, only_tools=result.only_tools)
            metrics.error(failure.classification)
            if failure.timed_out:
                metrics.timeout_count += 1
                timed_out = True
            retries = attempts - 1
            if failure.classification == "permanent":
                # Says nothing about the tool's health: a trial is given back.
                breaker.record_abandoned(ticket)
                record_decision(span, tool.name, "fail", "permanent", failure=failure,
                                retry_count=retries, breaker_state=breaker.state)
                break
            if breaker.record_failure(ticket, failure.message):
                metrics.circuit_breaker_opens += 1
                record_decision(span, tool.name, "open", "breaker opened", failure=failure,
                                retry_count=retries, breaker_state=breaker.state)
                break
            if attempts >= policy.attempts:
                record_decision(span, tool.name, "fail", "max attempts", failure=failure,
                                retry_count=retries, breaker_state=breaker.state)
                break
            delay = policy.delay(attempts, rng=self.rng)
            if not policy.within_total(self.clock() - started + delay):
                record_decision(span, tool.name, "fail", "max total time", failure=failure,
                                retry_count=retries, breaker_state=breaker.state,
                                elapsed_ms=round((self.clock() - started) * 1000, 1))
                break
            record_decision(span, tool.name, "retry", "transient", failure=failure,
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

    def _breaker(self, tool: Tool, context: ToolContext, call: ToolCall) -> CircuitBreaker:
        """The breaker ``call`` counts against: the tool's, or its key's."""
        key = ""
        if tool.breaker_key is not None:
            try:
                key = tool.breaker_key(context, call.arguments)
            except Exception:  # a bug in the key function must not fail the call
                log.exception("breaker key of tool %s failed; using the tool's breaker",
                              tool.name)
        return self.breakers.get(tool.name, key)

    async def _attempt(self, tool: Tool, call: ToolCall, context: ToolContext,
                       limit: float) -> tuple[Failure | None, ToolResult]:
        """Run the tool once: (None, its result) on success, (failure, empty) otherwise."""
        error: BaseException | str
        try:
            async with asyncio.timeout(limit) as scope:
                out = await tool.execute(context, call.arguments)
        except TimeoutError as exc:
            if scope.expired():
                code = "TIMEOUT"
                return Failure(f"timed out after {limit:g}s", code,
                                classify(exc, tool, code=code), {"timeout": limit}, exc,
                                True), _EMPTY
            error = exc
        except Exception as exc:
            if not isinstance(exc, ToolError):
                log.warning("tool %s raised", tool.name, exc_info=exc)
            error = exc
        else:
            if not isinstance(out, ToolResult):
                return None, ToolResult(str(out))
            if not out.is_error:
                return None, out
            error = out.content
        code = error_code(error)
        if isinstance(error, str):
            return Failure(error, code, classify(error, tool, code=code), {}, None, False), _EMPTY
        details = error.details if isinstance(error, ToolError) else {}
        message = str(error) if isinstance(error, ToolError) else describe_error(error)
        return Failure(message, code, classify(error, tool, code=code), details, error,
                        isinstance(error, TimeoutError)), _EMPTY

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
        record_decision(span, call.name, "skip", reason, retry_count=0,
                        breaker_state=self._breaker(tool, batch.context, call).state,
                        failed_requirements=failed, used_default=tool.default is not None)
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
        record_decision(span, call.name, "skip", "turn timeout", retry_count=0, breaker_state=None,
                        turn_timeout=limit)
        span.end(error=True, is_error=True, skipped=True, skip_reason="turn_timeout",
                 timed_out=True)
        return ToolOutcome(call, content, True, "transient", 0, skipped=True,
                           skip_reason="turn_timeout")
