"""The tool side of one run: the model's calls executed, summarized and watched for loops.

A run makes its :class:`ToolTurns` at the model's first tool call (a plain reply
never needs one). Each batch of calls runs through the run's
:class:`bot.tools.executor.ToolExecutor`; every execution is recorded in the run's
execution summary (:mod:`bot.engine.exec_summary`), a large successful result is
stored through the sink or cut, and a call repeated with identical arguments
:data:`LOOP_REPEATS` times earns the model a warning in the next request's note.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, ToolCall
from bot.contracts.tools import ToolContext, ToolResult
from bot.engine.approvals import RunGate
from bot.engine.exec_summary import ExecutionSummary
from bot.engine.requests import Emit, RunSink
from bot.observability.tracing import RunTrace
from bot.storage.inbox import INTERRUPTED, RunJournal
from bot.tools.executor import ToolExecutor
from bot.tools.metrics import ToolMetricsRegistry
from bot.tools.outcomes import RawError, ToolOutcome, turn_timeout_notice
from bot.tools.structured_errors import extract

log = logging.getLogger("roost.engine.tool_turns")

LOOP_REPEATS = 3
"""Identical tool calls in one run before the model is warned it is looping."""


def narrowed(name: str, only: frozenset[str]) -> str:
    """What the model reads for a call to ``name`` after the run's tools were narrowed."""
    return (f"Tool {name!r} is not allowed while following the loaded skill: for the rest of "
            f"this turn it allows only {', '.join(sorted(only)) or 'no tools'}. Do without "
            "it, or tell the user what you would need.")


class ToolTurns:
    """Runs one run's tool calls; what the model should read about them is :meth:`note`.

    ``observed``: whether anyone listens to the run's events (tool results are
    announced only then); ``journal``: where finished results are recorded for a
    run repeated after a crash; ``gate``: the run's approvals.
    """

    def __init__(self, executor: ToolExecutor, settings: Settings, *, sink: RunSink,
                 trace: RunTrace, emit: Emit, metrics: ToolMetricsRegistry, session_key: str,
                 journal: RunJournal | None, observed: bool,
                 gate: RunGate | None = None) -> None:
        self.executor = executor
        self.settings = settings
        self.sink = sink
        self.trace = trace
        self.emit = emit
        self.metrics = metrics
        self.session_key = session_key
        self.journal = journal
        self.observed = observed
        self.gate = gate
        """Asks before calls that need approval (``None``: none does)."""
        self.summary = ExecutionSummary()  # one per run = one per user turn
        self.repeats: dict[tuple[str, str], int] = {}
        self.warning = ""
        """A loop warning for the next request's note only."""
        self.only: frozenset[str] | None = None
        """The tools the rest of the run may call, once a result narrowed them
        (:attr:`ToolResult.only_tools`); ``None``: every tool of the run."""

    async def answer(self, calls: Sequence[ToolCall], context: ToolContext, *,
                     replayed: bool) -> list[ChatMessage]:
        """The tool messages answering ``calls``, in order, once their results are
        journaled (``replayed``: the journal's results of an interrupted earlier run
        of the message are used instead of running the calls again)."""
        journal = self.journal
        results = await self.run(
            calls, context, journal.recorded(calls) if replayed and journal else None)
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
        earlier run of the message recorded, used instead of running them again; a call
        it has no result for is reported interrupted, unless it was waiting for approval
        and never started: that one is decided and run now).

        Calls needing approval (:attr:`gate`) run only once approved; the others'
        results are the denial the model reads."""
        self.warning = self._loop_warning(calls)
        done: dict[str, ToolResult] = {}
        todo = list(calls)
        if replayed is not None:
            for call in calls:
                if call.id in replayed:
                    done[call.id] = replayed[call.id]
                elif self.gate is None or not self.gate.needs(call.name):
                    done[call.id] = ToolResult(INTERRUPTED, is_error=True)
            for call in calls:
                if call.id in done:
                    result = done[call.id]
                    self.summary.record(call.name, call.arguments, not result.is_error,
                                        result.content, None)
            todo = [c for c in calls if c.id not in done]
        if self.only is not None:
            for call in todo:
                if call.name not in self.only:
                    done[call.id] = refused = ToolResult(narrowed(call.name, self.only),
                                                         is_error=True)
                    self.summary.record(call.name, call.arguments, False, refused.content,
                                        None)
                    if self.journal is not None:
                        self.journal.result(call.id, refused)
            todo = [c for c in todo if c.id not in done]
        if self.gate is not None and any(self.gate.needs(c.name) for c in todo):
            # The run now shows a question: a follow-up message waits its turn instead
            # of cancelling the run (and the question) to merge into it.
            await self.emit("activity", phase="approval",
                            tools=[c.name for c in todo if self.gate.needs(c.name)])
        if self.gate is not None and todo:
            before = context.deadline - time.monotonic()
            blocked, approved = await self.gate.screen(todo)
            for call in todo:
                if call.id in blocked:
                    done[call.id] = blocked[call.id]
                    self.summary.record(call.name, call.arguments, False,
                                        blocked[call.id].content, None)
                    if self.journal is not None:
                        self.journal.result(call.id, blocked[call.id])
            await self.gate.started(approved)
            todo = [c for c in todo if c.id not in blocked]
            # The tools' own deadline does not count the time spent waiting for a person.
            context = dataclasses.replace(context, deadline=time.monotonic() + before)
        ran = await self._execute(todo, context)
        return [done[c.id] if c.id in done else ran[c.id] for c in calls]

    async def _execute(self, calls: Sequence[ToolCall],
                       context: ToolContext) -> dict[str, ToolResult]:
        """Run ``calls`` through the executor; their results by call id."""
        if not calls:
            return {}
        outcomes = await self.executor.run_batch(
            calls, context, trace=self.trace, on_call=self._on_call,
            on_result=self._on_result,
            on_failure=self._on_failure if self.sink.on_tool_failure else None)
        notice = turn_timeout_notice(outcomes)
        if notice:
            await self.emit("activity", phase="turn_timeout", notice=notice)
        results: dict[str, ToolResult] = {}
        for outcome in outcomes:
            result = outcome.result
            raw = outcome.error
            if result.only_tools is not None and not outcome.is_error:
                self.only = result.only_tools if self.only is None else \
                    self.only & result.only_tools
            # From the raw error: the text the model sees may be the error channel's.
            self.summary.record(
                outcome.call.name, outcome.call.arguments, not outcome.is_error,
                raw.message if raw else result.content,
                extract(raw.message, code=raw.code, details=raw.details) if raw else None)
            if not result.is_error and len(result.content) > self.settings.large_result_chars:
                result = await self._shorten(outcome.call, result)
            results[outcome.call.id] = result
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
        tool = self.executor.tools.get(call.name)
        await self.emit("tool.call", name=call.name, id=call.id, arguments=dict(call.arguments),
                        read_only=tool is not None and tool.read_only)

    async def _on_result(self, outcome: ToolOutcome) -> None:
        if self.journal is not None:
            self.journal.result(outcome.call.id, outcome.result)
        if not self.observed:
            return
        name = outcome.call.name
        await self.emit("tool.result", name=name, id=outcome.call.id,
                        is_error=outcome.is_error, result=outcome.content[:500],
                        metrics=self.metrics.get(name).snapshot())
