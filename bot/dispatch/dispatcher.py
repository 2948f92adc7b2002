"""From inbound messages to runs and their commits: commands, lanes, recovery.

Every accepted message is committed to the inbox (:mod:`bot.storage.inbox`) before
:meth:`Dispatcher.submit` returns (then the channel acknowledges it); the run that
answers it marks it done in the same commit as its history and queues the reply in
the outbox, marked delivered once the platform took it. :meth:`Dispatcher.recover`
runs what a dead process left unfinished.

Who is answered is the gate chain's call (:mod:`bot.engine.gates`: intake and start
stages here, the rest in each run); sessions' queues are :mod:`bot.dispatch.lanes`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from bot.agents.router import AgentRouter
from bot.config.settings import Settings
from bot.contracts.channel import Channel
from bot.contracts.commands import Command
from bot.contracts.llm import METER, BudgetRefused, Usage
from bot.contracts.messages import (
    ButtonPress,
    InboundEvent,
    InboundMessage,
    MessageDeletion,
    MessageEdit,
    OutboundMessage,
    ReactionEvent,
    parse_command,
)
from bot.contracts.runtime import Runtime
from bot.dispatch.commands import run_command
from bot.dispatch.corrections import Corrections
from bot.dispatch.delivery import (
    DeliveryCount,
    Redeliveries,
    RunWatch,
    StreamBridge,
    Uncounted,
    commit_run,
    deliver_result,
)
from bot.dispatch.intake import ChatPolicy, PairingPolicy
from bot.dispatch.lanes import Lane, Lanes, Moves, Pending, Running, RunRegistry, join_messages
from bot.dispatch.receipts import Outcome, ReactionHandler, Receipts
from bot.dispatch.replicas import ReplicaWork, close_quietly
from bot.engine.approvals import TEXT_ANSWER
from bot.engine.budgets import Budgets, Payer
from bot.engine.context import TokenEstimator
from bot.engine.gates import Asking, GateChain, Stage
from bot.engine.requests import RunOptions, RunRequest, RunResult
from bot.engine.run_engine import RunEngine
from bot.observability.tracing import hex_id
from bot.storage.claims import Claims
from bot.storage.inbox import Inbox, InboxEntry, OutboxEntry, RunJournal, grouped
from bot.storage.sessions import SessionStore, agent_of, session_key

log = logging.getLogger("roost.dispatch.dispatcher")
intake_log = logging.getLogger("roost.intake")

T = TypeVar("T")

RECEIPTS: dict[str, Outcome] = {"completed": "done", "failed": "error", "refused": "error",
                                "cancelled": "dropped"}
"""The receipt a run's status puts on the messages it answered."""

Leftovers = tuple[list[OutboxEntry], list[InboxEntry]]
"""What a previous process left: replies not confirmed delivered, unfinished messages."""


class PressHandler(Protocol):
    """Who acts on the button presses channels hand in (the approvals)."""

    async def press(self, press: ButtonPress) -> bool:
        """Act on ``press``; ``False`` when it is not one of this handler's buttons."""

    async def answer_text(self, message: InboundMessage) -> bool:
        """Act on ``message`` if it answers a prompt in text (a channel without buttons);
        ``False`` when it is an ordinary message."""


class ShuttingDown(Exception):
    """Raised to a channel that delivers a message while Roost stops: do not acknowledge it."""


