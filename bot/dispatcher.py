"""From inbound messages to runs: commands, per-session lanes, queues and merging.

Each session has a lane: up to one run at a time in a direct chat and
``group_max_concurrent`` in a group; further messages wait in a FIFO capped at
``queue_cap`` (the oldest is dropped with a notice). A message from the same
sender that arrives within ``merge_window_ms`` of the previous one, while that
message's run has shown nothing yet, cancels the run and restarts it with both
texts, so a lone message is never delayed to wait for a possible follow-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.channel import Channel, ReplyStream
from bot.commands import CommandContext, parse_command
from bot.events import RunEvent
from bot.messages import InboundMessage, OutboundMessage
from bot.registry import ActiveRun, RunRegistry
from bot.runloop import NO_REPLY, RunRequest, RunResult
from bot.sanitize import Sanitizer, run_pipeline
from bot.sessions import agent_of, session_key

if TYPE_CHECKING:
    from bot.app import Roost

log = logging.getLogger("roost.dispatch")


@dataclass(slots=True)
class _Pending:
    message: InboundMessage
    received: float
    options: dict[str, Any] | None = None
    """RunRequest options of a scheduled run (mode, kind, extra_context...)."""
    done: asyncio.Future[RunResult] | None = None
    deliver_failed: bool = True


@dataclass(slots=True)
class _Running:
    pending: _Pending
    run: ActiveRun | None = None
    output: bool = False


@dataclass(slots=True)
class Lane:
    """The runs and queue of one session."""

    key: str
    limit: int
    running: list[_Running] = field(default_factory=list)
    queue: deque[_Pending] = field(default_factory=deque)


class Dispatcher:
    """Turns inbound messages into commands or runs and delivers the replies."""

    def __init__(self, app: Roost) -> None:
        self.app = app
        self.settings = app.settings
        self.registry = RunRegistry()
        self.lanes: dict[str, Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._closed = False
        self._group_context: dict[str, deque[InboundMessage]] = {}
        # Commands of one chat run in the order they were sent ("/pin a", "/pin b").
        self._command_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    # -- entry point -------------------------------------------------------

    async def submit(self, message: InboundMessage) -> None:
        """Accept one normalized message; returns at once, the work runs in tasks."""
        if self._closed:
            log.warning("message from %s:%s ignored: shutting down",
                        message.channel, message.sender_id)
            return
        if not message.text.strip() and not message.attachments:
            return
        parsed = parse_command(message.text)
        if not self._allowed(message, parsed is not None):
            return
        if parsed is not None:
            self._spawn(self._command(message, *parsed))
            return
        self._enqueue(message)

    def _allowed(self, message: InboundMessage, is_command: bool) -> bool:
        """Apply the DM and group policies; keep un-addressed group messages as context."""
        s = self.settings
        admin = s.is_admin(message.channel, message.sender_id)
        if message.chat_type == "direct":
            dm = s.dm_policy_for(message.channel)
            if admin or dm == "open" or (
                    dm == "allowlist"
                    and f"{message.channel}:{message.sender_id}" in s.dm_allowlist):
                return True
            log.info("DM from %s:%s ignored (dm policy %s)", message.channel,
                     message.sender_id, dm)
            return False
        policy = s.group_policy_for(message.channel, message.chat_id)
        if policy == "all" or (policy == "mention" and (message.mentioned or is_command)):
            return True
        if policy == "off":
            return is_command and admin
        if s.group_context_messages:
            key = self.key_for(message)
            kept = self._group_context.get(key)
            if kept is None:
                kept = self._group_context[key] = deque(maxlen=s.group_context_messages)
            kept.append(message)
        return False

    def _take_context(self, key: str) -> str:
        """Group messages the bot was not addressed in since its last run, as prompt text."""
        kept = self._group_context.pop(key, None)
        if not kept:
            return ""
        lines = [f"[{m.display_name} (id {m.sender_id})]: {m.text[:2_000]}" for m in kept]
        return ("Recent messages in this group that were not addressed to you, oldest "
                "first:\n" + "\n".join(lines))

    # -- queries and controls used by commands -------------------------------

    def run_scheduled(self, message: InboundMessage, *, deliver_failed: bool = True,
                      **options: Any) -> asyncio.Future[RunResult]:
        """Queue a run that no person sent (cron, heartbeat) in ``message``'s chat.

        It waits its turn in the chat's lane like any message, is never merged
        with one, and its reply is delivered to that chat (``NO_REPLY`` sends
        nothing; a failure's apology only when ``deliver_failed``, so a caller
        that retries can report once). ``options`` go to
        :class:`bot.runloop.RunRequest`; the future resolves with the run's result.
        """
        done: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        pending = _Pending(message, time.monotonic(), options, done, deliver_failed)
        lane = self._lane(message)
        if len(lane.running) < lane.limit:
            self._start(lane, pending)
        else:
            lane.queue.append(pending)
        return done

    def key_for(self, message: InboundMessage) -> str:
        """The session ``message`` belongs to, under the agent its chat is bound to."""
        return session_key(message, self.app.engine.router.route(message))

    def _lane(self, message: InboundMessage) -> Lane:
        key = self.key_for(message)
        lane = self.lanes.get(key)
        if lane is None:
            limit = self.settings.group_max_concurrent if message.chat_type == "group" else 1
            lane = self.lanes[key] = Lane(key, limit)
        return lane

    def queue_length(self, key: str) -> int:
        """Messages waiting in a session's queue."""
        lane = self.lanes.get(key)
        return len(lane.queue) if lane else 0

    def running_count(self, key: str) -> int:
        """Runs in flight for a session (not counting ones already cancelled)."""
        return len(self.registry.for_session(key))

    def stop_oldest(self, key: str) -> bool:
        """Cancel the session's oldest running run (``/stop``)."""
        runs = self.registry.for_session(key)
        return bool(runs) and self.registry.abort(runs[0].run_id, key, "stop")

    def stop_all(self, key: str) -> tuple[int, int]:
        """Cancel every run of a session and drop its queue (``/stopall``)."""
        lane = self.lanes.get(key)
        dropped = 0
        if lane:
            dropped = len(lane.queue)
            lane.queue.clear()
        return self.registry.abort_session(key, "stop"), dropped

    async def drain(self) -> None:
        """Wait until no run, queued message or command is left."""
        while self.lanes or self._tasks:
            self._changed.clear()
            await self._changed.wait()

    async def close(self) -> None:
        """Refuse new messages, cancel everything in flight and wait for it."""
        self._closed = True
        for lane in self.lanes.values():
            lane.queue.clear()
        self.registry.abort_all("shutdown")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- lanes ---------------------------------------------------------------

    def _enqueue(self, message: InboundMessage) -> None:
        lane = self._lane(message)
        now = time.monotonic()
        window = self.settings.merge_window_ms / 1000
        if window and self._merge(lane, message, now, window):
            return
        if len(lane.running) < lane.limit:
            self._start(lane, _Pending(message, now))
            return
        if len(lane.queue) >= self.settings.queue_cap:
            dropped = lane.queue.popleft()
            if dropped.done is not None and not dropped.done.done():
                dropped.done.set_exception(RuntimeError("dropped: the chat's queue was full"))
            self._notify(dropped.message, "Too many messages were waiting, so I dropped this "
                         "one. Send it again if you still need an answer.")
        lane.queue.append(_Pending(message, now))

    def _merge(self, lane: Lane, message: InboundMessage, now: float, window: float) -> bool:
        for entry in reversed(lane.running):
            prev = entry.pending
            if (prev.message.sender_id == message.sender_id and not entry.output
                    and prev.options is None
                    and now - prev.received <= window and entry.run is not None):
                lane.running.remove(entry)
                self.registry.abort(entry.run.run_id, lane.key, "merged")
                self._start(lane, _joined(prev, message, now))
                return True
        if lane.queue and len(lane.running) >= lane.limit:
            last = lane.queue[-1]
            if (last.message.sender_id == message.sender_id and last.options is None
                    and now - last.received <= window):
                lane.queue[-1] = _joined(last, message, now)
                return True
        return False

    def _start(self, lane: Lane, pending: _Pending) -> None:
        entry = _Running(pending)
        lane.running.append(entry)
        run_id = uuid.uuid4().hex
        task = self._spawn(self._run(lane, entry, run_id))
        entry.run = ActiveRun(run_id, lane.key, task, time.monotonic())
        self.registry.register(entry.run)

    def _finished(self, lane: Lane, entry: _Running) -> None:
        if entry.run is not None:
            self.registry.unregister(entry.run.run_id)
        if entry in lane.running:
            lane.running.remove(entry)
        while lane.queue and len(lane.running) < lane.limit and not self._closed:
            self._start(lane, lane.queue.popleft())
        if not lane.running and not lane.queue and self.lanes.get(lane.key) is lane:
            del self.lanes[lane.key]
        self._changed.set()

    # -- one run ---------------------------------------------------------------

    async def _run(self, lane: Lane, entry: _Running, run_id: str) -> None:
        message = entry.pending.message
        channel = self.app.channels.get(message.channel)
        bridge: _StreamBridge | None = None
        try:
            session = await self.app.store.get(lane.key)
            bridge = _StreamBridge(channel, message, self.app.engine.sanitizers)

            async def listener(event: RunEvent) -> None:
                if event.type == "chunk":
                    entry.output = True
                    await bridge.add(event.payload["content"])
                elif event.type == "tool.call":
                    entry.output = True
                    await bridge.end_block()
                elif event.type == "activity" and event.payload.get("notice"):
                    self._notify(message, event.payload["notice"])

            typing = channel.typing(message) if channel else contextlib.nullcontext()
            async with typing:
                options = entry.pending.options or {
                    "extra_context": self._take_context(lane.key)}
                options = {"agent": agent_of(lane.key), **options}
                result = await self.app.engine.run(
                    RunRequest(message, session, run_id=run_id, **options), listener)
            if result.status == "failed" and not entry.pending.deliver_failed:
                if bridge.stream is not None:
                    await bridge.stream.finish(None)
            else:
                await self._deliver(channel, message, result, bridge.stream)
            if entry.pending.done is not None and not entry.pending.done.done():
                entry.pending.done.set_result(result)
        except asyncio.CancelledError:
            if bridge is not None and bridge.stream is not None:
                with contextlib.suppress(Exception):
                    await bridge.stream.finish(None)
            if entry.pending.done is not None and not entry.pending.done.done():
                entry.pending.done.cancel()
            raise
        except Exception as exc:
            log.exception("run %s for %s crashed", run_id, lane.key)
            if entry.pending.done is not None and not entry.pending.done.done():
                entry.pending.done.set_exception(exc)
            else:
                self._notify(message, "Something went wrong on my side; please try again.")
        finally:
            self._finished(lane, entry)

    async def _deliver(self, channel: Channel | None, message: InboundMessage,
                       result: RunResult, stream: ReplyStream | None) -> None:
        if channel is None:
            log.error("no channel %r to deliver run %s", message.channel, result.run_id)
            return
        try:
            if stream is not None:
                await stream.finish(result.reply)
            elif result.reply is not None:
                await channel.send(OutboundMessage.reply_to_message(
                    message, result.reply, "error" if result.status == "failed" else "reply"))
        except Exception:
            # The run is already persisted; only the delivery is lost.
            log.exception("delivering run %s to %s:%s failed", result.run_id,
                          message.channel, message.chat_id)

    # -- commands --------------------------------------------------------------

    async def _command(self, message: InboundMessage, name: str, args: str) -> None:
        key = self.key_for(message)
        lock, users = self._command_locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                await self._run_command(message, name, args)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._command_locks[key]

    async def _run_command(self, message: InboundMessage, name: str, args: str) -> None:
        command = self.app.commands.get(name)
        is_admin = self.settings.is_admin(message.channel, message.sender_id)
        if command is None:
            reply: str | None = f"I don't know /{name}. Send /help to see the commands."
        elif command.admin_only and not is_admin:
            reply = f"/{command.name} is for admins only."
            log.warning("non-admin %s:%s tried /%s", message.channel, message.sender_id, name)
        else:
            # Routed again now, not when queued: an earlier command in this chat
            # (/agent reload) may have changed the bindings.
            key = self.key_for(message)
            ctx = CommandContext(self.app, message, command.name, args, is_admin, key,
                                 agent_of(key))
            try:
                reply = await command.handler(ctx)
            except Exception as exc:
                log.exception("command /%s failed", name)
                reply = f"/{command.name} failed: {exc}"
        if reply:
            await self._send(OutboundMessage.reply_to_message(message, reply))

    # -- helpers ---------------------------------------------------------------

    def _notify(self, message: InboundMessage, text: str) -> None:
        self._spawn(self._send(OutboundMessage.reply_to_message(message, text, "notice")))

    async def _send(self, out: OutboundMessage) -> None:
        channel = self.app.channels.get(out.channel)
        if channel is None:
            log.error("no channel %r for a reply", out.channel)
            return
        try:
            await channel.send(out)
        except Exception:
            log.exception("sending to %s:%s failed", out.channel, out.chat_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", exc_info=task.exception())
        self._changed.set()


def _joined(first: _Pending, second: InboundMessage, now: float) -> _Pending:
    # Reply to the newest message: that is the one the sender is looking at.
    text = f"{first.message.text}\n{second.text}"
    attachments = first.message.attachments + second.attachments
    return _Pending(dataclasses.replace(second, text=text, attachments=attachments), now)


class _StreamBridge:
    """Forwards streamed text to a channel, holding back a possible NO_REPLY.

    Text the model writes before calling tools becomes its own message, so the
    final answer starts a fresh one instead of being glued onto it.
    """

    def __init__(self, channel: Channel | None, message: InboundMessage,
                 sanitizers: Sequence[Sanitizer]) -> None:
        self.channel = channel
        self.message = message
        self.sanitizers = sanitizers
        self.stream = channel.open_stream(message) if channel is not None else None
        self.text = ""
        self.visible = ""
        self.shown = False

    async def end_block(self) -> None:
        if self.stream is None or self.channel is None:
            return
        if self.shown:
            block = run_pipeline(self.text, self.sanitizers)
            await self.stream.finish(block if block and block != NO_REPLY else None)
            self.stream = self.channel.open_stream(self.message)
        self.text = ""
        self.visible = ""
        self.shown = False

    async def add(self, fragment: str) -> None:
        if self.stream is None:
            return
        self.text += fragment
        # Show only what the final reply will show: sanitized, and nothing from
        # a thinking or tool block whose closing tag has not arrived yet.
        visible = run_pipeline(_settled(self.text), self.sanitizers)
        if not visible or NO_REPLY.startswith(visible) or visible == self.visible:
            return
        self.shown = True
        self.visible = visible
        await self.stream.push(visible)


_HIDDEN_BLOCK = re.compile(
    r"<(think|thinking|thought|antthinking|tool_call|function_calls?|tool_use|invoke)\b",
    re.IGNORECASE)


def _settled(text: str) -> str:
    """``text`` up to any hidden block still open, or a tag still being written."""
    for match in _HIDDEN_BLOCK.finditer(text):
        close = re.compile(rf"</{match.group(1)}\s*>", re.IGNORECASE)
        if not close.search(text, match.end()):
            text = text[:match.start()]
            break
    lt = text.rfind("<")
    if lt != -1 and ">" not in text[lt:]:
        text = text[:lt]
    return text
