"""A local fake of the Telegram Bot API, for driving the real aiogram against it.

Point a bot at it with ``TELEGRAM_API_BASE=fake.base_url`` (Roost) or
``AiohttpSession(api=TelegramAPIServer.from_base(fake.base_url))`` (aiogram)
and the token ``fake.token``. It answers like the real server: form-encoded
calls to ``/bot{token}/{method}``, the ``{"ok": ..., "result": ...}`` envelope,
``getUpdates`` long polling with ``offset`` and ``timeout`` (woken by a push),
or webhook delivery after ``setWebhook``. ``sendMessage`` and
``editMessageText`` check ``parse_mode=HTML`` text the way Telegram does
(supported tags, balanced, ``<``/``>``/``&`` escaped) and the 4,096-character
limit, so a test sees the same 400s a real bot would::

    async with FakeTelegram() as fake:
        update = fake.private_message("hello")
        ...                                   # start the bot
        [call] = await fake.wait_for("sendMessage")
        assert call.params["chat_id"] == update["message"]["chat"]["id"]

Every call is recorded in :attr:`FakeTelegram.calls` (method, decoded
params, time, HTTP status, injected fault). :meth:`FakeTelegram.fail` makes
the next N calls of a method fail (429 with ``retry_after``, 5xx, 400 "can't
parse entities", nginx's HTML 502 page, a reset before or after the call took
effect, a stall...); :meth:`FakeTelegram.inject_faults` fails a share of all
calls at random, the ways real Telegram does. A 429 holds the call's chat
(or the bot) as on the real server: every call into that window is refused
again and kept in :attr:`FakeTelegram.violations`. Identical edits get
"message is not modified", updates are served until a higher offset confirms
them (the offset read as the real server reads it: a 32-bit integer, and a
negative one forgets all queued updates but the last few), and webhook
deliveries are retried on non-2xx.
:meth:`FakeTelegram.visible` is what a user sees in a chat now.
The ``fake_telegram`` pytest fixture yields a started instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

__all__ = [
    "ALICE",
    "BOB",
    "FAULT_KINDS",
    "Call",
    "FakeTelegram",
    "HtmlError",
    "RawJson",
    "fake_telegram",
    "parse_html",
    "user",
]

MAX_TEXT = 4096
"""Telegram's limit on a message's text, in UTF-16 code units after entity parsing."""


def user(user_id: int, first_name: str, username: str | None = None, *,
         is_bot: bool = False) -> dict[str, Any]:
    """A Telegram ``User`` object."""
    data: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
    if username:
        data["username"] = username
    return data


ALICE = user(42, "Alice", "alice")
"""The default sender of pushed messages."""
BOB = user(43, "Bob", "bob")
"""A second human, for groups."""


@dataclass(slots=True)
class Call:
    """One API call the fake received.

    ``status`` is 0 while the call is being answered (a long poll), then the
    HTTP status. ``params`` are decoded the way the server reads them: JSON-encoded values
    (``chat_id``, ``reply_parameters``, ``commands``...) become Python values,
    text fields stay strings. ``at`` is ``time.perf_counter()`` on arrival.
    """

    method: str
    params: dict[str, Any]
    at: float
    status: int = 200
    result: Any = None
    error: str = ""
    fault: str = ""
    """The fault injected into this call, if any (see :meth:`FakeTelegram.fail`):
    ``"status"``, ``"html"``, ``"reset_before"`` (status stays 0: nothing
    happened), ``"reset_after"`` (status 200: it took effect, the answer was
    lost), ``"stall"``, or ``"window"`` (a call inside a 429 window)."""


FAULT_KINDS = ("500", "html", "429", "reset_before", "reset_after", "stall")
"""The faults :meth:`FakeTelegram.inject_faults` draws from, as real Telegram has them."""


@dataclass(slots=True)
class _Failure:
    status: int
    description: str
    retry_after: int | None
    times: int
    kind: str = "status"
    seconds: float = 0.0
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _RandomFaults:
    rate: float
    kinds: tuple[str, ...]
    methods: frozenset[str] | None
    retry_after: int
    stall: float
    rng: random.Random


@dataclass(frozen=True, slots=True)
class RawJson:
    """JSON text spliced into an answer as it is (see :meth:`FakeTelegram.push_json`)."""

    text: str


def _dumps(value: Any) -> str:
    """``value`` as JSON, with :class:`RawJson` pieces spliced in verbatim."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    return json.dumps(value)


@dataclass(slots=True)
class _Pending:
    update_id: int
    payload: Any
    kind: str | None


@dataclass(slots=True)
class _Webhook:
    url: str
    secret: str | None
    allowed: list[str] | None
    attempts: list[tuple[int, int]] = field(default_factory=list)


class _ApiError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None,
                 parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after
        self.parameters = dict(parameters or {})


