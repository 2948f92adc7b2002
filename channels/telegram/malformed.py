"""Updates Telegram cannot have sent as they are: malformed, undecodable, or with an
impossible id. Each is warned about once and skipped, confirmed when its id allows."""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any

from aiogram.types import Update
from pydantic import ValidationError

log = logging.getLogger("roost.channels.telegram")

REMEMBERED = 4096
"""Update ids remembered as warned about."""
UPDATE_ID = re.compile(r'"update_id"\s*:\s*(\d+)')
MAX_UPDATE_ID = 2_000_000_000
"""The highest update id the Bot API server gives (its queue's ``MAX_ID``). The server
reads ``offset`` as a 32-bit integer, so the offset after any real id still fits."""


class Reported:
    """Update ids already warned about: a batch fetched again (after the handler
    refused an earlier update) must not repeat the warning for a bad one."""

    def __init__(self) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict()

    def first(self, update_id: int) -> bool:
        """Whether ``update_id`` is warned about for the first time (it is noted now)."""
        if update_id in self._ids:
            return False
        self._ids[update_id] = None
        if len(self._ids) > REMEMBERED:
            self._ids.popitem(last=False)
        return True


def invalid(raw: Any, exc: ValidationError | RecursionError,
            reported: Reported | None) -> Update | None:
    """What becomes of an update that did not validate: an empty update with its
    ``update_id`` (so it is confirmed and skipped), or ``None`` without a usable id.

    With ``reported``, an update is warned about only the first time.
    """
    update_id = raw.get("update_id") if isinstance(raw, dict) else None
    if isinstance(exc, ValidationError) and exc.errors():
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "the update"
        why = f"{where}: {error['msg']}"
    else:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
    if isinstance(update_id, int) and not isinstance(update_id, bool):
        if not possible(update_id):
            impossible(update_id, reported)
            return None
        if reported is None or reported.first(update_id):
            log.warning("telegram: update %d is malformed (%s); skipped", update_id, why)
        return Update(update_id=update_id)
    log.warning("telegram: an update without a valid update_id was skipped (%s)", why)
    return None


def possible(update_id: int) -> bool:
    """Whether Telegram can have given ``update_id``."""
    return 0 < update_id <= MAX_UPDATE_ID


def impossible(update_id: int, reported: Reported | None) -> None:
    """Skip an update whose id Telegram cannot have given (from a broken or hostile server).

    It is not confirmed: the offset after it would be out of range, and the
    server reads an offset that is negative (or wraps to negative) as "forget
    every queued update". Polling pauses when such updates are all it gets.
    """
    if reported is None or reported.first(update_id):
        shown = str(update_id) if len(str(update_id)) <= 24 else f"{str(update_id)[:20]}..."
        log.warning("telegram: an update with the impossible id %s was skipped", shown)


def undecodable(text: str, reported: Reported, exc: Exception) -> Update | None:
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
    if not possible(update_id):
        impossible(update_id, reported)
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