class Dispatcher:
    """Turns inbound messages into commands or runs and delivers the replies."""

    def __init__(self, settings: Settings, *, inbox: Inbox, store: SessionStore,
                 engine: RunEngine, router: AgentRouter, channels: Mapping[str, Channel],
                 commands: Callable[[], Mapping[str, Command]], runtime: Runtime,
                 gates: GateChain, policy: ChatPolicy, pairing: PairingPolicy, budgets: Budgets,
                 claims: Claims | None = None,
                 deliveries: DeliveryCount | None = None,
                 presses: PressHandler | None = None,
                 reactions: ReactionHandler | None = None) -> None:
        """``channels`` is the live mapping of running channels; ``commands()`` the
        current commands (they change when plugins do); ``runtime`` is what command
        handlers receive. ``gates`` decide who is answered and how (intake and start
        stages run here; its gates use ``policy``, ``pairing`` (bot.dispatch.intake) and
        ``budgets``, also reserved around each model call). ``claims`` (PostgreSQL,
        several replicas) makes sessions run on the replica holding their lease.
        ``deliveries`` counts each reply handed to a channel (``ok``, ``failed`` (kept and
        retried) or ``given_up``). ``presses`` takes the button presses channels hand in
        (the approval prompts'); ``reactions`` hears of people's reactions on replies."""
        self.settings = settings
        self.presses = presses
        self.inbox = inbox
        self.store = store
        self.engine = engine
        self.router = router
        self.channels = channels
        self.commands = commands
        self.runtime = runtime
        self.gates = gates
        self.pairing = pairing
        self.budgets = budgets
        self.registry = RunRegistry()
        self.deliveries: DeliveryCount = deliveries or Uncounted()
        self.redeliveries = Redeliveries(inbox, channels, self.deliveries)
        self.policy = policy
        self.lanes = Lanes(settings, self.registry)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._closed = False
        # Commands of one chat run in the order they were sent ("/pin a", "/pin b").
        self._command_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.receipts = Receipts(settings, channels, inbox, spawn=self._spawn,
                                 reactions=reactions)
        """The bot's reactions on people's messages, and people's on its replies."""
        self.replicas: ReplicaWork | None = None if claims is None else ReplicaWork(
            inbox, claims, admit=self.admit, busy=self.busy, resend=self._resend)
        """On PostgreSQL (several replicas): who runs which session (bot.dispatch.replicas).
        ``None`` on SQLite: this process runs what it receives."""
        self.corrections = Corrections(
            settings, inbox, self.lanes, policy, move=self._move,
            hand=None if self.replicas is None else self.replicas.submitted)
        """People's edits and deletions of the messages (bot.dispatch.corrections)."""

    # -- entry point -------------------------------------------------------

    async def receive(self, event: InboundEvent) -> None:
        """The handler channels are given: a message is :meth:`submit`-ted, a button press
        goes to ``presses``, a reaction to :attr:`receipts`, edits and deletions to
        ``corrections``; anything else is not
        acted on yet (logged at debug level here, the one place that decides)."""
        if isinstance(event, InboundMessage):
            # Only a text shaped like "approve ID" goes to the approvals to look up.
            if self.presses is None or TEXT_ANSWER.fullmatch(event.text) is None \
                    or not await self.presses.answer_text(event):
                await self.submit(event)
            return
        if isinstance(event, ReactionEvent):
            await self.receipts.reaction(event)
            return
        if isinstance(event, MessageEdit | MessageDeletion):
            if self._closed:
                raise ShuttingDown("Roost is shutting down")
            await self.corrections.take(event)
            return
        if isinstance(event, ButtonPress) and self.presses is not None:
            try:
                if await self.presses.press(event):
                    return
            except Exception:
                # A press that cannot be handled must not make the platform redeliver it.
                intake_log.exception("%s: handling a button press failed", event.channel)
                return
        intake_log.debug("%s: %s not acted on", event.channel, type(event).__name__)

    async def submit(self, message: InboundMessage) -> None:
        """Accept one normalized message; returns once it is durably recorded.

        The run or command it starts works in tasks. A redelivery of a message
        recorded before is dropped. Raises :class:`ShuttingDown` (nothing
        recorded, so the channel must not acknowledge) once Roost is stopping.
        """
        if self._closed:
            raise ShuttingDown("Roost is shutting down")
        if not message.text.strip() and not message.attachments:
            return
        parsed = parse_command(message.text)
        key = self.key_for(message)
        decision = await self.gates.check(Stage.INTAKE, Asking(
            message, message.text, key, self.settings, command=parsed is not None))
        if decision.action != "pass":
            if decision.reply is not None:
                self._notify(message, decision.reply)
            return
        if self.replicas is not None and parsed is None:
            # Recorded pending; it runs on whichever replica holds the session.
            shared = await self.inbox.add(message, key, "message")
            if shared is None:
                log.info("%s delivered %s again; it was recorded before", message.channel,
                         message.event_id)
            elif not self._closed:
                if self.settings.ack_reaction:
                    self.receipts.stored(message)
                await self.replicas.submitted(shared)
                if self.corrections.early:
                    await self.corrections.arrived(message)
            return
        lane = self.lanes.by_key.get(key)
        # A message whose run will start at once is recorded as started.
        now = parsed is None and (lane is None or (not lane.queue and not lane.running))
        entry = await self.inbox.add(message, key, "message" if parsed is None else "command",
                                     running=now)
        if entry is None:
            log.info("%s delivered %s again; it was recorded before", message.channel,
                     message.event_id)
            return
        if self._closed:
            return  # recorded: it runs after the next start
        if parsed is not None:
            self._spawn(self._command(message, *parsed, entry=entry.id))
            return
        if self.settings.ack_reaction:
            self.receipts.stored(message)
        lane = self.lanes.lane(key, message)
        self._move(lane, self.lanes.enqueue(lane, message, entry.id, counted=now))
        if self.corrections.early:  # an edit or a deletion that came first
            await self.corrections.arrived(message)

    def _receipt_ended(self, message: InboundMessage, entries: Sequence[int],
                       outcome: Outcome) -> None:
        """Replace the ack reactions of a run that ended, when acks are on."""
        if self.settings.ack_reaction:
            self.receipts.ended(message, entries, outcome)

    # -- queries and controls used by commands -------------------------------

    def run_scheduled(self, message: InboundMessage, options: RunOptions | None = None, *,
                      deliver_failed: bool = True) -> asyncio.Future[RunResult]:
        """Queue a run that no person sent (cron, heartbeat) in ``message``'s chat.

        It waits its turn in the chat's lane like any message, is never merged
        with one, and its reply is delivered to that chat (``NO_REPLY`` sends
        nothing; a failure's apology only when ``deliver_failed``, so a caller
        that retries can report once). ``options`` say how it runs; the future
        resolves with the run's result.
        """
        done: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        pending = Pending(message, time.monotonic(), options or RunOptions(), False, done,
                          deliver_failed)
        lane = self.lanes.lane(self.key_for(message), message)
        self._move(lane, self.lanes.add(lane, pending))
        return done

    def key_for(self, message: InboundMessage) -> str:
        """The session ``message`` belongs to, under the agent its chat is bound to."""
        return session_key(message, self.router.route(message))

    def queue_length(self, key: str) -> int:
        """Messages waiting in a session's queue."""
        return self.lanes.queue_length(key)

    def running_count(self, key: str) -> int:
        """Runs in flight for a session (not counting ones already cancelled)."""
        return len(self.registry.for_session(key))

    def stop_oldest(self, key: str) -> bool:
        """Cancel the session's oldest running run (``/stop``)."""
        runs = self.registry.for_session(key)
        return bool(runs) and self.registry.abort(runs[0].run_id, key, "stop")

    def stop_all(self, key: str) -> tuple[int, int]:
        """Cancel every run of a session and drop its queue (``/stopall``)."""
        dropped = self.lanes.clear_queue(key)
        return self.registry.abort_session(key, "stop"), dropped

    async def drain(self) -> None:
        """Wait until no run, queued message or command is left."""
        while self.lanes.by_key or self._tasks:
            self._changed.clear()
            await self._changed.wait()

    async def close(self, grace: float = 0.0) -> None:
        """Refuse new messages, let runs in flight and replies being sent again finish for
        ``grace`` seconds, cancel the rest.

        Queued messages do not start; like the cancelled runs' messages they
        stay in the inbox and run after the next start. Replies waiting to be sent
        again stay in the outbox for it.
        """
        self._closed = True
        self.lanes.close()
        self.redeliveries.stop()
        await close_quietly(self.replicas)  # claims no more; its leases lapse
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    if self._tasks:
                        await self.drain()
                    await self.redeliveries.sent()
        self.registry.abort_all("shutdown")
        for task in list(self._tasks):
            task.cancel()
        self.redeliveries.cancel()
        await asyncio.gather(*self._tasks, *self.redeliveries.tasks, return_exceptions=True)

    async def recover(self, leftovers: Leftovers) -> None:
        """Deliver committed replies and run inbox entries a dead process left unfinished.

        ``leftovers`` must be read before any channel starts receiving, or a
        message this process is already running would be run twice. Entries
        run again in their order, per session; merged entries of one
        interrupted run stay merged and resume from its journal. An entry whose
        run was interrupted ``inbox_max_attempts`` times is given up: its sender
        is told, and the log says which.
        """
        outbox, entries = leftovers
        # A DM recorded just before a crash, from someone the pairing gate refuses
        # (or no longer admits: revoked meanwhile), is closed, not run.
        refused = [e for e in entries if not await self.pairing.admits(e.message)]
        if refused:
            self.inbox.close([e.id for e in refused])
            entries = [e for e in entries if e not in refused]
        for out in outbox:
            reply = out.message if out.attempt_note is None else \
                dataclasses.replace(out.message, attempt_note=out.attempt_note)
            self.redeliveries.schedule(out.id, reply, out.draft_id, out.attempts, delay=0.0)
        if entries:
            log.info("recovering %d unfinished message(s) from the inbox", len(entries))
        for group in grouped(entries):
            if group[0].change is not None:
                await self.corrections.apply(group[0])
            else:
                self._resume(group, await self.inbox.journal(group[-1].id))

    async def admit(self, entries: list[InboxEntry]) -> None:
        """Run entries this replica claimed (bot.dispatch.replicas), in order per session;
        those another replica's run had started resume from its journal."""
        if self._closed:
            return
        for group in grouped(entries):
            if group[0].change is not None:
                await self.corrections.apply(group[0])
                continue
            started = group[-1].state == "running"
            self._resume(group, await self.inbox.journal(group[-1].id) if started else None)

    async def _resend(self, replies: list[OutboxEntry]) -> None:
        """Send replies taken over from dead replicas."""
        await self.recover((replies, []))

    def busy(self, key: str) -> bool:
        """Whether session ``key`` has a run, a queued message or a command here."""
        return key in self.lanes.by_key or key in self._command_locks

    def _resume(self, group: list[InboxEntry], journal: RunJournal | None) -> None:
        head = group[-1]
        ids = tuple(e.id for e in group)
        # The newest entry counts each start of the group's run once.
        if head.attempts >= self.settings.inbox_max_attempts:
            self.inbox.close(ids, "given_up")
            log.warning("giving up %s message %s of %s:%s: its run was interrupted %d times",
                        head.message.channel, head.message.event_id or head.id,
                        head.message.channel, head.message.sender_id, head.attempts)
            self._notify(head.message, "I could not answer this message: working on it "
                         "stopped me several times, so I gave up on it. Please send it again "
                         "in a different form.")
            self._receipt_ended(head.message, ids, "error")
            channel = self.channels.get(head.message.channel)
            if head.draft_id and channel is not None:
                self._spawn(_quietly(channel.withdraw(head.message.chat_id, head.draft_id)))
            return
        if head.kind == "command":
            parsed = parse_command(head.message.text)
            if parsed is None:
                self.inbox.close(ids)
                return
            self._spawn(self._command(head.message, *parsed, entry=head.id))
            return
        texts = tuple(e.message.text for e in group)
        message = dataclasses.replace(
            head.message, text=join_messages(texts, self.settings.max_message_chars),
            attachments=tuple(a for e in group for a in e.message.attachments))
        pending = Pending(message, time.monotonic(), entries=ids, journal=journal,
                           stale_draft=head.draft_id, texts=texts)
        lane = self.lanes.lane(head.session_key, message)
        self._move(lane, self.lanes.add(lane, pending))

    # -- one run ---------------------------------------------------------------

    async def _run(self, lane: Lane, entry: Running, run_id: str) -> None:
        pending = entry.pending
        message = pending.message
        channel = self.channels.get(message.channel)
        bridge: StreamBridge | None = None
        watch: RunWatch | None = None
        payer: Payer | None = None
        try:
            if pending.entries and not pending.counted:
                await self.inbox.started(pending.entries, run_id, fresh=pending.fresh)
            if pending.stale_draft and channel is not None:
                with contextlib.suppress(Exception):
                    await channel.withdraw(message.chat_id, pending.stale_draft)
            agent = agent_of(lane.key)
            decision = await self.gates.check(Stage.START, Asking(
                message, message.text, lane.key, self.settings,
                from_person=pending.from_person, agent=agent))
            if decision.action != "pass":
                self._refuse(message, pending, run_id, lane.key, decision.reply or "")
                return
            await self.engine.held()  # tools still being listed at start, say
            # Every model call of the run, and of what serves it, reserves against its budgets.
            payer = self.budgets.meter(message, agent, lambda text: self._notify(message, text),
                                       job=pending.options.usage_job)
            METER.set(payer)
            plugins = self.engine.plugins  # the run and its stream use one plugin state
            session = await self.store.get(lane.key)
            bridge = StreamBridge(channel, message, plugins.sanitizers)
            watch = RunWatch(entry, bridge, self.inbox,
                             lambda text: self._notify(message, text))
            typing = channel.typing(message) if channel else contextlib.nullcontext()
            async with typing:
                asked, options = message, pending.options
                if pending.from_person and message.chat_type != "direct":
                    # The group's chatter since the last run, and the files sent in it.
                    kept = await self.policy.take(lane.key)
                    asked = self.policy.with_earlier_files(kept, message)
                    options = dataclasses.replace(options, extra_context=self.policy.context(
                        kept, self._estimator(agent_of(lane.key))))
                journal = None
                if pending.entries:
                    journal = pending.journal or RunJournal(self.inbox, pending.entries[-1])
                request = RunRequest.with_options(
                    asked, session, options, run_id=run_id, agent=agent, plugins=plugins,
                    journal=journal, sink=dataclasses.replace(self.engine.sink, events=watch))
                try:
                    result = await self.engine.execute(request)
                except BudgetRefused as exc:
                    # Its first model call did not fit: like a refusal before the run.
                    if bridge.stream is not None:
                        await bridge.stream.finish(None)
                    self._refuse(message, pending, run_id, lane.key, exc.reply)
                    return
                if result.commit is not None:
                    entry.shown()  # answered: a follow-up starts a run of its own
                # Tracked (drain, close) and shielded: a /stop arriving now does not
                # leave the commit written but its run unannounced.
                result = await asyncio.shield(self._spawn(self._close_run(
                    request, result, message, pending.entries, bridge.draft_id)))
            if self.replicas is not None and run_id in self.replicas.lost_runs:
                # Another replica holds the session now and answers these entries.
                self.replicas.lost_runs.discard(run_id)
                log.warning("run %s for %s not recorded: the session's lease was lost",
                            run_id, lane.key)
                if bridge.stream is not None:
                    await bridge.stream.finish(None)
                return
            if result.status == "failed" and not pending.deliver_failed:
                if bridge.stream is not None:
                    await bridge.stream.finish(None)
            else:
                await deliver_result(channel, message, result, bridge.stream,
                                     inbox=self.inbox, redeliveries=self.redeliveries,
                                     counts=self.deliveries)
            self._receipt_ended(message, pending.entries, RECEIPTS[result.status])
            if pending.done is not None and not pending.done.done():
                pending.done.set_result(result)
        except asyncio.CancelledError:
            if bridge is not None and bridge.stream is not None:
                with contextlib.suppress(Exception):
                    await bridge.stream.finish(None)
            if pending.done is not None and not pending.done.done():
                pending.done.cancel()
            reason = entry.run.cancel_reason if entry.run is not None else ""
            if reason == "shutdown" or not reason:
                self.inbox.requeue(pending.entries)
            elif reason not in ("merged", "edited"):  # those run again in another run
                self.inbox.close(pending.entries)
                self._receipt_ended(message, pending.entries, "dropped")
            raise
        except Exception as exc:
            log.exception("run %s for %s crashed", run_id, lane.key)
            self.inbox.close(pending.entries)
            self._receipt_ended(message, pending.entries, "error")
            if pending.done is not None and not pending.done.done():
                pending.done.set_exception(exc)
            else:
                self._notify(message, "Something went wrong on my side; please try again.")
        finally:
            if payer is not None:
                payer.release()  # 80 % warnings: after the reply
            self._move(lane, self.lanes.finished(lane, entry))
            if self.replicas is not None and not self.busy(lane.key):
                self.replicas.idle(lane.key)
            self._changed.set()

    async def _close_run(self, request: RunRequest, result: RunResult,
                         message: InboundMessage, entries: tuple[int, ...],
                         draft: str | None) -> RunResult:
        """Commit the run (history, inbox, outbox) and announce its end. The caller shields
        it from the run's own cancellation."""
        if result.commit is not None:
            result = await commit_run(self.store, self.inbox, self.replicas, message, entries,
                                      result, draft)
        await self.engine.finished(request, result)
        return result

    def _refuse(self, message: InboundMessage, pending: Pending, run_id: str, key: str,
                refusal: str) -> None:
        """A run refused by a budget before the model answered: nothing of it is stored."""
        self.inbox.close(pending.entries)
        self._receipt_ended(message, pending.entries, "error")
        result = RunResult(run_id, "refused", refusal, Usage())
        if pending.from_person:
            self._notify(message, refusal)
        else:
            log.info("scheduled %s run in %s skipped: %s", pending.options.kind, key, refusal)
        if pending.done is not None and not pending.done.done():
            pending.done.set_result(result)

    def _estimator(self, agent: str) -> TokenEstimator:
        """The token estimator of the provider ``agent``'s runs use (the default one
        until the agent was first resolved)."""
        resolved = self.router.peek(agent)
        provider = resolved.provider if resolved is not None else None
        return self.engine.estimator_for((provider or self.engine.provider).name)

    # -- commands --------------------------------------------------------------

    async def _command(self, message: InboundMessage, name: str, args: str, *,
                       entry: int | None = None) -> None:
        key = self.key_for(message)
        lock, users = self._command_locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                # Routed again now, not when queued: an earlier command in this chat
                # (/agent reload) may have changed the bindings.
                reply = await run_command(message, name, args, self.commands(),
                                          self.settings, self.runtime, self.key_for(message))
                if reply:
                    await self._send(OutboundMessage.reply_to_message(message, reply))
            if entry is not None:
                self.inbox.close((entry,))
        finally:
            users[0] -= 1
            if not users[0]:
                del self._command_locks[key]
                if self.replicas is not None and not self.busy(key):
                    self.replicas.idle(key)

    # -- helpers ---------------------------------------------------------------

    def _move(self, lane: Lane, moves: Moves) -> None:
        """Do what a lane change asks: close and tell the dropped, start the runs."""
        for pending in moves.dropped:
            self.inbox.close(pending.entries)
            self._receipt_ended(pending.message, pending.entries, "dropped")
            self._notify(pending.message, "Too many messages were waiting, so I dropped "
                         "this one. Send it again if you still need an answer.")
        for entry in moves.start:
            run_id = hex_id()
            task = self._spawn(self._run(lane, entry, run_id))
            self.lanes.started(lane, entry, run_id, task)

    def _notify(self, message: InboundMessage, text: str) -> None:
        self._spawn(self._send(OutboundMessage.reply_to_message(message, text, "notice")))

    async def _send(self, out: OutboundMessage) -> None:
        channel = self.channels.get(out.channel)
        if channel is None:
            log.error("no channel %r for a reply", out.channel)
            return
        try:
            await channel.send(out)
        except Exception:
            self.deliveries.delivery(out.channel, "given_up")
            log.exception("sending to %s:%s failed", out.channel, out.chat_id)
            return
        self.deliveries.delivery(out.channel, "ok")

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", exc_info=task.exception())
        self._changed.set()


async def _quietly(work: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(Exception):
        await work
