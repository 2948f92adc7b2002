"""Updates in: fetched by long polling, parsed one by one, handed to the core once,
acknowledged only after the core took them.

:class:`TolerantSession` is the aiogram session (a malformed update cannot wedge a
``getUpdates`` batch); :class:`LongPolling` is Roost's own ``getUpdates`` loop, led
by one replica at a time; :class:`Updates` hands each update, translated, to the
core. Either way updates arrive (long polling, or :mod:`.webhook`), an update is
acknowledged (the next ``getUpdates`` offset, a webhook's 200) only once the core's
handler returned for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import traceback
from collections import OrderedDict
from collections.abc import Awaitable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.exceptions import TelegramUnauthorizedError
from aiogram.methods import GetUpdates, TelegramMethod
from aiogram.methods.base import Response, TelegramType
from aiogram.types import InputFile, Update
from aiohttp.payload import BytesPayload
from pydantic import ValidationError

from bot.config.tls import client_tls
from bot.contracts.channel import READY, ChannelHealth, InboundHandler, Leadership
from bot.contracts.messages import InboundEvent
from bot.resilience.retry import RetryPolicy
from channels.delivery import RateLimited, RateLimiter, Transient
from channels.telegram.client import BotApi, Chats, describe_error, translated
from channels.telegram.inbound import Translator, Unhandled
from channels.telegram.interactions import ALLOWED_EVENTS, edit_of, press_of, reactions_of
from channels.telegram.malformed import (
    MAX_UPDATE_ID,
    Reported,
    impossible,
    invalid,
    result_elements,
    undecodable,
)
from channels.telegram.warmup import BUILDING, BUILT

if TYPE_CHECKING:
    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")

SEEN_UPDATES = 4096
"""Recent update ids remembered to drop redeliveries early (the inbox dedupes for real)."""
ALLOWED_UPDATES = ALLOWED_EVENTS
"""The update kinds Roost acts on; Telegram then sends no others."""
CONNECTING = ChannelHealth(False, "connecting")
"""The health of a channel that has not received yet (before ``getMe`` or the first poll)."""
STANDBY = ChannelHealth(True, "standby: another replica long-polls")
"""A follower's health: ready to send; the leader receives."""
GET_UPDATES = "getUpdates"
"""The rate-limit scope of ``getUpdates``: a 429 on it holds polling only."""
STOP_GRACE = 10.0
"""Seconds :meth:`LongPolling.stop` lets an update being handed over finish."""
POLL_BACKOFF_CAP = 30.0
"""The longest pause between failed ``getUpdates`` calls, in seconds."""


def parse_update(raw: Any, bot: Bot, reported: Reported | None = None) -> Update | None:
    """``raw`` as an :class:`Update`; a malformed one is logged and becomes an empty one.

    The empty update keeps its ``update_id``, so polling still confirms it
    (otherwise the server would send it again forever); one without a usable
    id cannot be confirmed and is dropped (see :mod:`.malformed`). With
    ``reported``, an update is warned about only the first time.
    """
    try:
        update = Update.model_validate(raw, context={"bot": bot})
    except (ValidationError, RecursionError) as exc:
        return invalid(raw, exc, reported)
    if not 0 < update.update_id <= MAX_UPDATE_ID:
        impossible(update.update_id, reported)
        return None
    return update


def update_kind(update: Update) -> str:
    """The name of what ``update`` carries (``callback_query``, ``my_chat_member``...)."""
    for name in type(update).model_fields:
        if name != "update_id" and getattr(update, name, None) is not None:
            return name
    extra = update.model_extra
    # A kind newer than this aiogram: the server's field name, kept as an extra.
    return next(iter(extra), "empty update") if extra else "empty update"


