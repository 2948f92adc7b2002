"""The tool side of one run: the model's calls executed, summarized and watched for loops.

A run makes its :class:`ToolTurns` at the model's first tool call (a plain reply
never needs one). Each batch of calls runs through the run's
:class:`bot.tools.executor.ToolExecutor`; every execution is recorded in the run's
execution summary (:mod:`bot.engine.exec_summary`), a large successful result is
stored through the sink or cut, and a call repeated with identical arguments
:data:`LOOP_REPEATS` times earns the model a warning in the next request's note.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, ToolCall
from bot.contracts.tools import ToolContext, ToolResult
from bot.engine.exec_summary import ExecutionSummary
from bot.engine.requests import Emit, RunSink
from bot.observability.tracing import RunTrace
from bot.storage.inbox import RunJournal
from bot.tools.executor import ToolExecutor
from bot.tools.metrics import ToolMetricsRegistry
from bot.tools.outcomes import RawError, ToolOutcome, turn_timeout_notice
from bot.tools.structured_errors import extract

log = logging.getLogger("roost.engine.tool_turns")

LOOP_REPEATS = 3
"""Identical tool calls in one run before the model is warned it is looping."""


class ToolTurns:
    """Runs one run's tool calls; what the model should read about them is :meth:`note`.

    ``observed``: whether anyone listens to the run's events (tool results are
    announced only then); ``journal``: where finished results are recorded for a
    run repeated after a crash.
    """

    def __init__(self, executor: ToolExecutor, settings: Settings, *, sink: RunSink,
                 trace: RunTrace, emit: Emit, metrics: ToolMetricsRegistry, session_key: str,
                 journal: RunJournal | None, observed: bool) -> None:
        self.executor = executor
        self.settings = settings
        self.sink = sink
        self.trace = trace
        self.emit = emit
        self.metrics = metrics
        self.session_key = session_key
        self.journal = journal
        self.observed = observed
        self.summary = ExecutionSummary()  # one per run = one per user turn
        self.repeats: dict[tuple[str, str], int] = {}
        self.warning = ""
        """A loop warning for the next request's note only."""

    async def answer(self, calls: Sequence[ToolCall], context: ToolContext, *,
                     replayed: bool) -> list[ChatMessage]:
        """The tool messages answering ``calls``, in order, once their results are
        journaled (``replayed``: the journal's results of an interrupted earlier run
        of the message are used instead of running the calls again)."""
        journal = self.journal
        results = await self.run(
            calls, context, journal.replayed(calls) if replayed and journal else None)
        if journal is not None and not replayed:
            # Queued results join this commit: the model is asked again only
            # once a crash could no longer make it look as if they never ran.
            await journal.sync()
        return [ChatMessage("tool", result.content, tool_call_id=call.id, tool_name=call.name,
                            is_error=result.is_error, parts=result.parts)
                for call, result in zip(calls, results, strict=True)]

    async def run(self, calls: Sequence[ToolCall], context: ToolContext,
                  replayed: Mapping[str, ToolResult] | None = None) -> list[ToolResult]:
        """The results of ``calls``, in order (``replayed``: the results an interrupted
        earlier run of the message recorded, used instead of running them again)."""
        self.warning = self._loop_warning(calls)
        if replayed is not None:
            results = []
            for call in calls:
                result = replayed[call.id]
                self.summary.record(call.name, call.arguments, not result.is_error,
                                    result.content, None)
                results.append(result)
            return results
        outcomes = await self.executor.run_batch(
            calls, context, trace=self.trace, on_call=self._on_call,
            on_result=self._on_result,
            on_failure=self._on_failure if self.sink.on_tool_failure else None)
        notice = turn_timeout_notice(outcomes)
        if notice:
            await self.emit("activity", phase="turn_timeout", notice=notice)
        results = []
        for outcome in outcomes:
            result = outcome.result
            raw = outcome.error
            # From the raw error: the text the model sees may be the error channel's.
            self.summary.record(
                outcome.call.name, outcome.call.arguments, not outcome.is_error,
                raw.message if raw else result.content,
                extract(raw.message, code=raw.code, details=raw.details) if raw else None)
            if not result.is_error and len(result.content) > self.settings.large_result_chars:
                result = await self._shorten(outcome.call, result)
            results.append(result)
        return results

    def note(self) -> str:
        """What the next request's note says after tool results: the execution summary
        and any loop warning (said once)."""
        parts = [self.summary.render(), self.warning]
        self.warning = ""
        return "\n\n".join(p for p in parts if p)

    def _loop_warning(self, calls: Sequence[ToolCall]) -> str:
        """A no-progress warning once a call repeats with identical arguments 3 times."""
        repeated = []
        for call in calls:
            key = (call.name, json.dumps(call.arguments, sort_keys=True, default=str))
            self.repeats[key] = self.repeats.get(key, 0) + 1
            if self.repeats[key] == LOOP_REPEATS:
                repeated.append(call.name)
        if not repeated:
            return ""
        return (f"[No progress: you called {', '.join(repeated)} with identical arguments "
                f"{LOOP_REPEATS} times in this run and the result will not change. Try "
                "something different, or answer with what you have.]")

    async def _shorten(self, call: ToolCall, result: ToolResult) -> ToolResult:
        """A large successful result: stored for slices when a result store exists."""
        limit = self.settings.large_result_chars
        if self.sink.on_large_result is not None:
            try:
                return ToolResult(await self.sink.on_large_result(
                    self.session_key, call.name, result.content), parts=result.parts)
            except Exception:
                log.exception("storing a large %s result failed; cutting it", call.name)
        cut = len(result.content) - limit
        return ToolResult(f"{result.content[:limit]}\n[... {cut} more characters cut]",
                          parts=result.parts)

    async def _on_failure(self, call: ToolCall, raw: RawError) -> str:
        assert self.sink.on_tool_failure is not None
        return await self.sink.on_tool_failure(call, raw, self.session_key)

    async def _on_call(self, call: ToolCall) -> None:
        await self.emit("tool.call", name=call.name, id=call.id, arguments=dict(call.arguments))

    async def _on_result(self, outcome: ToolOutcome) -> None:
        if self.journal is not None:
            self.journal.result(outcome.call.id, outcome.result)
        if not self.observed:
            return
        name = outcome.call.name
        await self.emit("tool.result", name=name, id=outcome.call.id,
                        is_error=outcome.is_error, result=outcome.content[:500],
                        metrics=self.metrics.get(name).snapshot())
