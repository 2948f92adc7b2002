"""The run loop: one inbound message becomes a think → act → observe run.

Phases: setup → input checks → build messages → LLM iterations with tool
execution → finalization (sanitize, NO_REPLY, judges) → the ending
(:mod:`bot.engine.finish`: the commit its caller writes, the last event). Cancellation
(``/stop``, merges, shutdown) is plain asyncio cancellation: it reaches the
provider's HTTP stream and running tools, and nothing of a cancelled run is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bot.agents.patterns import PatternLibrary, render
from bot.agents.router import Agent
from bot.contracts import hookspecs
from bot.contracts.events import EventType, RunEvent
from bot.contracts.llm import BudgetRefused, ChatMessage, LLMRequest, LLMResponse, ToolCall, Usage
from bot.contracts.prompt import Order, PromptContext, PromptSection, assemble
from bot.contracts.sanitize import run_pipeline
from bot.contracts.tools import Tool, ToolContext, ToolResult
from bot.engine import finish
from bot.engine.compaction import (
    split_point,
    summarize,
)
from bot.engine.context import build_context, kernel_text
from bot.engine.exec_summary import ExecutionSummary
from bot.engine.gates import Asking, Stage
from bot.engine.guard import BLOCK_REFUSAL
from bot.engine.history import limit_turns, prune, repair_pairing, summary_messages
from bot.engine.judging import judge_reply
from bot.engine.llm_call import call_model
from bot.engine.media import drop_images, receive_files, vision_for, with_lines
from bot.engine.requests import (
    NO_REPLY,
    FailureHandler,
    LargeResultHandler,
    Listener,
    RunCommit,
    RunOptions,
    RunRequest,
    RunResult,
    RunSink,
    RunStatus,
)
from bot.engine.turns import for_model, seeded_files, verbose_input, workspace_for
from bot.observability.tracing import RunTrace
from bot.tools.executor import ToolExecutor
from bot.tools.outcomes import RawError, ToolOutcome, describe_error, turn_timeout_notice
from bot.tools.structured_errors import extract
from workspaces import ensure_workspace, is_seeded, read_cached

if TYPE_CHECKING:
    from bot.engine.run_engine import RunEngine

log = logging.getLogger("roost.engine.runloop")

__all__ = [
    "NO_REPLY", "FailureHandler", "LargeResultHandler", "Listener", "Run", "RunCommit",
    "RunOptions", "RunRequest", "RunResult", "RunSink", "RunStatus",
]

LOOP_REPEATS = 3
"""Identical tool calls in one run before the model is warned it is looping."""


class Run:
    """The state of one run; lives only as long as the run."""

    def __init__(self, engine: RunEngine, req: RunRequest, listener: Listener | None) -> None:
        self.engine = engine
        self.settings = engine.settings
        self.req = req
        self.plugins = req.plugins or engine.plugins
        """The plugin state this run started with; it keeps it to the end."""
        self.listener = listener
        self.observers = engine.host.hooks.implemented(hookspecs.roost_run_event)
        self.usage = Usage()
        self.buffer: list[ChatMessage] = []
        self.iterations = 0
        self.started = time.monotonic()
        self.sink = req.sink or engine.sink
        """Where this run reports: error channel, large results, sends, spans."""
        self.trace = RunTrace(req.run_id, req.session.key, verbose=self.settings.trace_verbose)
        self.trace.root.attributes["kind"] = req.kind
        # Set from the agent when the run starts (_use_agent).
        self.agent: Agent | None = None
        self.provider = engine.provider
        self.estimator = engine.estimator
        self.tools: dict[str, Tool] = {}
        self.executor: ToolExecutor
        self.stream = True
        self.repeats: dict[tuple[str, str], int] = {}
        self.exec_summary = ExecutionSummary()  # one per run = one per user turn
        self.compacted_midloop = False
        self.volatile = ""
        """The prompt's volatile sections, sent in each request's note (never cached)."""
        self.warning = ""
        """A loop warning for the next request's note only."""

    async def emit(self, type_: EventType, **payload: Any) -> None:
        if not self.observers and self.listener is None:
            return
        event = RunEvent(type_, self.req.run_id, self.req.session.key, payload)
        if self.listener is not None:
            await self.listener(event)
        if self.observers:
            await self.engine.host.hooks.roost_run_event(event=event)

    async def execute(self) -> RunResult:
        msg = self.req.message
        await self.emit("run.started", message=msg.text, kind=self.req.kind)
        timeout = self.req.timeout or self.settings.run_timeout
        try:
            async with asyncio.timeout(timeout):
                result = await self._phases()
        except asyncio.CancelledError as exc:
            # The message given to task.cancel(): "stop", "merged" or "shutdown".
            reason = str(exc.args[0]) if exc.args and exc.args[0] else "cancelled"
            await finish.cancel(self, reason)
            raise
        except TimeoutError:
            result = await finish.fail(self, f"the run took longer than {timeout:g}s")
        except BudgetRefused as exc:
            if not self.usage.input_tokens and not self.usage.output_tokens:
                raise  # before the model answered anything: the caller refuses the run
            # A later call of the run: it ends with the refusal, its tool turns dropped
            # (the user's message is kept: it was not what was refused).
            result = await finish.refuse(self, exc.reply, user_turn=next(
                (m for m in self.buffer if m.role == "user"), None))
        except Exception as exc:
            log.exception("run %s failed", self.req.run_id)
            result = await finish.fail(self, describe_error(exc))
        return result

    async def _use_agent(self) -> Agent:
        """Resolve the run's agent; its settings, provider and tool policy apply from here."""
        engine, req = self.engine, self.req
        agent = self.agent = await engine.agents.get(req.agent)
        self.settings = agent.settings
        self.provider = agent.provider or engine.provider
        self.estimator = engine.estimator_for(self.provider.name)
        # The policy decides what is offered *and* what may run: a hidden tool
        # the model names anyway is an unknown tool to the executor.
        tools = agent.tools(self.plugins.tools, self.plugins.tool_groups)
        if req.tools is not None:
            tools = {name: tools[name] for name in req.tools if name in tools}
        self.tools = tools
        self.executor = ToolExecutor(tools, self.settings, breakers=engine.breakers,
                                     metrics=engine.tool_metrics)
        # A judged reply is delivered only once it passed, so drafts are not streamed.
        self.stream = not (agent.judges and req.kind == "chat")
        self.trace.root.attributes["agent"] = agent.name
        return agent

    async def _phases(self) -> RunResult:
        req, msg, engine = self.req, self.req.message, self.engine
        agent = await self._use_agent()
        # Setup: the workspace is always the sender's, even in a group.
        workspace = workspace_for(agent.workspaces_root, msg.channel, msg.sender_id)
        if not is_seeded(workspace):
            await asyncio.to_thread(ensure_workspace, workspace, agent.bootstrap_dir,
                                    seeded_files(agent))

        # The chain's gates of a run (bot.engine.gates): guard and length on the text...
        asking = Asking(msg, msg.text, req.session.key, self.settings,
                        from_person=req.kind == "chat", agent=agent.name, plugins=self.plugins)
        decision = await engine.gates.check(Stage.INPUT, asking)
        if decision.action != "pass":
            return await finish.refuse(self, decision.reply or BLOCK_REFUSAL)
        text, notes = decision.text, list(decision.notes)
        # Files are fetched, stored in the workspace and described to the model, a line
        # each (bot.engine.media); a message of files alone is a turn of its own.
        media = await receive_files(msg, workspace, engine.channels, engine.host, self.settings) \
            if msg.attachments else None
        if media is not None:
            text = with_lines(text, media)
            if not media.usable and not msg.text.strip():
                # Nothing the model could work with: Roost's own notice is the answer.
                return await finish.refuse(self, "\n".join(media.notices), user_turn=ChatMessage(
                    "user", text, sender_id=msg.sender_id, sender_name=msg.display_name))
            for notice in media.notices:
                # At most once per message: a run repeated after a crash skips what it sent.
                if req.journal is None or await req.journal.notice(notice):
                    await self.emit("activity", phase="media", notice=notice)
        # ...then plugins' checks, on the text with its files described.
        decision = await engine.gates.check(Stage.CONTENT,
                                            dataclasses.replace(asking, text=text))
        if decision.action != "pass":
            return await finish.refuse(self, decision.reply or BLOCK_REFUSAL)
        text = decision.text
        notes += decision.notes
        user = ChatMessage("user", text, sender_id=msg.sender_id, sender_name=msg.display_name,
                           parts=tuple(media.parts) if media is not None else ())
        self.buffer.append(user)

        # Build messages: ROM (system prompt), Kernel (USER.md, pins), L2 (summary), L1 (recent).
        prompt = PromptContext(
            message=msg, session_key=req.session.key, workspace=workspace,
            tool_names=sorted(self.tools), model=self.settings.model,
            provider=self.provider.name, agent=agent.name, mode=req.mode,
            extra_context=req.extra_context,
            agent_dir=agent.bootstrap_dir if agent.type == "predefined" else None,
        )
        sections = await engine.host.hooks.roost_prompt_sections(prompt=prompt)
        if agent.patterns is not None and req.mode == "full":
            sections.append(await self._patterns(agent.patterns, text))
        # Volatile sections (the time...) go in each request's note, after the cached
        # prefix: the system prompt stays byte-identical from turn to turn.
        stable = [s for s in sections if not s.volatile]
        self.volatile = assemble(s for s in sections if s.volatile)
        rom = assemble(stable)
        kernel = "" if req.mode == "minimal" else kernel_text(
            read_cached(workspace / "USER.md", 8_000, within=workspace), req.session.facts)
        # The Kernel goes before the recency reminders; it is counted as its own segment.
        system = assemble([*stable, PromptSection("kernel", kernel, Order.KERNEL)])
        group = msg.chat_type == "group"
        current = for_model(user, group)
        if notes:
            current = ChatMessage("user", current.content + "\n\n" + "\n".join(notes),
                                  created_at=user.created_at, parts=current.parts)
        context = build_context(
            rom=rom, kernel=kernel, summary="" if req.history is not None else req.session.summary,
            history=self._history(group), current=current, estimator=self.estimator,
            window=self.settings.context_window, reserve=self.settings.output_reserve,
        )
        if req.persist:
            req.session.context_tokens = context.tokens
        convo = context.messages
        specs = tuple(t.spec() for t in self.tools.values())

        # LLM iterations.
        limit = req.max_iterations or self.settings.max_iterations
        tool_context = ToolContext(
            user_id=msg.sender_id, channel=msg.channel, chat_id=msg.chat_id,
            session_key=req.session.key, run_id=req.run_id, workspace=workspace,
            deadline=self.started + (req.timeout or self.settings.run_timeout),
            chat_type=msg.chat_type, thread_id=msg.thread_id, send=self.sink.deliver,
        )
        final, convo = await self._generate(convo, system, specs, limit, tool_context)

        # Finalization: sanitize before the NO_REPLY check, judge, then one flush.
        cleaned = run_pipeline(final, self.plugins.sanitizers)
        silent = cleaned == NO_REPLY or not cleaned
        if agent.judges and req.kind == "chat" and not silent:
            final, cleaned = await judge_reply(
                agent, convo, (final, cleaned), text,
                lambda c: self._generate(c, system, specs, limit, tool_context),
                trace=self.trace, sanitizers=self.plugins.sanitizers,
                stats=engine.agents.stats_for(agent.name), run_id=req.run_id)
            silent = cleaned == NO_REPLY or not cleaned
        return await finish.complete(self, final, cleaned, silent)

    async def _generate(self, convo: list[ChatMessage], system: str,
                        specs: tuple[Any, ...], limit: int,
                        tool_context: ToolContext) -> tuple[str, list[ChatMessage]]:
        """LLM iterations until an answer without tool calls, or ``limit`` model calls.

        Returns the answer and the conversation (mid-loop compaction may replace it).
        Tool exchanges go to the run's buffer; the answer does not.
        """
        used = 0
        journal = self.req.journal
        while used < limit:
            used += 1
            self.iterations += 1
            replayed = journal.next_turn() if journal is not None else None
            if replayed is not None:
                # An interrupted earlier run got this far: its turn and finished
                # tool results are replayed instead of being produced again.
                assistant = replayed
                request = None
            else:
                await self.emit("activity", phase="thinking", iteration=self.iterations)
                request = LLMRequest(
                    model=self.settings.model, system=system, messages=tuple(convo),
                    tools=specs, max_tokens=self.settings.max_tokens,
                    vision=vision_for(self.agent, self.settings), note=self._note(convo),
                )
                self.warning = ""
                response = await self._call_llm(request)
                self.usage.add(response.usage)
                if not response.tool_calls:
                    return response.text, convo
                assistant = ChatMessage("assistant", response.text,
                                        tool_calls=response.tool_calls)
                if journal is not None:
                    await journal.turn(assistant)
            convo.append(assistant)
            self.buffer.append(assistant)
            if assistant.content.strip() and replayed is None:
                await self.emit("block.reply", content=assistant.content)
            await self.emit("activity", phase="tools", iteration=self.iterations)
            calls = assistant.tool_calls
            results = await self._run_tools(
                calls, tool_context,
                journal.replayed(calls) if replayed is not None and journal else None)
            if journal is not None and replayed is None:
                # Queued results join this commit: the model is asked again only
                # once a crash could no longer make it look as if they never ran.
                await journal.sync()
            for call, result in zip(calls, results, strict=True):
                answer = ChatMessage("tool", result.content, tool_call_id=call.id,
                                     tool_name=call.name, is_error=result.is_error,
                                     parts=result.parts)
                convo.append(answer)
                self.buffer.append(answer)
            # Read with the results next, in the note: the history stays as it was sent.
            self.warning = self._loop_warning(calls)
            if request is not None:
                convo = await self._maybe_compact_midloop(
                    convo, response.usage.input_tokens or self.estimator.request(request))
        return (f"I stopped after {limit} steps without finishing. "
                "Tell me how to continue, or ask for something smaller."), convo

    def _note(self, convo: Sequence[ChatMessage]) -> str:
        """This request's note: volatile sections, then (after tool results) the
        execution summary and any loop warning."""
        parts = [self.volatile]
        if convo and convo[-1].role == "tool":
            parts += [self.exec_summary.render(), self.warning]
        return "\n\n".join(p for p in parts if p)

    async def _patterns(self, library: PatternLibrary, text: str) -> PromptSection:
        """The agent's top patterns for ``text`` (a volatile section: in the note)."""
        if library.reload_due():
            # Parsing YAML and rebuilding the index is file I/O: off the event loop.
            await asyncio.to_thread(library.reload_if_changed)
        span = self.trace.start("patterns", "patterns", library=str(library.directory))
        matches = library.match(text)
        span.end(matched={m.name: round(m.score, 4) for m in matches})
        # They follow the message: volatile, read after the conversation.
        return PromptSection("patterns", render(matches), Order.PATTERNS, volatile=True)

    def _history(self, group: bool) -> list[ChatMessage]:
        """Stored history through the pipeline: limit turns → prune → repair pairing."""
        source = self.req.history if self.req.history is not None else self.req.session.messages
        limited = limit_turns(source, self.settings.history_turns)
        window = self.settings.context_window
        estimator = self.estimator
        # Old images go first, replaced by a line naming the file, before any text is cut.
        limited = drop_images(limited, lambda ms: estimator.messages(ms) / window,
                              self.engine.prune.soft_ratio)
        pruned = prune(limited, lambda ms: estimator.messages(ms) / window, self.engine.prune)
        return [for_model(m, group) for m in repair_pairing(pruned)]

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

    async def _maybe_compact_midloop(self, convo: list[ChatMessage],
                                     prompt_tokens: int) -> list[ChatMessage]:
        """Once per run, summarize the oldest ~70% when the prompt fills the window."""
        threshold = self.settings.compact_ratio * self.settings.context_window
        if (not self.settings.compaction or self.compacted_midloop
                or prompt_tokens < threshold or len(convo) < 4):
            return convo
        self.compacted_midloop = True
        cut = split_point(convo, max(2, round(len(convo) * 0.3)))
        if cut <= 0:
            return convo
        span = self.trace.start("llm", "compaction", model=self.settings.model,
                                messages=cut)
        try:
            summary = await summarize(self.provider, self.settings.model, convo[:cut])
        except Exception as exc:
            span.end(error=True, error_message=describe_error(exc))
            log.warning("mid-run compaction of %s failed; continuing uncompacted",
                        self.req.session.key, exc_info=exc)
            return convo
        span.end()
        log.info("mid-run compaction of %s: %d messages summarized", self.req.session.key, cut)
        # The request being worked on stays verbatim even when it was summarized.
        task = [current] if (current := self._current(convo)) in convo[:cut] else []
        return [*summary_messages(summary), *task, *convo[cut:]]

    def _current(self, convo: list[ChatMessage]) -> ChatMessage | None:
        created = self.buffer[0].created_at if self.buffer else None
        return next((m for m in convo if m.role == "user" and m.created_at == created), None)

    async def _call_llm(self, request: LLMRequest) -> LLMResponse:
        streaming = self.stream and (self.listener is not None or bool(self.observers))
        span = self.trace.start("llm", "llm", provider=self.provider.name,
                                model=request.model, iteration=self.iterations)
        if self.trace.verbose:
            span.attributes["input"] = verbose_input(request)
        response = await call_model(self.provider, request, span, self.emit, streaming=streaming)
        if self.iterations == 1:
            # One sample per run is plenty for a moving average, and it is O(request).
            self.estimator.calibrate(request, response.usage.input_tokens)
        return response

    async def _run_tools(
        self, calls: Sequence[ToolCall], context: ToolContext,
        replayed: Mapping[str, ToolResult] | None = None,
    ) -> list[ToolResult]:
        if replayed is not None:
            results = []
            for call in calls:
                result = replayed[call.id]
                self.exec_summary.record(call.name, call.arguments, not result.is_error,
                                         result.content, None)
                results.append(result)
            return results
        outcomes = await self.executor.run_batch(
            calls, context, trace=self.trace, on_call=self._on_tool_call,
            on_result=self._on_tool_result,
            on_failure=self._on_failure if self.sink.on_tool_failure else None)
        notice = turn_timeout_notice(outcomes)
        if notice:
            await self.emit("activity", phase="turn_timeout", notice=notice)
        results = []
        for outcome in outcomes:
            result = outcome.result
            raw = outcome.error
            # From the raw error: the text the model sees may be the error channel's.
            self.exec_summary.record(
                outcome.call.name, outcome.call.arguments, not outcome.is_error,
                raw.message if raw else result.content,
                extract(raw.message, code=raw.code, details=raw.details) if raw else None)
            if not result.is_error and len(result.content) > self.settings.large_result_chars:
                result = await self._shorten(outcome.call, result)
            results.append(result)
        return results

    async def _shorten(self, call: ToolCall, result: ToolResult) -> ToolResult:
        """A large successful result: stored for slices when a result store exists."""
        limit = self.settings.large_result_chars
        if self.sink.on_large_result is not None:
            try:
                return ToolResult(await self.sink.on_large_result(
                    self.req.session.key, call.name, result.content), parts=result.parts)
            except Exception:
                log.exception("storing a large %s result failed; cutting it", call.name)
        cut = len(result.content) - limit
        return ToolResult(f"{result.content[:limit]}\n[... {cut} more characters cut]",
                          parts=result.parts)

    async def _on_failure(self, call: ToolCall, raw: RawError) -> str:
        assert self.sink.on_tool_failure is not None
        return await self.sink.on_tool_failure(call, raw, self.req.session.key)

    async def _on_tool_call(self, call: ToolCall) -> None:
        await self.emit("tool.call", name=call.name, id=call.id, arguments=dict(call.arguments))

    async def _on_tool_result(self, outcome: ToolOutcome) -> None:
        if self.req.journal is not None:
            self.req.journal.result(outcome.call.id, outcome.result)
        if not self.observers and self.listener is None:
            return
        name = outcome.call.name
        await self.emit("tool.result", name=name, id=outcome.call.id,
                        is_error=outcome.is_error, result=outcome.content[:500],
                        metrics=self.engine.tool_metrics.get(name).snapshot())