class TolerantSession(AiohttpSession):
    """aiogram's session, except that one bad update no longer poisons a getUpdates batch.

    aiogram validates the whole ``getUpdates`` answer at once: a single
    update it cannot parse fails the call, the offset never moves past it,
    and polling retries the same batch forever. Here each update is decoded
    and validated on its own and a malformed one becomes an empty update
    that is confirmed and skipped. An update nested too deeply for the JSON
    decoder makes the whole answer undecodable; the ``result`` array is then
    split without decoding and each element decoded alone.
    """

    def __init__(self, *, tls: ssl.SSLContext | None = None, **kwargs: Any) -> None:
        """``tls`` verifies the Bot API server (default: Roost's shared :func:`client_tls`,
        in place of the context aiogram makes for each session)."""
        super().__init__(**kwargs)
        self._connector_init["ssl"] = tls or client_tls()
        self.reported = Reported()
        self.unusable = 0
        """Updates of the last ``getUpdates`` answer that could not even be confirmed."""

    async def close(self) -> None:
        """Close the connections, without aiogram's 250 ms pause after it.

        aiogram sleeps so that SSL transports finish closing before the loop
        ends; aiohttp (3.14 here) waits for its connections' transports to close
        in ``ClientSession.close`` itself, and the pause held up every stop.
        """
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def build_form_data(self, bot: Bot, method: TelegramMethod[TelegramType]
                        ) -> Any:  # a FormData, or the same fields already encoded
        """The call's fields as aiogram sends them, encoded at once when there is no file.

        Without a file aiohttp's ``FormData`` sends the fields urlencoded anyway,
        after building a multipart writer and its field list for every call (most
        of a short call's request-side cost); the same body is built directly.
        """
        files: dict[str, InputFile] = {}
        fields = []
        for key, value in method.model_dump(warnings=False).items():
            prepared = self.prepare_value(value, bot=bot, files=files)
            if prepared:
                fields.append((key, prepared))
        if files:
            return super().build_form_data(bot, method)
        return BytesPayload(urlencode(fields).encode(),
                            content_type="application/x-www-form-urlencoded")

    def check_response(self, bot: Bot, method: TelegramMethod[TelegramType],
                       status_code: int, content: str) -> Response[TelegramType]:
        if isinstance(method, BUILT):
            with BUILDING:  # being built in the background: wait rather than build twice
                pass
        if isinstance(method, GetUpdates) and HTTPStatus.OK <= status_code <= HTTPStatus.IM_USED:
            updates = self._updates(bot, content)
            if updates is not None:
                return cast("Response[TelegramType]",
                            Response[list[Update]](ok=True, result=updates))
        return super().check_response(bot, method, status_code, content)

    def _updates(self, bot: Bot, content: str) -> list[Update] | None:
        self.unusable = 0
        try:
            data = self.json_loads(content)
        except (ValueError, RecursionError):
            # One update may be what the decoder refuses (nested too deeply, a
            # number of thousands of digits): the others are decoded alone. An
            # answer that is not JSON at all has no result array to split.
            elements = result_elements(content)
            if elements is None:
                return None
            updates: list[Update] = []
            for element in elements:
                try:
                    raw = self.json_loads(element)
                except (ValueError, RecursionError) as exc:
                    update = undecodable(element, self.reported, exc)
                else:
                    update = parse_update(raw, bot, self.reported)
                if update is not None:
                    updates.append(update)
            self.unusable = len(elements) - len(updates)
            return updates
        if isinstance(data, dict) and data.get("ok") is True \
                and isinstance(data.get("result"), list):
            updates = [u for raw in data["result"]
                       if (u := parse_update(raw, bot, self.reported)) is not None]
            self.unusable = len(data["result"]) - len(updates)
            return updates
        return None


def backoff(base: float, failures: int) -> float:
    """Exponential pause with ±25 % jitter, capped, after ``failures`` failures in a row."""
    policy = RetryPolicy(base_delay=base, max_delay=POLL_BACKOFF_CAP, jitter=0.25)
    return min(POLL_BACKOFF_CAP, policy.delay(failures))


