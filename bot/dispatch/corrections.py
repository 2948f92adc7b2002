"""People's edits and deletions of messages Roost received, applied to their runs.

An edit (or a deletion) of a message recorded in the inbox is recorded as an entry
of its own pointing at it (:meth:`bot.storage.inbox.Inbox.add` with ``change``):
unique on the platform's delivery id (a redelivered edit is dropped), durable (one
not yet applied is applied after a restart) and applied by whoever runs the
session, in order after the message (on PostgreSQL the replica holding the
session's lease, wherever the edit arrived). Applying it, by where the message is:

* **queued** (its run not started): the queued text is replaced, in the inbox
  row too; a deletion, or an edit in a group that no longer addresses the bot
  (mention removed), withdraws it;
* **in a run** that called no tool with side effects (:attr:`Tool.read_only`
  tools only) and is not being committed: the run is cancelled (its draft
  withdrawn) and started again on the new text; what it journaled is forgotten;
* **in a run** that called a tool with side effects, or **answered**: under
  ``edit_policy = "correct"`` the edit becomes a follow-up message, shown to the
  model as a correction of the earlier message and run after the run in flight;
  under ``"ignore"`` nothing happens. A deletion or a mention removed changes
  nothing then.

An edit or a deletion that arrives before the message it changes (platforms deliver
them on separate paths; discord.py handles each event in a task of its own) is kept
in memory for :data:`EARLY_SECONDS` and applied when the message is recorded
(:meth:`Corrections.arrived`); one whose message never comes is then forgotten.

The history keeps only what the model saw: a replaced text never reaches a later
request (the cancelled run committed nothing); a corrected message stays as it
was answered, followed by the correction. Edits of messages Roost has no record
of (sent before it joined, group chatter it was not addressed in, commands) are
ignored, as is an edit that makes a message a command.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage, MessageDeletion, MessageEdit, parse_command
from bot.dispatch.intake import ChatPolicy
from bot.dispatch.lanes import Lane, Lanes, Moves, Pending, Running, join_messages
from bot.storage.inbox import Inbox, InboxEntry
from bot.storage.sessions import agent_of

log = logging.getLogger("roost.dispatch.corrections")

OLD_TEXT_CHARS = 2_000
"""Characters of the earlier text a correction quotes."""
EARLY_SECONDS = 60.0
"""How long an edit or a deletion of a message not recorded (yet) waits for it."""
EARLY_MAX = 256
"""Such edits and deletions kept at most (the oldest is forgotten first)."""

Early = MessageEdit | MessageDeletion

Move = Callable[[Lane, Moves], None]
"""Starts the runs a lane change asks for (the dispatcher's)."""
Hand = Callable[[InboxEntry], Awaitable[None]]
"""Hands a recorded change to whoever runs its session (replicas); ``None``: apply here."""


def correction_text(old: str, new: str) -> str:
    """The follow-up turn the model reads for an edit of a message it already answered."""
    quoted = old if len(old) <= OLD_TEXT_CHARS else old[:OLD_TEXT_CHARS] + " [...]"
    return ("[Correction: I edited my earlier message, which you already answered. "
            f"It said:]\n{quoted}\n[It now says:]\n{new}")


class Corrections:
    """Records edits and deletions (:meth:`take`) and applies them (:meth:`apply`)."""

    def __init__(self, settings: Settings, inbox: Inbox, lanes: Lanes, policy: ChatPolicy,
                 *, move: Move, hand: Hand | None = None) -> None:
        """``move`` starts the runs a lane change asks for; ``hand`` (replicas) gives a
        recorded change to the session's holder instead of applying it here."""
        self.settings = settings
        self.inbox = inbox
        self.lanes = lanes
        self.policy = policy
        self.move = move
        self.hand = hand
        self.clock = time.monotonic
        self.early: OrderedDict[tuple[str, str, str], tuple[float, Early]] = OrderedDict()
        """Edits and deletions of messages not recorded yet, by (channel, chat, message id)."""

    # -- intake ----------------------------------------------------------------------

    async def take(self, event: MessageEdit | MessageDeletion) -> None:
        """Record an edit or a deletion of recorded messages; returns once it is durable
        (then applied here, or by the session's holder)."""
        changes: list[tuple[str, InboundMessage | None]]
        if isinstance(event, MessageEdit):
            changes = [(event.message.message_id, event.message)]
            chat_id, deletion_id = event.message.chat_id, ""
        else:
            changes = [(mid, None) for mid in event.message_ids]
            chat_id, deletion_id = event.chat_id, event.event_id
        channel = event.channel
        for message_id, edited in changes:
            original = await self.inbox.original(channel, chat_id, message_id)
            what = "an edit" if edited is not None else "a deletion"
            if original is None:
                log.info("%s: %s of message %s, which is not recorded (yet); kept in case "
                         "it arrives", channel, what, message_id)
                self._keep((channel, chat_id, message_id), event if isinstance(
                    event, MessageEdit) else dataclasses.replace(event, message_ids=(message_id,)))
                continue
            if original.kind != "message":
                log.info("%s: %s of command %s ignored", channel, what, message_id)
                continue
            if edited is not None and edited.sender_id != original.message.sender_id:
                log.warning("%s: an edit of message %s by someone else than its sender; "
                            "ignored", channel, message_id)
                continue
            if edited is not None and parse_command(edited.text) is not None:
                log.info("%s: message %s was edited into a command; the edit is ignored",
                         channel, message_id)
                continue
            recorded = await self.inbox.add(
                edited if edited is not None else _deletion(original.message, deletion_id),
                original.session_key, change="edit" if edited is not None else "delete",
                edit_of=original.id)
            if recorded is None:
                log.info("%s delivered %s of message %s again; it was recorded before",
                         channel, what, message_id)
            elif self.hand is not None:
                await self.hand(recorded)
            else:
                await self.apply(recorded)

    async def arrived(self, message: InboundMessage) -> None:
        """``message`` was recorded: apply an edit or a deletion of it that came first."""
        if not self.early:
            return
        kept = self.early.pop((message.channel, message.chat_id, message.message_id), None)
        if kept is not None and self.clock() - kept[0] <= EARLY_SECONDS:
            await self.take(kept[1])

    def _keep(self, key: tuple[str, str, str], event: Early) -> None:
        self.early[key] = (self.clock(), event)
        self.early.move_to_end(key)
        while len(self.early) > EARLY_MAX:
            self.early.popitem(last=False)

    # -- applying ----------------------------------------------------------------------

    async def apply(self, change: InboxEntry) -> None:
        """Apply recorded change ``change`` to the message it changes (see the module
        docstring); it is closed, or becomes a correction to run. One that fails (the
        database, say) stays recorded and is applied again after the next start."""
        try:
            await self._apply(change)
        except Exception:
            log.exception("%s: applying the %s of message %s failed; it is tried again "
                          "after a restart", change.message.channel, change.change,
                          change.message.message_id)

    async def _apply(self, change: InboxEntry) -> None:
        original = change.edit_of
        state = None if original is None else await self.inbox.state_of(original)
        if original is None or state is None:
            self.inbox.close((change.id,))
            return
        recorded_state, before = state
        # Decided with no wait from here on: the run cannot move on meanwhile.
        where = self.lanes.find(change.session_key, original)
        if where is not None and isinstance(where[1], Pending) and not _replays(where[1]):
            await self._queued(change, original, before, where[0], where[1])
        elif where is not None and isinstance(where[1], Running) and _restartable(where[1]):
            await self._running(change, original, before, where[0], where[1])
        elif where is None and recorded_state in ("pending", "running"):
            await self._waiting(change, original, before)  # recorded, not taken up here yet
        else:
            await self._answered(change, original, before)

    async def _queued(self, change: InboxEntry, original: int, before: InboundMessage,
                      lane: Lane, pending: Pending) -> None:
        if self._withdraws(change):
            self.lanes.replace_queued(lane, pending, _without(
                pending, original, self.settings.max_message_chars))
            self.inbox.close((original, change.id))
            log.info("%s: queued message %s withdrawn (%s)", change.message.channel,
                     change.message.message_id, _why(change))
            return
        if change.message.text == before.text:
            self.inbox.close((change.id,))  # nothing new (a redelivery, a repeated edit)
            return
        self.lanes.replace_queued(lane, pending, _edited(
            pending, original, change.message, self.settings.max_message_chars))
        await self.inbox.revise(original, _revised(before, change.message), close=(change.id,))

    async def _running(self, change: InboxEntry, original: int, before: InboundMessage,
                       lane: Lane, running: Running) -> None:
        channel, message_id = change.message.channel, change.message.message_id
        if change.change == "delete":
            self.inbox.close((change.id,))  # started: it is answered
            return
        if not self.policy.addresses(change.message):
            self.move(lane, self.lanes.withdraw(lane, running))
            self.inbox.close((*running.pending.entries, change.id))
            log.info("%s: the run for message %s was cancelled: the edit no longer "
                     "addresses the bot", channel, message_id)
            return
        if change.message.text == before.text:
            self.inbox.close((change.id,))
            return
        restarted = _edited(running.pending, original, change.message,
                            self.settings.max_message_chars)
        self.move(lane, self.lanes.restart(lane, running, dataclasses.replace(
            restarted, journal=None, counted=False, fresh=True, stale_draft=None)))
        log.info("%s: message %s was edited while its run had not acted yet: started "
                 "again on the new text", channel, message_id)
        await self.inbox.revise(original, _revised(before, change.message), close=(change.id,))

    async def _waiting(self, change: InboxEntry, original: int,
                       before: InboundMessage) -> None:
        """The message is recorded open but not queued here: its text changes where it
        is recorded, and whoever takes it up runs the new one."""
        if self._withdraws(change):
            self.inbox.close((original, change.id))
            return
        if not await self.inbox.revise(original, _revised(before, change.message),
                                       close=(change.id,), if_open=True):
            await self._answered(change, original, before)  # answered meanwhile

    async def _answered(self, change: InboxEntry, original: int,
                        before: InboundMessage) -> None:
        edited = change.message
        if (change.change == "delete" or edited.text == before.text
                or not self.policy.addresses(edited)):
            self.inbox.close((change.id,))
            return
        if self.edit_policy(change.session_key) == "ignore":
            log.info("%s: message %s was edited after it was acted on; ignored "
                     "(edit_policy = \"ignore\")", edited.channel, edited.message_id)
            await self.inbox.revise(original, _revised(before, edited), close=(change.id,))
            return
        correction = dataclasses.replace(edited, text=correction_text(before.text, edited.text))
        await self.inbox.become(change.id, correction)
        # The message's newest version: the same edit again is nothing new.
        await self.inbox.revise(original, _revised(before, edited))
        lane = self.lanes.lane(change.session_key, correction)
        self.move(lane, self.lanes.behind(lane, Pending(
            correction, time.monotonic(), entries=(change.id,))))
        log.info("%s: message %s was edited after it was acted on: the edit follows as a "
                 "correction", edited.channel, edited.message_id)

    def edit_policy(self, key: str) -> str:
        """Session ``key``'s agent's ``edit_policy`` (else the global one)."""
        config = self.settings.agents.get(agent_of(key))
        if config is not None and config.edit_policy is not None:
            return config.edit_policy
        return self.settings.edit_policy

    def _withdraws(self, change: InboxEntry) -> bool:
        return change.change == "delete" or not self.policy.addresses(change.message)


def _replays(pending: Pending) -> bool:
    """Whether ``pending``'s run replays tool calls an earlier life of it journaled (they
    may have acted)."""
    journal = pending.journal
    return journal is not None and bool(journal.turns or journal.results)


def _restartable(running: Running) -> bool:
    """Whether ``running``'s run may start again: it called no tool with side effects,
    replays none from an earlier life, and is not being committed."""
    return not (running.side_effects or running.answering or _replays(running.pending))


def _why(change: InboxEntry) -> str:
    return "deleted" if change.change == "delete" else "no longer addressed to the bot"


def _deletion(original: InboundMessage, event_id: str) -> InboundMessage:
    """The record of a deletion (delivery ``event_id``) of ``original``."""
    return dataclasses.replace(
        original, text="", attachments=(), raw=None,
        event_id=f"{event_id}:{original.message_id}" if event_id else "")


def _revised(before: InboundMessage, edited: InboundMessage) -> InboundMessage:
    """The recorded message ``before`` as ``edited`` changed it (same delivery)."""
    return dataclasses.replace(before, text=edited.text, attachments=edited.attachments,
                               mentioned=edited.mentioned)


def _texts(pending: Pending) -> list[str]:
    return list(pending.texts or (pending.message.text,))


def _edited(pending: Pending, entry: int, edited: InboundMessage, limit: int) -> Pending:
    """``pending`` with entry ``entry``'s text replaced by ``edited``'s."""
    texts = _texts(pending)
    texts[pending.entries.index(entry)] = edited.text
    if len(texts) == 1:
        return dataclasses.replace(pending, message=_revised(pending.message, edited))
    return dataclasses.replace(pending, texts=tuple(texts), message=dataclasses.replace(
        pending.message, text=join_messages(texts, limit)))


def _without(pending: Pending, entry: int, limit: int) -> Pending | None:
    """``pending`` without entry ``entry`` (``None`` when it was its only one)."""
    if pending.entries == (entry,):
        return None
    index = pending.entries.index(entry)
    texts = _texts(pending)
    del texts[index]
    entries = pending.entries[:index] + pending.entries[index + 1:]
    return dataclasses.replace(pending, entries=entries, texts=tuple(texts),
                               message=dataclasses.replace(
                                   pending.message, text=join_messages(texts, limit)))
