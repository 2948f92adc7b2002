"""Ask before acting: a run pauses at a tool that needs approval until a person decides.

:class:`Approvals` is the service (one per app): it asks in the chat with three
buttons, decides presses (:meth:`Approvals.press`: who may, once, atomically in the
database) and records every decision (:mod:`bot.storage.approvals`). A run gets a
:class:`RunGate` from it, which screens each batch of tool calls: a call that needs
approval runs only once approved; a denied (or unanswered, or stopped) one gets a
structured ``APPROVAL_DENIED`` error instead. The waiting run polls its row, so a
press decided on another replica resumes it; a row pending when the process died is
found again by the resumed run, which waits on without asking again.

Where a channel has no buttons (:attr:`Capabilities.buttons` false) the prompt says
how to answer in text ("approve ID", "deny ID", "approve ID session", the ID being
the first :data:`CODE_LENGTH` characters of the row's id) and
:meth:`Approvals.answer_text` decides such a message by the same rules as a press;
the Control UI decides through :meth:`Approvals.decide_as`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, cast

from bot.config.settings import Settings
from bot.contracts.channel import Channel
from bot.contracts.llm import ToolCall
from bot.contracts.messages import (
    Button,
    ButtonPress,
    ButtonRows,
    ChatType,
    InboundMessage,
    OutboundFile,
    OutboundMessage,
)
from bot.contracts.tools import ToolResult
from bot.storage.approvals import Approval, ApprovalState, ApprovalStore, Asked
from bot.storage.inbox import INTERRUPTED
from bot.tools.error_patterns import PERMISSION

log = logging.getLogger("roost.engine.approvals")

Approvers = Literal["requester", "admins", "anyone"]

DATA_PREFIX = "ap:"
"""Button data of approval prompts: ``ap:<approval id>:<a|d|s>``."""
CHOICES: Mapping[str, ApprovalState] = {"a": "approved", "d": "denied", "s": "session"}
LONG_ARGUMENTS = 1500
"""Characters of arguments shown in the prompt's text; longer ones go in full in an
attached text file (the text says so), never cut silently."""
POLL_SECONDS = 1.0
"""How often a waiting run reads its row (a press decided on another replica)."""
CANCELLERS: Mapping[str, str] = {"stop": "/stop", "merged": "a newer message",
                                  "edited": "an edit of the message",
                                  "withdrawn": "an edit of the message"}
"""``decided_by`` of a question withdrawn because its run was cancelled, by the reason."""
NOBODY = "nobody to ask"
UNSHOWN = "nobody: the question could not be shown"
"""``decided_by`` of a call whose prompt the platform refused."""
"""``decided_by`` of a scheduled run's call that no one pre-approved."""

CODE_LENGTH = 6
"""Characters of an approval's id a text prompt shows (a longer prefix answers it too)."""
TEXT_ANSWER = re.compile(
    r"\s*/?(?P<verb>approve|deny)\s+(?P<code>[0-9a-f]{6,20})"
    r"(?P<session>\s+(?:for\s+(?:this\s+)?)?session)?\s*[.!]?\s*", re.IGNORECASE)
"""A text answer to a prompt on a channel without buttons."""
UI_DECIDER = "{name} (Control UI)"
"""``decided_by`` of a decision taken on the Control UI's approvals page."""

OUTCOMES: Mapping[str, str] = {
    "approved": "Approved", "session": "Approved for this session", "denied": "Denied",
    "timeout": "Denied (no answer in time)", "cancelled": "Cancelled",
}


def denied_result(row: Approval) -> ToolResult:
    """The structured tool error a denied call gives the model (who and when)."""
    when = datetime.fromtimestamp(row.decided_at or time.time(), UTC).isoformat(
        timespec="seconds")
    who = row.decided_by or "nobody"
    reason = {"timeout": f"nobody answered before {when}",
              "cancelled": f"the run was stopped by {who} at {when}",
              "denied": f"{who} denied it at {when}"}.get(row.state, f"{who} at {when}")
    return ToolResult(json.dumps({
        "status": "error",
        "error": f"The call of '{row.tool}' was not approved: {reason}. It did not run.",
        "error_code": "APPROVAL_DENIED",
        "error_type": PERMISSION,
        "affected_resources": [row.tool],
        "dependencies": [],
        "suggested_actions": ["Tell the user it was not approved and why it was needed, "
                              "or propose another way that needs no approval."],
        "decided_by": who,
        "decided_at": when,
        "outcome": row.state,
    }, ensure_ascii=False), is_error=True)