_HTML_PAGES = {
    502: "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center>"
         "<h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.18.0</center>\r\n"
         "</body>\r\n</html>\r\n",
    504: "<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n"
         "<center><h1>504 Gateway Time-out</h1></center>\r\n<hr><center>nginx/1.18.0"
         "</center>\r\n</body>\r\n</html>\r\n",
}


# Fields whose values aiogram sends as plain strings; everything else is JSON.
_TEXT_PARAMS = frozenset({
    "text", "caption", "parse_mode", "action", "url", "secret_token", "ip_address",
    "language_code", "emoji", "name", "description", "short_description",
    "business_connection_id", "message_effect_id",
})

_UPDATE_KINDS = (
    "message", "edited_message", "channel_post", "edited_channel_post", "callback_query",
    "inline_query", "my_chat_member", "chat_member", "message_reaction", "poll",
)

_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")


class FakeTelegram:
    """An aiohttp server on 127.0.0.1 speaking the Bot API for one bot.

    ``token`` must look like ``<digits>:<text>``; its number is the bot's user
    id. Calls with another token get a 401, as from the real server.
    """

    def __init__(self, *, token: str = "123456:TEST-TOKEN", username: str = "test_bot",
                 first_name: str = "TestBot") -> None:
        digits, sep, _ = token.partition(":")
        if not sep or not digits.isdigit():
            raise ValueError("a bot token looks like '<digits>:<text>'")
        self.token = token
        self.bot_id = int(digits)
        self.username = username
        self.bot_user = user(self.bot_id, first_name, username, is_bot=True)
        self.calls: list[Call] = []
        """Every call received, in order (failed ones included)."""
        self.messages: dict[tuple[int | str, int], dict[str, Any]] = {}
        """Messages the bot sent and did not delete, by ``(chat_id, message_id)``, as
        currently shown (``text`` is the visible text; keys starting with ``_`` are
        the fake's own: ``_source`` and ``_parse_mode`` of the latest version)."""
        self.deleted: list[tuple[int | str, int]] = []
        self.commands: dict[str, list[dict[str, Any]]] = {}
        """``setMyCommands`` lists by scope (``"default"``, ``"chat:<id>"``, ...)."""
        self.webhook: _Webhook | None = None
        self.on_call: Callable[[Call], None] | None = None
        """Called synchronously for each call as it arrives (benchmarks timestamp here)."""
        self._record = True
        self._updates: list[_Pending] = []
        self._redeliver: list[_Pending] = []
        self._confirmed = 0  # every update_id below this was confirmed by an offset
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(1000)
        self._chats: dict[int | str, dict[str, Any]] = {}
        self._failures: dict[str, list[_Failure]] = {}
        self._random: _RandomFaults | None = None
        self._windows: dict[str, tuple[float, int]] = {}
        self.violations: list[Call] = []
        """Calls that arrived while a 429 window of their scope (their chat, or the
        whole bot) was open: a well-behaved client makes none."""
        self.webhook_max_attempts = 3
        """Webhook deliveries of one update before the fake gives up on it."""
        self._wake = asyncio.Event()
        self._poll_generation = 0
        self._call_cond = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._port = 0
        self._client: aiohttp.ClientSession | None = None
        self._webhook_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        # Cancel a handler when its client hangs up, so an abandoned long poll
        # ends at once instead of holding the shutdown for its whole timeout.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     handler_cancellation=True)
        self._closing = False
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop serving (waking any long poll) and release the port."""
        self._closing = True
        self._wake.set()
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            await asyncio.gather(self._webhook_task, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """The server's root, for ``TELEGRAM_API_BASE`` / ``TelegramAPIServer.from_base``."""
        if not self._port:
            raise RuntimeError("FakeTelegram is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def record(self) -> bool:
        """Whether calls are kept in :attr:`calls` (benchmarks turn it off)."""
        return self._record

    @record.setter
    def record(self, value: bool) -> None:
        self._record = value

    # -- pushing updates -----------------------------------------------------

    def push_update(self, update: Mapping[str, Any]) -> dict[str, Any]:
        """Queue an update (an ``update_id`` is assigned if missing); returns it."""
        data = dict(update)
        if not isinstance(data.get("update_id"), int):
            data["update_id"] = next(self._update_ids)
        else:
            self._skip_ids_to(data["update_id"])
        kind = next((k for k in _UPDATE_KINDS if k in data), None)
        self._enqueue(_Pending(data["update_id"], data, kind))
        return data

    def push_raw(self, payload: Any) -> int:
        """Queue anything as an update, even garbage; returns the id it is ordered by.

        A dict with an integer ``update_id`` keeps it; anything else is ordered
        by a fresh id the client cannot see, so only a later update's offset
        confirms it (as with the real server).
        """
        if isinstance(payload, dict) and isinstance(payload.get("update_id"), int):
            update_id = int(payload["update_id"])
            self._skip_ids_to(update_id)
        else:
            update_id = next(self._update_ids)
        self._enqueue(_Pending(update_id, payload, None))
        return update_id

    def _skip_ids_to(self, update_id: int) -> None:
        """Later assigned ids stay above an explicit one, as the server's ids only grow."""
        self._update_ids = itertools.count(max(update_id + 1, next(self._update_ids)))

    def push_json(self, text: str, update_id: int) -> int:
        """Queue an update given as raw JSON text, served exactly as written.

        For updates Python's own ``json`` could not even encode, such as one
        nested a hundred thousand levels deep. ``update_id`` orders it (it
        should match the one in ``text``, as on the real server).
        """
        self._skip_ids_to(update_id)
        self._enqueue(_Pending(update_id, RawJson(text), None))
        return update_id

    def redeliver(self, update: Mapping[str, Any]) -> None:
        """Serve an already delivered update again, whatever offset was confirmed.

        That is what the real server does when the bot restarts before its
        offset reached the server, or when a webhook answer was lost.
        """
        self._redeliver.append(_Pending(int(update["update_id"]), dict(update), "message"))
        self._notify_updates()

    def private_message(self, text: str, *, sender: Mapping[str, Any] = ALICE,
                        entities: Sequence[Mapping[str, Any]] | None = None,
                        **extra: Any) -> dict[str, Any]:
        """Push a message in the sender's private chat with the bot."""
        chat = {"id": sender["id"], "type": "private", "first_name": sender["first_name"]}
        if "username" in sender:
            chat["username"] = sender["username"]
        return self._push_message(chat, sender, text, entities, **extra)

    def group_message(self, text: str, *, chat_id: int = -1001234567890,
                      sender: Mapping[str, Any] = ALICE, title: str = "Test group",
                      entities: Sequence[Mapping[str, Any]] | None = None,
                      reply_to: Mapping[str, Any] | None = None, forum: bool = False,
                      thread_id: int | None = None, **extra: Any) -> dict[str, Any]:
        """Push a message in a group (a supergroup when ``chat_id`` starts with -100).

        ``reply_to`` is the replied-to message object; ``thread_id`` puts the
        message in that forum topic (and makes the chat a forum).
        """
        kind = "supergroup" if str(chat_id).startswith("-100") else "group"
        chat: dict[str, Any] = {"id": chat_id, "type": kind, "title": title}
        if forum or thread_id is not None:
            chat["is_forum"] = True
        if thread_id is not None:
            extra["message_thread_id"] = thread_id
            extra["is_topic_message"] = True
            if reply_to is None:
                # In a topic, a message that replies to nothing replies to the
                # topic's creation service message.
                reply_to = {"message_id": thread_id, "date": _now(), "chat": chat,
                            "from": ALICE, "message_thread_id": thread_id,
                            "forum_topic_created": {"name": f"Topic {thread_id}",
                                                    "icon_color": 7322096}}
        if reply_to is not None:
            extra["reply_to_message"] = dict(reply_to)
        return self._push_message(chat, sender, text, entities, **extra)

    def mention(self, text: str, **kwargs: Any) -> dict[str, Any]:
        """Push a group message starting with ``@botusername`` (with its entity)."""
        handle = f"@{self.username}"
        entity = {"type": "mention", "offset": 0, "length": _utf16_len(handle)}
        return self.group_message(f"{handle} {text}", entities=[entity], **kwargs)

    def reply_to_bot(self, text: str, message_id: int | None = None,
                     **kwargs: Any) -> dict[str, Any]:
        """Push a group message replying to one the bot sent (the latest by default)."""
        chat_id = kwargs.get("chat_id", -1001234567890)
        if message_id is None:
            mine = [mid for (cid, mid) in self.messages if cid == chat_id]
            if not mine:
                raise AssertionError(f"the bot sent nothing to {chat_id} to reply to")
            message_id = max(mine)
        kept = self.messages.get((chat_id, message_id))
        original = _public(kept) if kept is not None else {
            "message_id": message_id, "date": _now(), "chat": self._chat(chat_id),
            "from": self.bot_user, "text": "earlier"}
        return self.group_message(text, reply_to=original, **kwargs)

    def topic_message(self, text: str, thread_id: int, *, mention: bool = True,
                      **kwargs: Any) -> dict[str, Any]:
        """Push a message in forum topic ``thread_id``, mentioning the bot by default."""
        if mention:
            handle = f"@{self.username}"
            kwargs["entities"] = [{"type": "mention", "offset": 0, "length": len(handle)}]
            text = f"{handle} {text}"
        return self.group_message(text, thread_id=thread_id, **kwargs)

    def command(self, command: str, args: str = "", *, group: bool = False,
                **kwargs: Any) -> dict[str, Any]:
        """Push ``/command[@bot] args`` with its ``bot_command`` entity."""
        head = command if command.startswith("/") else f"/{command}"
        text = f"{head} {args}".strip()
        entities = [{"type": "bot_command", "offset": 0, "length": _utf16_len(head)}]
        if group:
            return self.group_message(text, entities=entities, **kwargs)
        return self.private_message(text, entities=entities, **kwargs)

    def _push_message(self, chat: dict[str, Any], sender: Mapping[str, Any], text: str,
                      entities: Sequence[Mapping[str, Any]] | None,
                      **extra: Any) -> dict[str, Any]:
        self._chats[chat["id"]] = chat
        message: dict[str, Any] = {"message_id": next(self._message_ids), "date": _now(),
                                   "chat": chat, "from": dict(sender), "text": text}
        if entities:
            message["entities"] = [dict(e) for e in entities]
        message.update(extra)
        return self.push_update({"message": message})

    def _enqueue(self, pending: _Pending) -> None:
        self._updates.append(pending)
        self._notify_updates()

    def _notify_updates(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()
        if self.webhook is not None:
            self._ensure_webhook_worker()

    # -- scripting failures --------------------------------------------------

    def fail(self, method: str, status: int = 500, *, description: str | None = None,
             retry_after: int | None = None, times: int = 1, kind: str = "status",
             seconds: float = 0.0, migrate_to_chat_id: int | None = None) -> None:
        """Make the next ``times`` calls of ``method`` fail.

        ``kind`` is how: ``"status"`` answers ``status`` with the JSON error
        envelope (429 defaults to ``retry_after=1`` and opens a window on the
        call's chat; 400 defaults to "can't parse entities"; ``migrate_to_chat_id``
        adds that parameter, as for a group upgraded to a supergroup);
        ``"html"`` answers ``status`` with nginx's HTML error page, as Telegram
        does during incidents; ``"reset_before"`` closes the connection without
        doing anything; ``"reset_after"`` does the call, then closes the
        connection without answering; ``"stall"`` waits ``seconds`` before
        doing and answering the call (a client that gives up first cancels it).
        Failures for one method are used in the order they were added.
        """
        if status == 429 and retry_after is None:
            retry_after = 1
        if description is None:
            description = {
                400: "Bad Request: can't parse entities: Unsupported start tag \"x\" at "
                     "byte offset 0",
                401: "Unauthorized",
                403: "Forbidden: bot was blocked by the user",
                404: "Not Found",
                409: "Conflict: terminated by other getUpdates request",
                413: "Request Entity Too Large",
                429: f"Too Many Requests: retry after {retry_after}",
                502: "Bad Gateway",
            }.get(status, "Internal Server Error")
        parameters: dict[str, Any] = {}
        if migrate_to_chat_id is not None:
            parameters["migrate_to_chat_id"] = migrate_to_chat_id
            if description.startswith("Internal"):
                description = "Bad Request: group chat was upgraded to a supergroup chat"
        self._failures.setdefault(method.lower(), []).append(
            _Failure(status, description, retry_after, times, kind, seconds, parameters))

    def inject_faults(self, rate: float, *, kinds: Sequence[str] = FAULT_KINDS,
                      methods: Sequence[str] | None = None, retry_after: int = 1,
                      stall: float = 1.0, seed: int | None = None) -> None:
        """Fail a share ``rate`` of calls, each in one of ``kinds`` drawn at random.

        ``kinds`` are those of :data:`FAULT_KINDS`: a 500 with the JSON
        envelope, a 502 HTML page, a 429 with ``retry_after`` (scoped to the
        call's chat, or to the bot for calls without one), a reset before or
        after the call took effect, a stall of ``stall`` seconds. ``methods``
        limits the faults to those methods. ``rate=0`` turns them off.
        Scripted :meth:`fail` entries are used first.
        """
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        self._random = None if rate <= 0 else _RandomFaults(
            rate, tuple(kinds), None if methods is None else frozenset(m.lower() for m in methods),
            retry_after, stall, random.Random(seed))

    def _random_fault(self, method: str) -> _Failure | None:
        faults = self._random
        if faults is None or (faults.methods is not None and method not in faults.methods):
            return None
        if faults.rng.random() >= faults.rate:
            return None
        kind = faults.rng.choice(faults.kinds)
        if kind == "500":
            return _Failure(500, "Internal Server Error", None, 1)
        if kind == "html":
            return _Failure(502, "Bad Gateway", None, 1, "html")
        if kind == "429":
            return _Failure(429, f"Too Many Requests: retry after {faults.retry_after}",
                            faults.retry_after, 1)
        return _Failure(0, "", None, 1, kind, faults.stall)

    @property
    def faults(self) -> dict[str, int]:
        """How many calls got each injected fault (``"window"``: calls inside a 429 window)."""
        counts: dict[str, int] = {}
        for call in self.calls:
            if call.fault:
                counts[call.fault] = counts.get(call.fault, 0) + 1
        return counts

    def visible(self, chat_id: int | str) -> list[str]:
        """The texts a user sees in ``chat_id`` now: sent, not deleted, as last edited."""
        return [m["text"] for (cid, mid), m in sorted(self.messages.items(),
                                                       key=lambda kv: kv[0][1])
                if cid == chat_id]

    # -- inspecting ------------------------------------------------------------

    def calls_of(self, method: str) -> list[Call]:
        """Recorded calls of ``method`` (case-insensitive), successful or not."""
        name = method.lower()
        return [c for c in self.calls if c.method.lower() == name]

    def sent(self, method: str = "sendMessage") -> list[Call]:
        """Successful calls of ``method``."""
        return [c for c in self.calls_of(method) if c.status == 200]

    def sent_texts(self, chat_id: int | str | None = None) -> list[str]:
        """Texts of the successful ``sendMessage`` calls (to ``chat_id`` if given)."""
        return [c.params.get("text", "") for c in self.sent()
                if chat_id is None or c.params.get("chat_id") == chat_id]

    async def wait_confirmed(self, update_id: int, *, limit: float = 5.0) -> None:
        """Wait until the bot confirmed ``update_id`` (a later ``getUpdates`` offset).

        aiogram handles an update before it asks for the next batch, so after
        this the bot has handed the message to its handler.
        """
        def confirmed() -> bool:
            return any(int(c.params.get("offset") or 0) > update_id
                       for c in self.calls_of("getUpdates"))

        try:
            async with asyncio.timeout(limit), self._call_cond:
                await self._call_cond.wait_for(confirmed)
        except TimeoutError:
            raise AssertionError(f"update {update_id} was not confirmed within {limit}s") \
                from None

    async def wait_until(self, check: Callable[[], bool], *, limit: float = 5.0) -> None:
        """Wait until ``check()`` holds; it is tried again as each call arrives or ends."""
        try:
            async with asyncio.timeout(limit), self._call_cond:
                await self._call_cond.wait_for(check)
        except TimeoutError:
            raise AssertionError(f"the condition did not hold within {limit}s") from None

    async def wait_for(self, method: str, count: int = 1, *, limit: float = 5.0,
                       ok: bool = True) -> list[Call]:
        """Wait until ``count`` calls of ``method`` arrived (successful ones if ``ok``)."""
        def matching() -> list[Call]:
            return self.sent(method) if ok else self.calls_of(method)

        try:
            async with asyncio.timeout(limit), self._call_cond:
                await self._call_cond.wait_for(lambda: len(matching()) >= count)
        except TimeoutError:
            raise AssertionError(
                f"expected {count} {method} call(s) within {limit}s, got "
                f"{len(matching())}; calls: {[c.method for c in self.calls]}") from None
        return matching()

    # -- serving -----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        method = request.match_info["method"]
        params = _decode(await request.post()) if request.can_read_body else {}
        params.update({k: _decode_value(k, v) for k, v in request.query.items()})
        call = Call(method, params, started, status=0)
        if self.on_call is not None:
            self.on_call(call)
        await self._record_call(call, arrived=True)
        scope = _scope_of(method, params)
        failure: _Failure | None = None
        try:
            if request.match_info["token"] != self.token:
                raise _ApiError(401, "Unauthorized")
            self._check_window(call, scope)
            failure = self._take_failure(method.lower())
            if failure is not None:
                call.fault = failure.kind
                if failure.kind == "status":
                    raise _ApiError(failure.status, failure.description, failure.retry_after,
                                    failure.parameters)
                if failure.kind == "html":
                    call.status, call.error = failure.status, "HTML error page"
                    await self._record_call(call)
                    return web.Response(status=failure.status, content_type="text/html",
                                        text=_HTML_PAGES.get(failure.status,
                                                             _HTML_PAGES[502]))
                if failure.kind == "reset_before":
                    await self._record_call(call)
                    _drop(request)
                if failure.kind == "stall":
                    await asyncio.sleep(failure.seconds)
            call.result = await self._dispatch(method.lower(), params)
        except _ApiError as exc:
            call.status, call.error = exc.status, exc.description
            body: dict[str, Any] = {"ok": False, "error_code": exc.status,
                                    "description": exc.description}
            parameters = dict(exc.parameters)
            if exc.retry_after is not None:
                parameters["retry_after"] = exc.retry_after
                if call.fault != "window":
                    self._open_window(scope, exc.retry_after)
            if parameters:
                body["parameters"] = parameters
            await self._record_call(call)
            return web.json_response(body, status=exc.status)
        call.status = 200
        await self._record_call(call)
        if failure is not None and failure.kind == "reset_after":
            _drop(request)
        return web.Response(text='{"ok": true, "result": ' + _dumps(call.result) + "}",
                            content_type="application/json")

    def _open_window(self, scope: str, retry_after: int) -> None:
        until = time.monotonic() + retry_after
        if until > self._windows.get(scope, (0.0, 0))[0]:
            self._windows[scope] = (until, retry_after)

    def _check_window(self, call: Call, scope: str) -> None:
        """A call inside an open 429 window is refused again, and the wait starts over."""
        now = time.monotonic()
        for key in {scope, "bot"}:
            until, retry_after = self._windows.get(key, (0.0, 0))
            if now < until:
                call.fault = "window"
                self.violations.append(call)
                # As Telegram does: calling into the flood wait extends it.
                self._windows[key] = (now + retry_after, retry_after)
                raise _ApiError(429, f"Too Many Requests: retry after {retry_after}",
                                max(1, math.ceil(retry_after)))

    async def _record_call(self, call: Call, *, arrived: bool = False) -> None:
        """Keep ``call`` (on arrival) and wake waiters (on arrival and on completion)."""
        if not self._record:
            return
        if arrived:
            self.calls.append(call)
        async with self._call_cond:
            self._call_cond.notify_all()

    def _take_failure(self, method: str) -> _Failure | None:
        queue = self._failures.get(method)
        if not queue:
            return self._random_fault(method)
        failure = queue[0]
        failure.times -= 1
        if failure.times <= 0:
            queue.pop(0)
        return failure

    async def _dispatch(self, method: str, p: dict[str, Any]) -> Any:
        if method == "getme":
            return self.bot_user
        if method == "getupdates":
            return await self._get_updates(p)
        if method == "sendmessage":
            return self._send_message(p)
        if method == "editmessagetext":
            return self._edit_message(p)
        if method == "deletemessage":
            return self._delete_message(p)
        if method == "sendchataction":
            _require(p, "chat_id", "action")
            return True
        if method == "setmycommands":
            return self._set_commands(p)
        if method == "getmycommands":
            return self.commands.get(_scope_key(p.get("scope")), [])
        if method == "deletemycommands":
            self.commands.pop(_scope_key(p.get("scope")), None)
            return True
        if method == "setwebhook":
            return self._set_webhook(p)
        if method == "deletewebhook":
            if p.get("drop_pending_updates"):
                self._updates.clear()
            self.webhook = None
            return True
        if method == "getwebhookinfo":
            return {"url": self.webhook.url if self.webhook else "",
                    "has_custom_certificate": False,
                    "pending_update_count": len(self._updates)}
        if method in ("close", "logout"):
            return True
        raise _ApiError(404, "Not Found")

    # -- updates -------------------------------------------------------------------

    async def _get_updates(self, p: dict[str, Any]) -> list[Any]:
        if self.webhook is not None:
            raise _ApiError(409, "Conflict: can't use getUpdates method while webhook is "
                                 "active; use deleteWebhook to delete the webhook first")
        # As the real server reads it: a 32-bit integer (longer numbers wrap), and
        # a negative offset forgets every queued update but the last -offset.
        offset = (int(p.get("offset") or 0) + 2**31) % 2**32 - 2**31
        if offset < 0:
            self._updates = self._updates[offset:]
            self._redeliver.clear()
        limit = max(1, min(100, int(p.get("limit") or 100)))
        timeout = float(p.get("timeout") or 0)
        allowed = p.get("allowed_updates")
        self._poll_generation += 1
        generation = self._poll_generation
        deadline = time.monotonic() + timeout
        while True:
            if offset > 0:
                self._confirm(offset)
            ready = self._ready_updates(limit, allowed)
            if ready or time.monotonic() >= deadline or self._closing:
                return ready
            wake = self._wake
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), deadline - time.monotonic())
            if generation != self._poll_generation:
                raise _ApiError(409, "Conflict: terminated by other getUpdates request; make "
                                     "sure that only one bot instance is running")

    def _confirm(self, offset: int) -> None:
        self._confirmed = max(self._confirmed, offset)
        self._updates = [u for u in self._updates if u.update_id >= offset]

    def _ready_updates(self, limit: int, allowed: Any) -> list[Any]:
        out: list[Any] = []
        if self._redeliver:
            batch, self._redeliver = self._redeliver[:limit], self._redeliver[limit:]
            out.extend(u.payload for u in batch)
        for pending in self._updates:
            if len(out) >= limit:
                break
            if isinstance(allowed, list) and allowed and pending.kind is not None \
                    and pending.kind not in allowed:
                continue
            out.append(pending.payload)
        return out

    # -- webhook ---------------------------------------------------------------------

    def _set_webhook(self, p: dict[str, Any]) -> bool:
        url = str(p.get("url") or "")
        if not url:
            self.webhook = None
            return True
        if p.get("drop_pending_updates"):
            self._updates.clear()
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
        allowed = p.get("allowed_updates")
        self.webhook = _Webhook(url, None if secret is None else str(secret),
                                allowed if isinstance(allowed, list) else None)
        self._ensure_webhook_worker()
        return True

    def _ensure_webhook_worker(self) -> None:
        if self._webhook_task is None or self._webhook_task.done():
            self._webhook_task = asyncio.create_task(self._deliver_webhooks())

    async def _deliver_webhooks(self) -> None:
        """POST pending updates to the webhook one at a time, as the server does."""
        if self._client is None:
            self._client = aiohttp.ClientSession()
        while self.webhook is not None:
            hook = self.webhook
            pending = self._redeliver + self._updates
            if not pending:
                wake = self._wake
                await wake.wait()
                continue
            item = pending[0]
            headers = {"Content-Type": "application/json"}
            if hook.secret is not None:
                headers["X-Telegram-Bot-Api-Secret-Token"] = hook.secret
            status = 0
            try:
                async with self._client.post(hook.url, data=_dumps(item.payload),
                                             headers=headers) as resp:
                    status = resp.status
            except (aiohttp.ClientError, OSError):
                status = 0
            hook.attempts.append((item.update_id, status))
            async with self._call_cond:  # wake wait_until() on delivery attempts too
                self._call_cond.notify_all()
            if 200 <= status < 300 or len([a for a in hook.attempts
                                           if a[0] == item.update_id]) \
                    >= self.webhook_max_attempts:
                if item in self._redeliver:
                    self._redeliver.remove(item)
                elif item in self._updates:
                    self._updates.remove(item)
            else:
                await asyncio.sleep(0.05)

    @property
    def pending_updates(self) -> int:
        """Updates queued and not yet confirmed by an offset (or webhook answer)."""
        return len(self._updates) + len(self._redeliver)

    @property
    def webhook_attempts(self) -> list[tuple[int, int]]:
        """``(update_id, HTTP status)`` of each webhook delivery (0: no connection)."""
        return list(self.webhook.attempts) if self.webhook else []

    # -- messages ----------------------------------------------------------------------

    def _chat(self, chat_id: int | str) -> dict[str, Any]:
        known = self._chats.get(chat_id)
        if known is not None:
            return known
        if isinstance(chat_id, int) and chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        return {"id": chat_id, "type": "supergroup", "title": "Group"}

    def _text(self, p: dict[str, Any]) -> str:
        text = p.get("text")
        if not isinstance(text, str):
            text = "" if text is None else json.dumps(text)
        mode = str(p.get("parse_mode") or "")
        if mode.lower() == "html":
            try:
                text = parse_html(text)
            except HtmlError as exc:
                raise _ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        elif mode:
            # MarkdownV2 is not modelled: the text is taken as written.
            pass
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if _utf16_len(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        return text

    def _send_message(self, p: dict[str, Any]) -> dict[str, Any]:
        _require(p, "chat_id", "text")
        chat_id = p["chat_id"]
        text = self._text(p)
        chat = self._chat(chat_id)
        thread = p.get("message_thread_id")
        if thread is not None and not chat.get("is_forum") and chat.get("type") == "private":
            raise _ApiError(400, "Bad Request: message thread not found")
        message: dict[str, Any] = {"message_id": next(self._message_ids), "date": _now(),
                                   "chat": chat, "from": self.bot_user, "text": text}
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        reply = p.get("reply_parameters")
        reply_id = reply.get("message_id") if isinstance(reply, dict) else \
            p.get("reply_to_message_id")
        if reply_id is not None:
            message["reply_to_message"] = {"message_id": reply_id, "date": _now(),
                                           "chat": chat}
        self.messages[(chat_id, message["message_id"])] = {
            **message, "_source": p.get("text"), "_parse_mode": p.get("parse_mode")}
        return message

    def _edit_message(self, p: dict[str, Any]) -> dict[str, Any]:
        _require(p, "chat_id", "message_id", "text")
        key = (p["chat_id"], int(p["message_id"]))
        message = self.messages.get(key)
        if message is None:
            raise _ApiError(400, "Bad Request: message to edit not found")
        text = self._text(p)
        # Telegram compares the resulting text and entities; the source text
        # and parse mode stand in for the entities here.
        if p.get("text") == message.get("_source") \
                and p.get("parse_mode") == message.get("_parse_mode"):
            raise _ApiError(400, "Bad Request: message is not modified: specified new "
                                 "message content and reply markup are exactly the same as "
                                 "a current content and reply markup of the message")
        message = {**message, "text": text, "edit_date": _now(), "_source": p.get("text"),
                   "_parse_mode": p.get("parse_mode")}
        self.messages[key] = message
        return _public(message)

    def _delete_message(self, p: dict[str, Any]) -> bool:
        _require(p, "chat_id", "message_id")
        key = (p["chat_id"], int(p["message_id"]))
        if self.messages.pop(key, None) is None:
            raise _ApiError(400, "Bad Request: message to delete not found")
        self.deleted.append(key)
        return True

    def _set_commands(self, p: dict[str, Any]) -> bool:
        commands = p.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise _ApiError(400, "Bad Request: commands must be a list of at most 100")
        for command in commands:
            name = command.get("command", "") if isinstance(command, dict) else ""
            desc = command.get("description", "") if isinstance(command, dict) else ""
            if not _COMMAND_NAME.match(str(name)):
                raise _ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(desc)) <= 256:
                raise _ApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        self.commands[_scope_key(p.get("scope"))] = commands
        return True


