"""The channel contract: what an adapter implements and how the core calls it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from bot.contracts.media import MediaError
from bot.contracts.messages import (
    Attachment,
    ButtonPress,
    ButtonRows,
    InboundEvent,
    InboundMessage,
    OutboundMessage,
)
from bot.contracts.settings import SettingsModel

if TYPE_CHECKING:
    from bot.contracts.commands import Command

T = TypeVar("T")

InboundHandler = Callable[[InboundEvent], Awaitable[None]]
"""The core's entry point: adapters await it for every normalized message, and for
every press, edit, deletion and reaction (:data:`~bot.contracts.messages.InboundEvent`).

When it returns, the message is durably recorded in the inbox (or was
deliberately dropped: a policy refused it, it was a redelivery). Only then may
the adapter acknowledge the delivery to its platform (the next ``getUpdates``
offset, a webhook's 2xx, a Socket Mode ack). If it raises, nothing was
recorded: the adapter must not acknowledge, so the platform delivers again.
"""


class ReplyStream(Protocol):
    """A reply being streamed into one platform message.

    ``message_id`` is the platform id of the draft once one is shown (the core
    journals it, so a draft left by a crash is replaced rather than frozen).
    """

    message_id: str | None

    async def push(self, text_so_far: str) -> None:
        """Show the reply text produced so far (adapters throttle as needed)."""

    async def finish(self, final_text: str | None) -> None:
        """Replace the streamed text with the final, sanitized reply.

        ``None`` means nothing is to be shown (a silent reply or a cancelled
        run): the adapter removes whatever it showed. Raises if the reply could
        not be delivered (the core then keeps it in the outbox and retries).
        """


class SendingMark(Protocol):
    """The core's record that a reply may have reached its platform (see :func:`sending_mark`)."""

    def record(self, on: bool, note: str | None = None) -> Awaitable[None]:
        """``on``: the reply may be shown from now on (``False``: it certainly is not).
        ``note``: what the adapter needs to find out later whether it was (kept with the
        reply, given back on its redelivery as ``OutboundMessage.attempt_note``)."""
        ...


@dataclass(slots=True)
class _SendingMark:
    mark: SendingMark
    on: bool = False
    shown: bool = False


_SENDING: contextvars.ContextVar[_SendingMark | None] = contextvars.ContextVar(
    "roost_sending_mark", default=None)


@contextlib.contextmanager
def sending_mark(mark: SendingMark) -> Iterator[None]:
    """Within the block, :func:`marked_send` records ``mark.record(True, note)`` before the
    first platform call that may show the reply, and ``mark.record(False)`` if that call
    was refused.

    The core wraps :meth:`Channel.send` in it for adapters that set
    :attr:`Channel.marks_sending`; with replicas, ``mark`` records in the outbox that
    the reply may have reached the platform, so a replica taking over a dead one's
    replies does not send it again (at most once). The note is kept in every case.
    """
    token = _SENDING.set(_SendingMark(mark))
    try:
        yield
    finally:
        _SENDING.reset(token)


async def marked_send(call: Callable[[], Awaitable[T]], *,
                      refused: Callable[[BaseException], bool],
                      note: Callable[[], str | None] | None = None) -> T:
    """Make one platform call of a reply being sent (``await call()``), marking the reply first.

    An adapter makes each such call through this *after* its own waits (rate-limit
    pacing, a 429 window), so a replica that dies while a reply waits there leaves
    it unmarked and another replica sends it. ``refused(error)`` says the failed
    call certainly showed nothing (a 429, a 400): if no earlier call of the same
    reply succeeded, the mark is taken back. ``note()``, read right before the
    reply's first call, is what the adapter will need on a redelivery to find out
    whether this attempt reached the platform; it is committed before the call.
    Outside :func:`sending_mark` (no replicas, not a reply) it is just ``await call()``.
    """
    state = _SENDING.get()
    if state is None:
        return await call()
    if not state.on:
        await state.mark.record(True, None if note is None else note())
        state.on = True
    try:
        result = await call()
    except BaseException as exc:
        if state.on and not state.shown and refused(exc):
            state.on = False
            await state.mark.record(False)
        raise
    state.shown = True
    return result


def found_shown() -> None:
    """Within :func:`sending_mark`: a call of this reply whose outcome was unknown was found
    to have been shown after all (a later refused call then does not take the mark back)."""
    state = _SENDING.get()
    if state is not None:
        state.shown = True


async def found_nothing_shown() -> None:
    """Within :func:`sending_mark`: the adapter found out that no call of this reply was
    shown (each was refused, or found not to have arrived): the mark and the note are
    taken back, so nothing later is looked for on the strength of a stale note."""
    state = _SENDING.get()
    if state is not None and state.on and not state.shown:
        state.on = False
        await state.mark.record(False)


class Undeliverable(Exception):
    """Raised by :meth:`Channel.send` for a reply the platform will not take now or later
    (WhatsApp outside its 24-hour window with no template to send instead).

    The core gives the reply up at once: it stays in the outbox as failed, with this
    exception's one-line message as the reason, and is not sent again.
    """


@dataclass(frozen=True, slots=True)
class ChannelHealth:
    """Whether a channel is connected and receiving, for ``/readyz``.

    ``detail`` says what is wrong when not ``ready``, in a few words after the
    channel's name (``getUpdates failing (502)``); it reaches the readiness
    answer as is, so it must never hold a credential.
    """

    ready: bool
    detail: str = ""


READY = ChannelHealth(True)
"""The health of a channel that has nothing to report."""

WebHandler = Callable[[Any], Awaitable[Any]]
"""An aiohttp request handler: ``async def handle(request: web.Request) -> web.Response``."""


class WebRoutes(Protocol):
    """Roost's own HTTP server, which a channel's webhook may share (same port).

    ``port`` is the port it listens on; a channel whose own listener is set to
    that port mounts its endpoint here instead of binding a second server.
    """

    port: int

    def add_post(self, path: str, handler: WebHandler) -> None:
        """Answer ``POST path`` with ``handler`` from now on."""

    def remove_post(self, path: str) -> None:
        """Stop answering ``POST path`` (404 from then on)."""

    def add_get(self, path: str, handler: WebHandler) -> None:
        """Answer ``GET path`` with ``handler`` from now on (a webhook's verification)."""

    def remove_get(self, path: str) -> None:
        """Stop answering ``GET path`` (404 from then on)."""


class Leadership(Protocol):
    """Whether this process leads the deployment (PostgreSQL replicas elect one leader).

    A receiver that must be the only one of its kind (Telegram long polling, Slack
    Socket Mode) receives only while :attr:`is_leader`; webhooks receive everywhere.
    """

    @property
    def is_leader(self) -> bool:
        """Whether this process leads now."""

    async def wait_leading(self) -> None:
        """Return once this process leads."""

    async def wait_lost(self) -> None:
        """Return once this process no longer leads."""


class LiveReplicas(Protocol):
    """How many replicas of the deployment are alive (PostgreSQL replicas share one bot).

    Platform-wide budgets (Telegram's ~30 messages/s per bot) are the bot's, not a
    process's: an adapter paces at its share of them.
    """

    @property
    def live(self) -> int:
        """Replicas whose heartbeat had not expired at this one's last renewal, itself
        included (at least 1); read again every ``lease_seconds / 3``."""


class ChannelState(Protocol):
    """A channel's durable notes (a sync token, the last mail UID), kept in Roost's
    database under the channel's name and shared by the replicas.

    Put a position only after the events it covers were handed to the handler and
    it returned (they are stored then), so a restart neither loses nor repeats one.
    """

    async def get(self, key: str) -> str | None:
        """The value last put under ``key``, or ``None``."""

    async def put(self, key: str, value: str) -> None:
        """Record ``value`` under ``key``; returns once it is durable."""


class MemoryState:
    """A :class:`ChannelState` kept in memory: for a channel started on its own."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def get(self, key: str) -> str | None:
        """The value last put under ``key``, or ``None``."""
        return self.values.get(key)

    async def put(self, key: str, value: str) -> None:
        """Record ``value`` under ``key`` (until the process ends)."""
        self.values[key] = value


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a channel can do beyond sending text, so the core asks only what is possible."""

    buttons: bool = False
    """Sends :attr:`OutboundMessage.buttons` natively and hands presses in."""
    edit: bool = False
    """:meth:`Channel.edit` changes a message the bot sent."""
    react: bool = False
    """:meth:`Channel.react` puts the bot's reaction on a message."""
    reaction_emoji: frozenset[str] | None = None
    """The only emoji :meth:`Channel.react` accepts (Telegram's fixed list); ``None``: any."""
    edits_in: bool = False
    """Hands people's edits in as :class:`~bot.contracts.messages.MessageEdit`."""
    deletions_in: bool = False
    """Hands deletions in as :class:`~bot.contracts.messages.MessageDeletion`."""
    reactions_in: bool = False
    """Hands people's reactions in as :class:`~bot.contracts.messages.ReactionEvent`."""


@dataclass(frozen=True, slots=True)
class ChannelContext:
    """What the running service shares with a channel it starts (:meth:`Channel.begin`).

    ``http_routes``: Roost's HTTP server when one runs; a webhook whose port setting
    names its port is mounted there rather than on a server of its own.
    ``leadership``: set when several replicas share the database; long polling and
    Socket Mode receive only while it leads (``None``: always).
    ``replicas``: set when several replicas share the database; bot-wide send limits
    are divided among the live ones (``None``: this process alone).
    ``state``: the channel's durable notes in Roost's database (``None``: keep them in
    memory, see :class:`MemoryState`).
    """

    http_routes: WebRoutes | None = None
    leadership: Leadership | None = None
    replicas: LiveReplicas | None = None
    state: ChannelState | None = None


ALONE = ChannelContext()
"""The context of a channel started on its own: no shared server, no replicas."""


class Channel:
    """Base for channel adapters. Adapters only translate; they hold no logic.

    ``start`` connects and returns once the adapter is receiving; inbound
    messages go to the handler given to it. ``send`` delivers one reply.
    """

    name: str = ""
    context: ChannelContext = ALONE
    """What the service shares with this channel (given to :meth:`begin`)."""
    marks_sending: ClassVar[bool] = False
    """``True`` when :meth:`send` awaits its platform calls through :func:`marked_send`;
    otherwise the core marks a reply as under way just before calling :meth:`send`."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    """What the channel can do besides sending (none by default)."""

    @property
    def http_routes(self) -> WebRoutes | None:
        """The shared HTTP server of :attr:`context`, if any."""
        return self.context.http_routes

    @property
    def leadership(self) -> Leadership | None:
        """The replicas' leadership of :attr:`context`, if any."""
        return self.context.leadership

    @property
    def replicas(self) -> LiveReplicas | None:
        """The live replicas of :attr:`context`, if any."""
        return self.context.replicas

    async def begin(self, handler: InboundHandler, context: ChannelContext = ALONE) -> None:
        """Keep ``context`` as :attr:`context`, then :meth:`start`: how the service starts
        a channel, so an adapter reads what is shared with it from within ``start``.
        Without a database behind it, :attr:`state` is kept in memory."""
        self.context = context if context.state is not None \
            else replace(context, state=MemoryState())
        await self.start(handler)

    @property
    def state(self) -> ChannelState:
        """The channel's durable notes (:attr:`ChannelContext.state`); set by :meth:`begin`."""
        if self.context.state is None:
            raise RuntimeError(f"{self.name}: state is there once begin() has run")
        return self.context.state

    async def start(self, handler: InboundHandler) -> None:
        """Connect to the platform and begin delivering inbound messages."""
        raise NotImplementedError

    async def stop_intake(self) -> None:
        """Stop receiving (shutdown begins); sending keeps working until :meth:`stop`.

        Runs in flight may still deliver during the shutdown grace period.
        Anything that arrives meanwhile must not be acknowledged (the handler
        raises then anyway), so the platform delivers it again after the restart.
        """

    async def stop(self) -> None:
        """Disconnect; pending sends finish first."""

    def health(self) -> ChannelHealth:
        """Whether the channel is connected and receiving now (``/readyz`` asks).

        Adapters report not ready until connected, and from the first failed
        poll or dropped connection until the next success. The default is ready.
        """
        return READY

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; returns the platform id of its last message, if known.

        Transient platform errors are retried inside; an exception means the
        reply was not delivered. ``message.replace`` names a draft to replace.
        ``message.files`` are uploaded; one over the platform's limit raises
        :class:`bot.contracts.media.MediaTooLarge`.
        """
        raise NotImplementedError

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of an inbound ``attachment``, fetched through the platform's API.

        Reads at most ``limit`` bytes (never buffers more than ``limit + 1``): a
        larger file raises :class:`bot.contracts.media.MediaTooLarge`; any other
        failure raises :class:`bot.contracts.media.MediaError` with a one-line reason.
        """
        raise MediaError("this channel cannot download files")

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete a message the bot sent (a draft left over from a crashed run)."""

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """Answer ``press`` (stop the client's spinner), showing ``note`` to the presser
        alone if given (``alert``: as a dialog where the platform has one).

        Telegram: ``answerCallbackQuery``; Discord: an ephemeral follow-up; Slack: an
        ephemeral message through ``response_url``. A press too old to answer is
        logged, not raised. The default does nothing.
        """

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """Replace the text (and buttons; none: removed) of a message the bot sent
        (``thread_id``: the thread it is in, which Discord needs).

        Returns ``False`` if the message is gone or the channel cannot edit
        (:attr:`Capabilities.edit`); an identical edit counts as done. Raises when the
        platform failed for good.
        """
        return False

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """Set the bot's own reaction on a message to ``emoji``, replacing the one it set
        before (``None``: remove it); ``thread_id`` as for :meth:`edit`. ``replacing`` is
        the reaction the core believes the bot set there, for an adapter that does not
        remember it (another replica set it, or this process restarted since).

        Reactions never delay a reply: they are paced at the lowest priority and
        dropped when the chat is rate limited. Returns whether the reaction was
        set; ``False`` also for an emoji the platform refuses, a message that is
        gone, or a channel without reactions. Never raises for those.
        """
        return False

    async def catch_up(self, cursors: Mapping[str, str]) -> None:
        """Deliver messages missed while Roost was down, for platforms that cannot redeliver.

        ``cursors`` maps each recently active chat id to the platform id of the
        last message recorded from it; the adapter reads each chat's history
        after that id (bounded) and passes every message to the handler, which
        drops the ones already recorded. Telegram and Slack redeliver by
        themselves and ignore this.
        """

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Tell the platform which slash commands exist (menus, autocompletion)."""

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A stream for the reply to ``message``, or ``None`` to send it whole."""
        return None

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Show a typing indicator in ``message``'s chat while the block runs."""
        yield


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """A channel a plugin offers.

    ``configured(settings)`` says whether its credentials are set (``roost run``
    starts only those); ``create(settings)`` builds the adapter and is the only
    place the platform SDK may be imported, so unconfigured SDKs cost nothing.
    """

    name: str
    configured: Callable[[SettingsModel], bool]
    create: Callable[[SettingsModel], Channel]