def render_arguments(arguments: Mapping[str, object] | str) -> str:
    """The arguments as the prompt shows them: ``command`` verbatim, others as JSON."""
    if isinstance(arguments, str):
        return arguments
    if set(arguments) == {"command"} and isinstance(arguments["command"], str):
        return arguments["command"]
    return json.dumps(dict(arguments), ensure_ascii=False, indent=2, default=str)


FENCE = "```"


def attached(text: str) -> bool:
    """Whether arguments go in full in an attached file: too long for the prompt's text,
    or holding a code fence (the model's text must not end the block it is shown in
    and pass for the prompt's own words)."""
    return len(text) > LONG_ARGUMENTS or FENCE in text


def shown(text: str) -> str:
    """The arguments as the prompt's text shows them: in a code block (never read as
    formatting), cut only where the full text is attached, and saying so."""
    if FENCE in text:
        return "[The arguments hold a code fence: they are shown in full in the attached file.]"
    if len(text) <= LONG_ARGUMENTS:
        return f"{FENCE}\n{text}\n{FENCE}"
    return (f"{FENCE}\n{text[:LONG_ARGUMENTS]}\n{FENCE}\n[... {len(text) - LONG_ARGUMENTS} more "
            "characters: in full in the attached file]")


class Approvals:
    """Asks, waits for and records approvals; one per app.

    ``channels`` is the app's live mapping of running channels; ``files_dir`` where
    the full arguments too long for a prompt's text are written to attach them.
    """

    def __init__(self, settings: Settings, store: ApprovalStore,
                 channels: Mapping[str, Channel], files_dir: Path, *,
                 clock: Callable[[], float] = time.time, poll: float = POLL_SECONDS) -> None:
        self.settings = settings
        self.store = store
        self.channels = channels
        self.files_dir = files_dir
        self.clock = clock
        self.poll = poll
        self._wake: dict[str, asyncio.Event] = {}
        self._waits = asyncio.Condition()

    async def until_waiting(self, count: int = 1) -> None:
        """Return once runs of this process wait on at least ``count`` approvals."""
        async with self._waits:
            await self._waits.wait_for(lambda: len(self._wake) >= count)

    def gate(self, message: InboundMessage, *, settings: Settings, needed: frozenset[str],
             session_key: str, session_id: int, run_id: str, inbox_id: int | None,
             can_ask: bool,
             preapproved: frozenset[str], on_wait: Callable[[float], None]) -> RunGate:
        """A run's gate: ``needed`` the tools needing approval, ``can_ask`` whether a
        person is there to ask (else only ``preapproved`` tools run); ``on_wait(s)`` is
        told how long the run waited (its time limit is extended by that much)."""
        return RunGate(self, message, settings, needed, session_key, session_id, run_id,
                       inbox_id, can_ask, preapproved, on_wait)

    # -- presses ----------------------------------------------------------------

    async def press(self, press: ButtonPress) -> bool:
        """Act on ``press`` if it is an approval button; ``False`` if it is not one.

        Whoever may not decide is told so and nothing changes; a second press is
        answered with the decision already taken.
        """
        parts = press.data.split(":")
        if len(parts) != 3 or f"{parts[0]}:" != DATA_PREFIX or parts[2] not in CHOICES:
            return False
        channel = self.channels.get(press.channel)
        row = await self.store.get(parts[1])
        if row is None or row.channel != press.channel or row.chat_id != press.chat_id:
            await self._answer(channel, press, "This approval request is unknown here.")
            return True
        if not self.may_decide(row, press.channel, press.user_id):
            await self._answer(channel, press, "Not yours to approve.", alert=True)
            return True
        acted, note = await self._decide(row, CHOICES[parts[2]], press.user_name or press.user_id,
                                         f"{press.channel}:{press.user_id}")
        await self._answer(channel, press, note)
        if acted:
            await self._decided(row.id, press.message_id)
        return True

    async def answer_text(self, message: InboundMessage) -> bool:
        """Act on ``message`` if it answers a prompt in text ("approve ID", "deny ID",
        "approve ID session") on a channel without buttons; ``False`` otherwise (it is
        an ordinary message, as is one naming no approval of a chat asking nothing). The
        rules are a press's; the answer is a notice."""
        channel = self.channels.get(message.channel)
        match = TEXT_ANSWER.fullmatch(message.text)
        if channel is None or channel.capabilities.buttons or match is None:
            return False
        state: ApprovalState = "denied" if match["verb"].lower() == "deny" else (
            "session" if match["session"] else "approved")
        rows = await self.store.by_code(message.channel, message.chat_id,
                                        match["code"].lower())
        if not rows and not await self.store.asking(message.channel, message.chat_id):
            return False  # no question here: words for the model ("approve c0ffee")
        if len(rows) != 1:
            note = ("This approval request is unknown here." if not rows else
                    "More than one approval request starts so: give more of its id.")
        elif not self.may_decide(rows[0], message.channel, message.sender_id):
            note = "Not yours to approve."
        else:
            acted, note = await self._decide(rows[0], state,
                                             message.sender_name or message.sender_id,
                                             f"{message.channel}:{message.sender_id}")
            if acted:
                await self._decided(rows[0].id, told=True)
        try:
            await channel.send(OutboundMessage.reply_to_message(message, note, "notice"))
        except Exception:
            log.warning("answering an approval in text on %s failed", message.channel,
                        exc_info=True)
        return True

    async def decide_as(self, ident: str, state: ApprovalState, name: str) -> tuple[bool, str]:
        """Decide ``ident`` on the Control UI as its user ``name`` (whom the UI allowed):
        ``(True, note)`` if this decided it, ``(False, note)`` if it was decided already
        (nothing changes) or is unknown."""
        row = await self.store.get(ident)
        if row is None:
            return False, "This approval request is unknown."
        acted, note = await self._decide(row, state, UI_DECIDER.format(name=name),
                                         f"ui:{name}")
        if acted:
            await self._decided(row.id)
        return acted, note

    async def _decide(self, row: Approval, state: ApprovalState, who: str,
                      by: str) -> tuple[bool, str]:
        """Take the decision if ``row`` is still pending and in time: whether this
        decided it, and what the decider is told (a decision taken already is final; an
        answer after ``expires_at``, say after a long downtime, finds it timed out)."""
        if row.state == "pending" and self.clock() >= row.expires_at:
            if await self.store.decide(row.id, "timeout", "nobody"):
                await self._decided(row.id)
            row = await self.store.get(row.id) or row
        if row.state != "pending" or not await self.store.decide(row.id, state, who):
            current = await self.store.get(row.id) or row
            return False, (f"Already decided: {OUTCOMES.get(current.state, current.state)}"
                           f" by {current.decided_by}.")
        log.info("approval %s of %s in %s: %s by %s", row.id, row.tool, row.session_key,
                 state, by)
        return True, OUTCOMES[state] + "."

    async def _decided(self, ident: str, message_id: str | None = None, *,
                       told: bool = False) -> None:
        """After a decision: the run waiting here goes on, the prompt shows the outcome."""
        wake = self._wake.get(ident)
        if wake is not None:
            wake.set()
        decided = await self.store.get(ident)
        if decided is not None:
            await self.show_outcome(decided, message_id, told=told)

    def may_decide(self, row: Approval, channel: str, user_id: str) -> bool:
        """In a DM the person who asked; in a group per ``approvers`` (admins always,
        unless ``anyone`` may)."""
        if row.chat_type == "direct":
            return user_id == row.requester
        approvers = self.settings.approvers
        if approvers == "anyone" or self.settings.is_admin(channel, user_id):
            return True
        return approvers == "requester" and user_id == row.requester

    async def _answer(self, channel: Channel | None, press: ButtonPress, note: str, *,
                      alert: bool = False) -> None:
        if channel is None:
            return
        try:
            await channel.answer_press(press, note, alert=alert)
        except Exception:
            log.warning("answering a press on %s failed", press.channel, exc_info=True)

    async def show_outcome(self, row: Approval, message_id: str | None = None, *,
                           told: bool = False) -> None:
        """Edit the prompt to show the decision and who took it (buttons removed); where
        the prompt cannot be edited (or is gone), say it in a new notice unless the chat
        was ``told`` already (a text answer's reply)."""
        channel = self.channels.get(row.channel)
        if channel is None:
            return
        target = message_id or row.prompt_id
        when = datetime.fromtimestamp(row.decided_at or self.clock(), UTC).strftime(
            "%H:%M UTC")
        text = (f"{OUTCOMES.get(row.state, row.state)} by {row.decided_by} at {when}: "
                f"{row.tool}\n\n{shown(render_arguments(json.loads(row.arguments)))}")
        try:
            if target and await channel.edit(row.chat_id, target, text, (),
                                             thread_id=row.thread_id):
                return
            if not told:
                await channel.send(OutboundMessage(
                    channel=row.channel, chat_id=row.chat_id, text=text,
                    chat_type=cast(ChatType, row.chat_type),
                    thread_id=row.thread_id, kind="notice"))
        except Exception:
            log.warning("showing the outcome of approval %s failed", row.id, exc_info=True)

    # -- asking -----------------------------------------------------------------

    async def ask(self, row: Approval, message: InboundMessage, call: ToolCall,
                  limit: float) -> None:
        """Show the prompt for ``row`` (the call's full arguments, three buttons)."""
        arguments = render_arguments(call.arguments)
        channel = self.channels.get(message.channel)
        if channel is None or channel.capabilities.buttons:
            how = "Approve, Deny, or Approve for this session?"
            buttons: ButtonRows = (
                (Button("Approve", f"{DATA_PREFIX}{row.id}:a", "success"),
                 Button("Deny", f"{DATA_PREFIX}{row.id}:d", "danger"),
                 Button("Approve for this session", f"{DATA_PREFIX}{row.id}:s")),)
        else:
            code = await self._code(row)
            how = (f'Reply "approve {code}", "deny {code}" or "approve {code} session" '
                   "(approve it for the rest of this session).")
            buttons = ()
        text = (f"Approval needed: {call.name}\n\n{shown(arguments)}\n\n"
                f"{how} (Denied if nobody answers within {limit:g} s.)")
        files: tuple[OutboundFile, ...] = ()
        if attached(arguments):
            files = (await asyncio.to_thread(self._arguments_file, row.id, arguments),)
        out = dataclasses.replace(OutboundMessage.reply_to_message(message, text, "notice"),
                                  buttons=buttons, files=files)
        prompt_id = None
        try:
            if channel is None:
                raise LookupError(f"no channel {message.channel!r}")
            prompt_id = await channel.send(out)
        except Exception:
            # Nobody can answer a question never shown: denied now, not after the wait.
            log.exception("showing the approval prompt %s failed; the call is denied", row.id)
            await self.store.prompted(row.id, None)
            await self.store.decide(row.id, "denied", UNSHOWN)
            return
        await self.store.prompted(row.id, prompt_id)

    async def _code(self, row: Approval) -> str:
        """The shortest prefix of ``row``'s id, from :data:`CODE_LENGTH` characters on,
        that names no other approval of its chat."""
        for length in range(CODE_LENGTH, len(row.id), 2):
            named = await self.store.by_code(row.channel, row.chat_id, row.id[:length])
            if [r.id for r in named] == [row.id]:
                return row.id[:length]
        return row.id

    def _arguments_file(self, ident: str, text: str) -> OutboundFile:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        path = self.files_dir / f"approval-{ident}.txt"
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return OutboundFile(str(path), "arguments.txt", "text/plain", len(data),
                            caption="The full arguments of the call awaiting approval.")

    async def wait(self, row: Approval) -> Approval:
        """The row once decided; an unanswered one is denied at its ``expires_at``."""
        wake = self._wake.setdefault(row.id, asyncio.Event())
        async with self._waits:
            self._waits.notify_all()
        try:
            while True:
                wake.clear()
                try:
                    current = await self.store.get(row.id)
                    if current is None:
                        raise RuntimeError(f"approval {row.id} vanished")
                    if current.state != "pending":
                        return current
                    left = current.expires_at - self.clock()
                    if left <= 0:
                        if await self.store.decide(row.id, "timeout", "nobody"):
                            timed_out = await self.store.get(row.id)
                            if timed_out is not None:
                                await self.show_outcome(timed_out)
                        continue
                except _database_errors() as exc:
                    # The database is away for a moment: the question stays open.
                    log.warning("reading approval %s failed (%s); trying again", row.id, exc)
                    left = self.poll
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, self.poll)):
                        await wake.wait()
        finally:
            self._wake.pop(row.id, None)

    async def cancel(self, row: Approval, by: str) -> None:
        """``/stop``: the pending ``row`` is decided as cancelled and its prompt says so."""
        if await self.store.decide(row.id, "cancelled", by):
            cancelled = await self.store.get(row.id)
            if cancelled is not None:
                await self.show_outcome(cancelled)


