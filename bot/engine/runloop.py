"""The run: one inbound message becomes a think → act → observe run, and how it ends.

Phases: setup → input checks (the gate chain's run stages) → the context
(:mod:`bot.engine.context`) → model calls and tool turns (:mod:`bot.engine.tool_turns`)
→ sanitize, NO_REPLY, judges → the ending: completed, refused, failed or cancelled. A
persisted run writes nothing itself: its result carries the :class:`RunCommit` its
caller writes and the last event, announced after that write; other runs store only
their trace. Cancellation (``/stop``, merges, shutdown) is asyncio cancellation; nothing
of a cancelled run is written but its trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.agents.router import Agent
from bot.contracts import hookspecs
from bot.contracts.events import EventType, RunEvent
from bot.contracts.llm import (
    BudgetRefused,
    ChatMessage,
    ContentPart,
    LLMRequest,
    LLMResponse,
    ToolSpec,
    Usage,
    metered_complete,
    run_pipeline,
)
from bot.contracts.prompt import PromptContext
from bot.contracts.tools import Tool, ToolContext
from bot.engine.approvals import RunGate
from bot.engine.compaction import compact_midloop, midloop_due
from bot.engine.context import build_context, current_turn, recent_history, system_prompt
from bot.engine.gates import BLOCK_REFUSAL, WITHHELD, Asking, Stage
from bot.engine.judging import judge_reply
from bot.engine.media import receive_files, with_lines
from bot.engine.requests import NO_REPLY, Emit, RunCommit, RunRequest, RunResult
from bot.engine.tool_turns import ToolTurns
from bot.observability.tracing import VERBOSE_INPUT_CHARS, RunTrace, Span, preview
from bot.storage.sessions import RunRecord
from bot.tools.executor import ToolExecutor
from bot.tools.outcomes import describe_error

if TYPE_CHECKING:
    from bot.engine.run_engine import RunEngine

# Operators' level settings, the console's filter and the benches select the per-run
# lines by this name.
log = logging.getLogger("roost.engine.runloop")


class Run:
    """The state of one run; lives only as long as the run."""

    def __init__(self, engine: RunEngine, req: RunRequest) -> None:
        self.engine = engine
        self.settings = engine.settings
        self.req = req
        self.plugins = req.plugins or engine.plugins
        """The plugin state this run started with; it keeps it to the end."""
        self.sink = req.sink or engine.sink
        """Where this run reports: error channel, large results, sends, spans, events."""
        self.listener = self.sink.events
        self.observers = engine.host.hooks.implemented(hookspecs.roost_run_event)
        self.usage = Usage()
        self.buffer: list[ChatMessage] = []
        self.iterations = 0
        self.started = time.monotonic()
        self.trace = RunTrace(req.run_id, req.session.key, verbose=self.settings.trace_verbose)
        self.trace.root.attributes["kind"] = req.kind
        # Set from the agent when the run starts (_use_agent).
        self.agent: Agent | None = None
        self.provider = engine.provider
        self.estimator = engine.estimator
        self.tools: dict[str, Tool] = {}
        self.specs: Mapping[str, ToolSpec] = {}
        """What the model is shown of each tool the agent offers, by name."""
        self.approve: frozenset[str] = frozenset()
        """The offered tools whose calls wait for a person's approval."""
        self.timer: asyncio.Timeout | None = None
        self.tool_turns: ToolTurns | None = None
        """Made at the model's first tool call."""
        self.stream = True
        self.compacted_midloop = False
        self.volatile = ""
        """The prompt's volatile sections, sent in each request's note (never cached)."""

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
            async with asyncio.timeout(timeout) as self.timer:
                result = await self._phases()
        except asyncio.CancelledError as exc:
            # The message given to task.cancel(): "stop", "merged" or "shutdown".
            reason = str(exc.args[0]) if exc.args and exc.args[0] else "cancelled"
            await self.cancel(reason)
            raise
        except TimeoutError:
            result = await self.fail(f"the run took longer than {timeout:g}s")
        except BudgetRefused as exc:
            if not self.usage.input_tokens and not self.usage.output_tokens:
                raise  # before the model answered anything: the caller refuses the run
            # A later call of the run: it ends with the refusal, its tool turns dropped
            # (the user's message is kept: it was not what was refused).
            result = await self.refuse(exc.reply, user_turn=next(
                (m for m in self.buffer if m.role == "user"), None))
        except Exception as exc:
            log.exception("run %s failed", self.req.run_id)
            result = await self.fail(describe_error(exc))
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
        self.specs = agent.specs(self.plugins.tools, self.plugins.tool_groups)
        if req.tools is not None:
            tools = {name: tools[name] for name in req.tools if name in tools}
        self.tools = tools
        self.approve = agent.needing_approval(self.plugins.tools, self.plugins.tool_groups)
        if req.tools is not None:
            self.approve = self.approve & tools.keys()
        # A judged reply is delivered only once it passed, so drafts are not streamed.
        self.stream = not (agent.judges and req.kind == "chat")
        self.trace.root.attributes["agent"] = agent.name
        return agent

    async def _phases(self) -> RunResult:
        req, msg, engine = self.req, self.req.message, self.engine
        agent = await self._use_agent()
        # Setup: the workspace is always the sender's, even in a group.
        workspace = await agent.workspace(msg.channel, msg.sender_id)

        # The chain's gates of a run (bot.engine.gates): guard and length on the text...
        asking = Asking(msg, msg.text, req.session.key, self.settings,
                        from_person=req.kind == "chat", agent=agent.name,
                        guard=self.plugins.guard)
        decision = await engine.gates.check(Stage.INPUT, asking)
        if decision.action != "pass":
            return await self.refuse(decision.reply or BLOCK_REFUSAL)
        text, notes = decision.text, list(decision.notes)
        parts: tuple[ContentPart, ...] = ()
        if msg.attachments:
            # Files are fetched, stored in the workspace and described to the model, a
            # line each (bot.engine.media); a message of files alone is a turn of its own.
            media = await receive_files(msg, workspace, engine.channels, engine.host,
                                        self.settings)
            text, parts = with_lines(text, media), tuple(media.parts)
            if not media.usable and not msg.text.strip():
                # Nothing the model could work with: Roost's own notice is the answer.
                return await self.refuse("\n".join(media.notices), user_turn=ChatMessage(
                    "user", text, sender_id=msg.sender_id, sender_name=msg.display_name))
            for notice in media.notices:
                # At most once per message: a run repeated after a crash skips what it sent.
                if req.journal is None or await req.journal.notice(notice):
                    await self.emit("activity", phase="media", notice=notice)
        # ...then plugins' checks, on the text with its files described.
        decision = await engine.gates.check(Stage.CONTENT,
                                            dataclasses.replace(asking, text=text))
        if decision.action != "pass":
            return await self.refuse(decision.reply or BLOCK_REFUSAL)
        text = decision.text
        notes += decision.notes
        user = ChatMessage("user", text, sender_id=msg.sender_id, sender_name=msg.display_name,
                           parts=parts)
        self.buffer.append(user)

        # Build messages: ROM (system prompt), Kernel (USER.md, pins), L2 (summary), L1 (recent).
        prompt = await system_prompt(engine.host, PromptContext(
            message=msg, session_key=req.session.key, workspace=workspace,
            tool_names=sorted(self.tools), model=self.settings.model,
            provider=self.provider.name, agent=agent.name, mode=req.mode,
            extra_context=req.extra_context,
            agent_dir=agent.bootstrap_dir if agent.type == "predefined" else None,
        ), text=text, patterns=agent.patterns if req.mode == "full" else None,
            trace=self.trace, facts=req.session.facts, tools=self.tools,
            tool_timeout=self.settings.tool_timeout)
        self.volatile = prompt.volatile
        system = prompt.text
        group = msg.chat_type == "group"
        window = self.settings.context_window
        context = build_context(
            rom=prompt.rom, kernel=prompt.kernel,
            summary="" if req.history is not None else req.session.summary,
            history=recent_history(
                req.history if req.history is not None else req.session.messages,
                turns=self.settings.history_turns, group=group, estimator=self.estimator,
                window=window, prune_settings=engine.prune),
            current=current_turn(user, group, notes), estimator=self.estimator,
            window=window, reserve=self.settings.output_reserve,
        )
        if req.persist:
            req.session.context_tokens = context.tokens
        convo = context.messages
        specs = tuple(self.specs[name] for name in self.tools)

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
        return await self.complete(final, cleaned, silent)

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
                    vision=self._vision(), note=self._note(convo),
                )
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
            answers = await self._tool_turns().answer(assistant.tool_calls, tool_context,
                                                      replayed=replayed is not None)
            convo += answers
            self.buffer += answers
            if request is not None and not self.compacted_midloop and midloop_due(
                    self.settings, convo,
                    response.usage.input_tokens or self.estimator.request(request)):
                # Once per run, the oldest ~70% summarized when the prompt fills the window.
                self.compacted_midloop = True
                convo = await compact_midloop(
                    convo, self.buffer[0] if self.buffer else None, self.provider,
                    self.settings.model, self.trace, self.req.session.key)
        return (f"I stopped after {limit} steps without finishing. "
                "Tell me how to continue, or ask for something smaller."), convo

    def _tool_turns(self) -> ToolTurns:
        """The run's tool side, made at its first tool call."""
        if self.tool_turns is None:
            engine = self.engine
            self.tool_turns = ToolTurns(
                ToolExecutor(self.tools, self.settings, breakers=engine.breakers,
                             metrics=engine.tool_metrics),
                self.settings, sink=self.sink, trace=self.trace, emit=self.emit,
                metrics=engine.tool_metrics, session_key=self.req.session.key,
                journal=self.req.journal,
                observed=bool(self.observers) or self.listener is not None,
                gate=self._gate())
        return self.tool_turns

    def _gate(self) -> RunGate | None:
        """The run's approvals, when some offered tool needs them."""
        approvals, req = self.engine.approvals, self.req
        if approvals is None or not self.approve:
            return None
        return approvals.gate(
            req.message, settings=self.settings, needed=self.approve,
            session_key=req.session.key, session_id=req.session.id, run_id=req.run_id,
            inbox_id=req.journal.head if req.journal is not None else None,
            # Scheduled runs (cron, heartbeat) have nobody to ask.
            can_ask=req.kind == "chat", preapproved=frozenset(req.approved),
            on_wait=self._paused)

    def _paused(self, seconds: float) -> None:
        """The run waited ``seconds`` for a person: its time limit moves by as much."""
        timer = self.timer
        when = timer.when() if timer is not None else None
        if timer is not None and when is not None:
            timer.reschedule(when + seconds)

    def _vision(self) -> bool:
        """Whether the run's model takes images: the agent's ``vision``, else the setting."""
        configured = self.agent.config.vision if self.agent is not None else None
        return self.settings.vision if configured is None else configured

    def _note(self, convo: Sequence[ChatMessage]) -> str:
        """This request's note: volatile sections, then (after tool results) the
        execution summary and any loop warning."""
        parts = [self.volatile]
        if convo and convo[-1].role == "tool" and self.tool_turns is not None:
            parts.append(self.tool_turns.note())
        return "\n\n".join(p for p in parts if p)

    async def _call_llm(self, request: LLMRequest) -> LLMResponse:
        """Ask the provider; fragments become ``chunk`` events and retries
        ``run.retrying``. The call is reserved and settled on the run's meter
        (:mod:`bot.contracts.llm`)."""
        span = self.trace.start("llm", "llm", provider=self.provider.name,
                                model=request.model, iteration=self.iterations)
        if self.trace.verbose:
            span.attributes["input"] = verbose_input(request)
        on_text = None
        pump: asyncio.Task[None] | None = None
        queue: asyncio.Queue[str | Retrying | None] = asyncio.Queue()
        if self.stream and (self.listener is not None or bool(self.observers)):
            # Providers call on_text synchronously from their stream loop; a pump
            # task forwards fragments so slow observers never stall the stream.
            on_text = queue.put_nowait
            pump = asyncio.create_task(_pump(queue, self.emit))

        async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
            retrying = Retrying(attempt, max_attempts, error)
            if pump is not None:
                # Through the same queue as the text: the draft restarts after the
                # failed attempt's last fragment, never before it.
                queue.put_nowait(retrying)
            else:
                await retrying.emit(self.emit)

        try:
            response = await metered_complete(self.provider, request, on_text=on_text,
                                              on_retry=on_retry)
        except BaseException as exc:
            span.end(error=True, error_message=describe_error(exc))
            raise
        finally:
            if pump is not None:
                queue.put_nowait(None)
                await pump
        usage = response.usage
        span.end(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                 cache_read_tokens=usage.cache_read_tokens,
                 cache_write_tokens=usage.cache_write_tokens,
                 output_preview=preview(response.text), tool_calls=len(response.tool_calls))
        if self.iterations == 1:
            # One sample per run is plenty for a moving average, and it is O(request).
            self.estimator.calibrate(request, usage.input_tokens)
        return response

    # -- how the run ends ------------------------------------------------------------

    async def complete(self, final: str, cleaned: str, silent: bool) -> RunResult:
        """The answered run: ``final`` joins the history, ``cleaned`` is delivered unless
        silent."""
        req = self.req
        self.buffer.append(ChatMessage("assistant", final))
        self.trace.root.attributes["output_preview"] = preview(cleaned)
        reply = None if silent else cleaned
        commit = None
        if req.persist:
            # From here the run is answered: a follow-up must not merge into it.
            await self.emit("activity", phase="committing")
            commit = RunCommit(req.session, req.run_id, tuple(self.buffer), self.usage,
                               self.settings.model, self.provider.name,
                               self._record("completed"), self._spans("completed"), reply)
        else:
            await self.store_trace("completed")
        self._log("completed")
        return RunResult(req.run_id, "completed", reply, self.usage, self.iterations,
                         commit=commit, ending=self._event(
                             "run.completed", content=cleaned, silent=silent,
                             usage=self._usage()))

    async def refuse(self, refusal: str, user_turn: ChatMessage | None = None) -> RunResult:
        """The run answers ``refusal`` without asking the model (gates, media, budgets).

        The history records ``user_turn`` (default: a withheld placeholder) and the refusal.
        """
        req, msg = self.req, self.req.message
        # The refused text is not stored (the model would read it as history with the
        # sender's next message); ``user_turn`` is a harmless stand-in (refused files' lines).
        exchange = (
            user_turn or ChatMessage("user", WITHHELD, sender_id=msg.sender_id,
                                     sender_name=msg.display_name),
            ChatMessage("assistant", refusal),
        )
        commit = None
        if req.persist:
            commit = RunCommit(req.session, req.run_id, exchange, None, "", "",
                               self._record("refused"), self._spans("refused"), refusal)
        self._log("refused")
        return RunResult(req.run_id, "refused", refusal, self.usage, 0, commit=commit,
                         ending=self._event("run.completed", content=refusal, silent=False,
                                            refused=True,
                                            usage={"input_tokens": 0, "output_tokens": 0}))

    async def fail(self, error: str) -> RunResult:
        """The run failed with ``error``: the user gets an apology naming it."""
        req = self.req
        # What the user said is kept ("try again" has context), not the tool exchange.
        user = [m for m in self.buffer if m.role == "user"]
        apology = f"Sorry, I couldn't answer that: {error}"
        commit = None
        if req.persist:
            commit = RunCommit(req.session, req.run_id, tuple(user), self.usage, "", "",
                               self._record("failed", error), self._spans("failed", error),
                               apology, failed=True)
        else:
            await self.store_trace("failed", error)
        self._log("failed", error)
        return RunResult(req.run_id, "failed", apology, self.usage, self.iterations, error,
                         commit=commit, ending=self._event("run.failed", error=error))

    async def cancel(self, reason: str) -> None:
        """The run was cancelled (``reason``: "stop", "merged", "shutdown"); nothing is
        written but its trace."""
        await self.store_trace("cancelled", reason)
        self._log("cancelled", reason)
        # The tokens spent so far count against the budgets (bot.engine.budgets).
        await self.emit("run.cancelled", reason=reason, usage=self._usage())

    async def store_trace(self, status: str, error: str = "") -> None:
        """Store the trace on its own; never raises (it runs on failure paths)."""
        try:
            await self.engine.store.record_run(self._record(status, error),
                                               self._spans(status, error))
        except Exception:
            log.exception("could not record the trace of run %s", self.req.run_id)

    def _usage(self) -> dict[str, int]:
        return dataclasses.asdict(self.usage)

    def _event(self, type_: EventType, **payload: object) -> RunEvent:
        return RunEvent(type_, self.req.run_id, self.req.session.key, dict(payload))

    def _record(self, status: str, error: str = "") -> RunRecord:
        u = self.usage
        return RunRecord(
            self.req.run_id, self.req.session.key, status, self.trace.root.started_at,
            time.time(), self.iterations, u.input_tokens, u.output_tokens,
            self.settings.model, error, u.cache_read_tokens, u.cache_write_tokens,
        )

    def _spans(self, status: str, error: str = "") -> list[Span]:
        spans = self.trace.finish(status, error)
        if self.sink.export is not None:
            self.sink.export.export(spans)
        return spans

    def _log(self, status: str, error: str = "") -> None:
        log.info("run %s %s session=%s iterations=%d tokens=%d/%d %.0fms%s",
                 self.req.run_id[:8], status, self.req.session.key, self.iterations,
                 self.usage.input_tokens, self.usage.output_tokens,
                 (time.monotonic() - self.started) * 1000, f" error={error}" if error else "")


def verbose_input(request: LLMRequest) -> str:
    """What a verbose trace keeps of a request's input."""
    data = {"system": request.system,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "note": request.note}
    return json.dumps(data, ensure_ascii=False)[:VERBOSE_INPUT_CHARS]


@dataclass(frozen=True, slots=True)
class Retrying:
    """A provider's ``on_retry`` call, queued behind the text it voids."""

    attempt: int
    max_attempts: int
    error: str

    async def emit(self, emit: Emit) -> None:
        """Announce it as the run's ``run.retrying`` event."""
        await emit("run.retrying", attempt=self.attempt, maxAttempts=self.max_attempts,
                   error=self.error)


async def _pump(queue: asyncio.Queue[str | Retrying | None], emit: Emit) -> None:
    while (item := await queue.get()) is not None:
        if isinstance(item, Retrying):
            await item.emit(emit)
        else:
            await emit("chunk", content=item)
