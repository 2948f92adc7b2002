"""Receiving: updates parsed one by one, so a malformed one cannot wedge the others."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import urlencode

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.methods import (
    DeleteMessage,
    DeleteWebhook,
    EditMessageText,
    GetFile,
    GetMe,
    GetUpdates,
    SendChatAction,
    SendDocument,
    SendMessage,
    SendPhoto,
    SetMyCommands,
    SetWebhook,
    TelegramMethod,
)
from aiogram.methods.base import Response, TelegramType
from aiogram.types import InputFile, Update
from aiohttp.payload import BytesPayload
from pydantic import ValidationError

log = logging.getLogger("roost.channels.telegram")

SEEN_UPDATES = 4096
"""Recent update ids remembered to drop redeliveries early (the inbox dedupes for real)."""
UPDATE_ID = re.compile(r'"update_id"\s*:\s*(\d+)')


class _Reported:
    """Update ids already warned about: a batch fetched again (after the handler
    refused an earlier update) must not repeat the warning for a bad one."""

    def __init__(self) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict()

    def first(self, update_id: int) -> bool:
        if update_id in self._ids:
            return False
        self._ids[update_id] = None
        if len(self._ids) > SEEN_UPDATES:
            self._ids.popitem(last=False)
        return True


def parse_update(raw: Any, bot: Bot, reported: _Reported | None = None) -> Update | None:
    """``raw`` as an :class:`Update`; a malformed one is logged and becomes an empty one.

    The empty update keeps its ``update_id``, so polling still confirms it
    (otherwise the server would send it again forever); one without a usable
    id cannot be confirmed and is dropped. With ``reported``, an update is
    warned about only the first time.
    """
    try:
        update = Update.model_validate(raw, context={"bot": bot})
    except (ValidationError, RecursionError) as exc:
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if isinstance(exc, ValidationError) and exc.errors():
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "the update"
            why = f"{where}: {error['msg']}"
        else:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            if not _possible(update_id):
                _impossible(update_id, reported)
                return None
            if reported is None or reported.first(update_id):
                log.warning("telegram: update %d is malformed (%s); skipped", update_id, why)
            return Update(update_id=update_id)
        log.warning("telegram: an update without a valid update_id was skipped (%s)", why)
        return None
    if not _possible(update.update_id):
        _impossible(update.update_id, reported)
        return None
    return update


MAX_UPDATE_ID = 2_000_000_000
"""The highest update id the Bot API server gives (its queue's ``MAX_ID``). The server
reads ``offset`` as a 32-bit integer, so the offset after any real id still fits."""


def _possible(update_id: int) -> bool:
    return 0 < update_id <= MAX_UPDATE_ID


def _impossible(update_id: int, reported: _Reported | None) -> None:
    """Skip an update whose id Telegram cannot have given (from a broken or hostile server).

    It is not confirmed: the offset after it would be out of range, and the
    server reads an offset that is negative (or wraps to negative) as "forget
    every queued update". Polling pauses when such updates are all it gets.
    """
    if reported is None or reported.first(update_id):
        shown = str(update_id) if len(str(update_id)) <= 24 else f"{str(update_id)[:20]}..."
        log.warning("telegram: an update with the impossible id %s was skipped", shown)


def _undecodable(text: str, reported: _Reported, exc: Exception) -> Update | None:
    """An update whose JSON cannot be decoded (nested beyond the decoder's depth, a
    number longer than Python converts).

    Its ``update_id`` is read with a pattern so it can still be confirmed.
    """
    why = "nested too deeply" if isinstance(exc, RecursionError) else \
        str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    found = UPDATE_ID.search(text)
    if found is None:
        log.warning("telegram: an undecodable update without an update_id was skipped (%s)",
                    why)
        return None
    # A prefix: int() refuses thousands of digits, and any such id is impossible anyway.
    update_id = int(found.group(1)[:40])
    if not _possible(update_id):
        _impossible(update_id, reported)
        return None
    if reported.first(update_id):
        log.warning("telegram: update %d is not decodable (%s); skipped", update_id, why)
    return Update(update_id=update_id)


def _string_end(text: str, start: int) -> int:
    """The index after the JSON string opening at ``start`` (-1: never closed)."""
    at = start + 1
    while True:
        quote = text.find('"', at)
        if quote < 0:
            return -1
        slashes = 0
        while text[quote - 1 - slashes] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return quote + 1
        at = quote + 1


def result_elements(text: str) -> list[str] | None:
    """The raw text of each element of the top-level ``"result"`` array of ``text``.

    An iterative scan (strings, escapes, bracket depth) that needs no
    recursion, so it splits a response that ``json.loads`` cannot decode
    because one element nests too deeply; each element is then decoded on
    its own. ``None`` when there is no such array or the text is cut short.
    """
    depth = 0
    key: str | None = None
    at, end = 0, len(text)
    array_start = -1
    while at < end:
        char = text[at]
        if char == '"':
            close = _string_end(text, at)
            if close < 0:
                return None
            if depth == 1:
                key = text[at:close]
            at = close
            continue
        if char in "[{":
            if depth == 1 and char == "[" and key == '"result"':
                array_start = at
                break
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 1:
            key = None
        at += 1
    if array_start < 0:
        return None
    elements: list[str] = []
    depth = 0
    begin = array_start + 1
    at = array_start
    while at < end:
        char = text[at]
        if char == '"':
            close = _string_end(text, at)
            if close < 0:
                return None
            at = close
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                last = text[begin:at].strip()
                if last:
                    elements.append(last)
                return elements
        elif char == "," and depth == 1:
            elements.append(text[begin:at].strip())
            begin = at + 1
        at += 1
    return None


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

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reported = _Reported()
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
        if isinstance(method, _BUILT):
            with _BUILDING:  # being built in the background: wait rather than build twice
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
                    update = _undecodable(element, self.reported, exc)
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


def update_kind(update: Update) -> str:
    """The name of what ``update`` carries (``callback_query``, ``my_chat_member``...)."""
    for name in type(update).model_fields:
        if name != "update_id" and getattr(update, name, None) is not None:
            return name
    extra = update.model_extra
    # A kind newer than this aiogram: the server's field name, kept as an extra.
    return next(iter(extra), "empty update") if extra else "empty update"


_RESPONSE_MODELS: list[Any] = []


def keep_response_models() -> None:
    """Build the ``Response[...]`` model of each method Roost calls once, and keep it.

    aiogram parametrizes ``Response[method.__returning__]`` on every call, and
    pydantic caches parametrized models only weakly: each time the garbage
    collector takes one, the next call builds it again (once per reply for a
    ``Message``). Holding them makes the cache hit.
    """
    if _RESPONSE_MODELS:
        return
    methods: tuple[Any, ...] = (GetMe, GetUpdates, SendMessage, EditMessageText,
                                DeleteMessage, SendChatAction, SetMyCommands, SetWebhook,
                                DeleteWebhook, GetFile, SendPhoto, SendDocument)
    generic: Any = Response
    _RESPONSE_MODELS.extend(generic[m.__returning__] for m in methods)


_BUILT = (GetUpdates, SendMessage, EditMessageText, SendPhoto, SendDocument)
"""Methods whose answers need the validators :func:`build_validators` builds (``Update``,
``Message``); the others answer ``True`` or small types."""
_BUILDING = threading.Lock()
"""Held while :func:`build_validators` runs."""


def build_validators() -> None:
    """Build the validators of the types and methods Roost uses now (in a thread).

    aiogram's types are built on first use (:mod:`channels.telegram_lazy`):
    left to the first update, ``Update``, ``Message`` and the responses of the
    methods a reply calls would be built inside that update's answer. The
    channel runs this in a thread once polling has begun; a response parsed
    meanwhile waits for it (``TolerantSession.check_response``) instead of building
    the same schemas a second time.
    """
    began = time.perf_counter()
    with _BUILDING:
        keep_response_models()
        for model in (Update, SendMessage, EditMessageText, DeleteMessage, SendChatAction,
                      *_RESPONSE_MODELS):
            model.model_rebuild()
    log.debug("telegram: validators built in %.2fs", time.perf_counter() - began)