@dataclass(slots=True)
class RunGate:
    """One run's approvals (see :meth:`Approvals.gate`)."""

    approvals: Approvals
    message: InboundMessage
    settings: Settings
    needed: frozenset[str]
    session_key: str
    session_id: int
    run_id: str
    inbox_id: int | None
    can_ask: bool
    preapproved: frozenset[str]
    on_wait: Callable[[float], None]

    def needs(self, tool: str) -> bool:
        """Whether a call of ``tool`` waits for a decision."""
        return tool in self.needed

    async def screen(self, calls: Sequence[ToolCall]) -> tuple[dict[str, ToolResult],
                                                                 list[str]]:
        """Decide the calls that need approval, concurrently.

        Returns the results of the calls that must not run (denied, or approved
        and already started by an earlier life of the run: interrupted), and the
        approval ids of those that may run (for :meth:`started`).
        """
        asking = [c for c in calls if self.needs(c.name)]
        decided = await asyncio.gather(*(self._one(c) for c in asking))
        blocked = {c.id: r for c, (r, _) in zip(asking, decided, strict=True) if r is not None}
        go = [ident for r, ident in decided if r is None and ident]
        return blocked, go

    async def started(self, idents: Sequence[str]) -> None:
        """The approved calls are about to run (committed before they do)."""
        for ident in idents:
            await self.approvals.store.start(ident)

    async def _one(self, call: ToolCall) -> tuple[ToolResult | None, str]:
        store = self.approvals.store
        msg = self.message
        asked = Asked(self.inbox_id, call.id, self.run_id, self.session_key, self.session_id,
                      msg.channel, msg.chat_id, msg.chat_type, msg.thread_id, msg.sender_id,
                      call.name, call.arguments)
        # An earlier life of the run may have decided (or started) this very call.
        row = await store.find(self.inbox_id, call.id) if self.inbox_id is not None else None
        if row is None:
            row = await self._without_asking(asked)
        if row is None:
            limit = self.settings.approval_timeout
            row = await store.open(asked, limit)
            if row.state == "pending" and row.prompt_id is None:
                await self.approvals.ask(row, msg, call, limit)
        if row.state == "pending":
            row = await self._wait(row)
        if not row.approved:
            return denied_result(row), ""
        if row.started:
            return ToolResult(INTERRUPTED, is_error=True), ""
        return None, row.id

    async def _without_asking(self, asked: Asked) -> Approval | None:
        """The decision taken without asking anyone (each recorded, so a resumed run
        knows whether the call started), or ``None``: a person is to be asked."""
        store = self.approvals.store
        if await store.session_approved(self.session_id, asked.tool):
            return await store.record(asked, "approved", "approved for this session")
        if self.can_ask:
            return None
        if asked.tool in self.preapproved:
            return await store.record(asked, "approved", "pre-approved for the job")
        return await store.record(asked, "denied", NOBODY)

    async def _wait(self, row: Approval) -> Approval:
        began = time.monotonic()
        try:
            return await self.approvals.wait(row)
        except asyncio.CancelledError as exc:
            reason = str(exc.args[0]) if exc.args and exc.args[0] else ""
            if reason not in ("", "shutdown"):
                # /stop (or a merge): the question is withdrawn, not left to time out.
                await asyncio.shield(self.approvals.cancel(row, CANCELLERS.get(reason, reason)))
            raise
        finally:
            self.on_wait(time.monotonic() - began)


@functools.cache
def _database_errors() -> tuple[type[BaseException], ...]:
    """What reading the store raises while the database is away for a moment; asyncpg's
    errors only where the postgres extra is installed (a SQLite install has no asyncpg)."""
    try:
        import asyncpg  # type: ignore[import-untyped]

        from bot.storage.postgres import CONNECTION_LOST
    except ImportError:
        return (OSError, sqlite3.Error)
    return (*CONNECTION_LOST, sqlite3.Error, asyncpg.PostgresError)