# -- Telegram's HTML ------------------------------------------------------------------


class HtmlError(ValueError):
    """Text that Telegram's HTML parser refuses ("can't parse entities")."""


_TAGS = frozenset({"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code",
                   "pre", "span", "tg-spoiler", "tg-emoji", "blockquote"})
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[a-zA-Z-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'"
                  r"|[^\s>]+))*)\s*>")
_ENTITY = re.compile(r"&(#[0-9]{1,7}|#x[0-9a-fA-F]{1,6}|lt|gt|amp|quot);")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def parse_html(text: str) -> str:
    """The visible text of Telegram-HTML ``text``; :class:`HtmlError` where Telegram errs.

    Strict where Telegram is: unsupported tags, unbalanced or misnested tags,
    ``<a>`` without ``href``, a bare ``<``, ``>`` or ``&`` outside a tag or entity,
    and tags nested inside ``<code>``/``<pre>`` (only ``<pre><code class=...>``).
    """
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "<":
            match = _TAG.match(text, i)
            if match is None:
                raise HtmlError(f"Unexpected character '<' at byte offset {_bytes_at(text, i)}")
            closing, name, attrs = match.group(1) == "/", match.group(2).lower(), match.group(3)
            if name not in _TAGS:
                raise HtmlError(f'Unsupported start tag "{name}" at byte offset '
                                f"{_bytes_at(text, i)}")
            if closing:
                if not stack or stack[-1] != name:
                    raise HtmlError(f'Unexpected end tag at byte offset {_bytes_at(text, i)}')
                stack.pop()
            else:
                if stack and (stack[-1] == "code" or (stack[-1] == "pre" and name != "code")):
                    raise HtmlError(f'Entity "{name}" can\'t be nested in "{stack[-1]}"')
                if name == "a" and "href" not in attrs:
                    raise HtmlError("Can't find href in <a> tag")
                stack.append(name)
            i = match.end()
        elif ch == "&":
            match = _ENTITY.match(text, i)
            if match is None:
                raise HtmlError(f"Character '&' is reserved at byte offset "
                                f"{_bytes_at(text, i)}; use &amp;")
            ref = match.group(1)
            if ref in _NAMED:
                out.append(_NAMED[ref])
            else:
                out.append(chr(int(ref[2:], 16) if ref[1] == "x" else int(ref[1:])))
            i = match.end()
        elif ch == ">":
            raise HtmlError(f"Character '>' is reserved at byte offset {_bytes_at(text, i)}")
        else:
            out.append(ch)
            i += 1
    if stack:
        raise HtmlError(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


# -- helpers ------------------------------------------------------------------------------


def _scope_of(method: str, params: Mapping[str, Any]) -> str:
    """What a 429 on this call holds: its chat, ``getUpdates`` alone, or the whole bot."""
    if params.get("chat_id") not in (None, ""):
        return f"chat:{params['chat_id']}"
    if method.lower() == "getupdates":
        return "getupdates"
    return "bot"


def _drop(request: web.Request) -> None:
    """Close the connection without an answer (the client sees a disconnect)."""
    if request.transport is not None:
        request.transport.abort()
    # Ends the handler quietly: aiohttp takes a cancelled handler as a client gone.
    raise asyncio.CancelledError


def _public(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message without the fake's own bookkeeping keys."""
    return {k: v for k, v in message.items() if not k.startswith("_")}


def _bytes_at(text: str, index: int) -> int:
    return len(text[:index].encode())


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _now() -> int:
    return int(time.time())


def _require(p: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if p.get(name) in (None, ""):
            raise _ApiError(400, f"Bad Request: {name} is empty")


def _scope_key(scope: Any) -> str:
    if not isinstance(scope, dict) or scope.get("type", "default") == "default":
        return "default"
    if "chat_id" in scope:
        return f"{scope['type']}:{scope['chat_id']}"
    return str(scope["type"])


def _decode_value(key: str, value: str) -> Any:
    if key in _TEXT_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _decode(form: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _decode_value(k, v) if isinstance(v, str) else v for k, v in form.items()}


# -- pytest ---------------------------------------------------------------------------------

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the fake works without pytest installed
    pass
else:
    @pytest_asyncio.fixture(name="fake_telegram")
    async def fake_telegram() -> AsyncIterator[FakeTelegram]:
        """A started :class:`FakeTelegram`, stopped after the test.

        Named explicitly, so a test module can import it under another name
        (``from bot.testing.telegram import fake_telegram as _fixture``).
        """
        async with FakeTelegram() as fake:
            yield fake