def where(exc: BaseException) -> str:
    """The exception and the innermost line it came from, on one line."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    place = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
    return f"{describe_error(exc)}{place}"


class Updates:
    """Hands each update to the core once (translated, its message id noted), remembers
    it only after the core's handler returned, and says whether intake is healthy or
    stopped."""

    def __init__(self, api: BotApi, chats: Chats, translator: Translator,
                 unhandled: Unhandled) -> None:
        self.api = api
        self.chats = chats
        self.translator = translator
        self.unhandled = unhandled
        self._handler: InboundHandler | None = None
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._stopped = False
        self._stopping = asyncio.Event()
        """Set once intake stops: wakes the polling loop out of its pauses."""
        self._health = CONNECTING
        """What ``/readyz`` shows: ready once ``getMe`` passed and polling (or the
        webhook) began; not ready from a failed ``getUpdates`` until the next success."""

    def start(self, handler: InboundHandler) -> None:
        """Hand messages to ``handler`` from now on."""
        self._handler = handler

    @property
    def health(self) -> ChannelHealth:
        """Ready once receiving; not from a failed ``getUpdates`` until one succeeds."""
        return self._health

    def report(self, health: ChannelHealth) -> None:
        """Intake's health is now ``health``."""
        self._health = health

    @property
    def stopped(self) -> bool:
        """Whether intake stopped: nothing more is taken."""
        return self._stopped

    def stop(self) -> bool:
        """Stop taking updates; ``False`` if intake had stopped already."""
        if self._stopped:
            return False
        self._stopped = True
        self._stopping.set()
        return True

    async def pause(self, seconds: float) -> None:
        """Sleep, unless intake stops first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def until(self, event: Awaitable[None]) -> bool:
        """Wait for ``event``; False if intake stopped first."""
        waiting = asyncio.ensure_future(event)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)
        return not self._stopped

    async def process(self, update: Update) -> None:
        """Hand one update to the core; raises if the core did not take it."""
        if update.update_id in self._seen:
            log.info("telegram: update %d was delivered again; ignored", update.update_id)
            return
        events: list[InboundEvent] = []
        event_id = str(update.update_id)
        try:
            if update.message is not None:
                # Its id takes a place in the chat's sequence (see .outcomes).
                self.chats.saw(update.message.chat.id, update.message.message_id)
                inbound = self.translator.translate(update.message, event_id=event_id)
                events = [] if inbound is None else [inbound]
            elif update.edited_message is not None:
                edit = edit_of(self.translator, update.edited_message, event_id)
                events = [] if edit is None else [edit]
            elif update.callback_query is not None:
                press = press_of(update.callback_query)
                if press is None:  # a game's button, a press on an inline-mode message
                    self.unhandled.note("callback_query", update.update_id)
                events = [] if press is None else [press]
            elif update.message_reaction is not None:
                events = list(reactions_of(update.message_reaction, event_id))
            else:
                self.unhandled.note(update_kind(update), update.update_id)
        except Exception as exc:
            # A translation bug would fail the same way on every redelivery
            # and wedge the updates behind it: this one is skipped instead,
            # with one line saying where (a traceback per bad update would
            # let anyone who can message the bot flood the log).
            log.warning("telegram: update %d could not be translated (%s); skipped",
                        update.update_id, where(exc))
        if self._handler is not None:
            for event in events:
                await self._handler(event)
        # Remembered only now: a redelivery after a failed handler must go through.
        self._seen[update.update_id] = None
        if len(self._seen) > SEEN_UPDATES:
            self._seen.popitem(last=False)

    async def feed_raw(self, raw: Any) -> None:
        """Handle one update as received; malformed ones are skipped.

        Raises if the core's handler raised, as the webhook then answers 500.
        """
        update = parse_update(raw, self.api.required())
        if update is not None:
            await self.process(update)


class LongPolling:
    """Fetches updates with ``getUpdates`` while this replica leads and hands them to
    :class:`Updates` in order, moving the offset past each only once it was taken."""

    def __init__(self, settings: Settings, limiter: RateLimiter, updates: Updates, *,
                 polling_timeout: int, request_timeout: float, poll_backoff: float) -> None:
        self.settings = settings
        self.limiter = limiter
        self.updates = updates
        self.polling_timeout = polling_timeout
        self.request_timeout = request_timeout
        self.poll_backoff = poll_backoff
        self.task: asyncio.Task[None] | None = None
        """The polling loop (``None`` before :meth:`start`)."""
        self._fetching: asyncio.Task[list[Update]] | None = None

    def start(self, bot: Bot, leadership: Leadership | None) -> None:
        """Begin polling through ``bot`` (in turns with other replicas under ``leadership``)."""
        self.task = asyncio.create_task(self._poll(bot, leadership))

    async def stop(self) -> None:
        """Cut a long poll in flight; let an update being handed over finish (bounded)."""
        if self._fetching is not None:
            self._fetching.cancel()
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), STOP_GRACE)
            except (TimeoutError, asyncio.CancelledError):
                self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _poll(self, bot: Bot, lead: Leadership | None) -> None:
        """Long-poll while this replica leads (always when there is no ``lead``).

        A follower waits, ready (it sends replies; the leader receives). A leader
        that loses its lock cuts its long poll at once: the update being handed
        over either reached the inbox or is served again to the next leader,
        and the inbox records each update_id once.
        """
        if lead is None:
            await self._poll_updates(bot)
            return
        while not self.updates.stopped:
            if not lead.is_leader:
                self.updates.report(STANDBY)
                log.info("telegram: another replica polls; this one takes over if it stops")
                if not await self.updates.until(lead.wait_leading()):
                    return
            log.info("telegram: this replica leads: long polling")
            polling = asyncio.ensure_future(self._poll_updates(bot))
            lost = asyncio.ensure_future(lead.wait_lost())
            try:
                await asyncio.wait({polling, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                if not polling.done():
                    polling.cancel()
                await asyncio.gather(lost, polling, return_exceptions=True)
            if polling.cancelled():
                continue  # leadership lost: wait to lead again
            await polling  # ended on its own (stopped, or the token was refused)
            return

    async def _poll_updates(self, bot: Bot) -> None:
        """Fetch updates and hand them to the core, one at a time, in order.

        The offset (Telegram's acknowledgement) moves past an update only once
        the handler returned for it. If the handler raises, the rest of the
        batch waits: after a pause the same offset is fetched again, and
        Telegram serves that update again.
        """
        updates = self.updates
        offset: int | None = None
        fetch_failures = 0
        handler_failures = 0
        while not updates.stopped:
            if updates.health is CONNECTING:
                updates.report(READY)  # getMe passed; the first getUpdates goes out now
            self._fetching = asyncio.ensure_future(self._fetch(bot, offset))
            try:
                batch = await self._fetching
            except asyncio.CancelledError:
                if updates.stopped:
                    return
                raise
            except RateLimited as exc:
                # The limiter holds the next getUpdates until the window passed.
                log.warning("telegram: getUpdates rate limited; waiting %.0fs", exc.retry_after)
                continue
            except TelegramUnauthorizedError as exc:
                log.error("telegram: the bot token was refused (%s); polling stopped",
                          exc.message)
                updates.report(ChannelHealth(False, "the bot token was refused; polling "
                                                    "stopped"))
                return
            except Exception as exc:
                updates.report(ChannelHealth(False, f"getUpdates failing ({self._why(exc)})"))
                fetch_failures += 1
                delay = backoff(self.poll_backoff, fetch_failures)
                log.warning("telegram: getUpdates failed (%s); retrying in %.1fs",
                            describe_error(exc), delay)
                await updates.pause(delay)
                continue
            finally:
                self._fetching = None
            updates.report(READY)
            fetch_failures = 0
            if not batch and isinstance(bot.session, TolerantSession) and bot.session.unusable:
                # Only updates that cannot be confirmed (a broken or hostile server
                # serves them again at once): not a hot loop.
                await updates.pause(self.poll_backoff)
            for update in batch:
                if updates.stopped:
                    return
                try:
                    await updates.process(update)
                except Exception as exc:
                    handler_failures += 1
                    delay = backoff(self.poll_backoff, handler_failures)
                    log.warning("telegram: update %d was not taken (%s); fetching it again "
                                "in %.1fs", update.update_id, describe_error(exc), delay)
                    await updates.pause(delay)
                    break
                handler_failures = 0
                offset = update.update_id + 1

    def _why(self, exc: BaseException) -> str:
        """Why a ``getUpdates`` failed, briefly (``server error: Bad Gateway``), token-free."""
        # Transient carries the reason already worded; others say their type.
        text = str(exc) if isinstance(exc, Transient) else describe_error(exc)
        text = text.splitlines()[0][:120] if text else type(exc).__name__
        token = self.settings.telegram_bot_token
        # An HTTP error's text may hold the request URL, which holds the token.
        return text.replace(token.get_secret_value(), "***") if token else text

    async def _fetch(self, bot: Bot, offset: int | None) -> list[Update]:
        method = GetUpdates(offset=offset, timeout=self.polling_timeout,
                            allowed_updates=ALLOWED_UPDATES)
        async with self.limiter.slot(GET_UPDATES):
            # The long poll may take its whole timeout; a dead connection is
            # noticed after a margin on top of it.
            return await translated(bot(method, request_timeout=int(
                self.polling_timeout + self.request_timeout)))
