"""What the channel knows of each chat: where a group moved, its message ids, what
Roost's messages there show."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from channels.telegram.parsing import SEEN_UPDATES

KNOWN_IDS = 32
"""Message ids remembered per chat (a probe for a lost send's message skips them)."""
CHATS = 4096
"""Chats whose message ids are remembered (least recently used ones forgotten)."""


@dataclass(slots=True)
class ChatIds:
    """What is known of one chat's message ids, and its one creating call at a time."""

    top: int | None = None
    known: OrderedDict[int, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unresolved: bool = False
    """A probe here could not finish: a message of ours may be unknown above the top."""


class Chats:
    """Per chat: the supergroup a group became, its message ids (see
    :mod:`channels.telegram.outcomes`), and what each message Roost sent shows."""

    def __init__(self) -> None:
        self._migrated: dict[int | str, int] = {}
        self._ids: OrderedDict[int | str, ChatIds] = OrderedDict()
        # What each message Roost sent currently shows, as (text, parse_mode):
        # a final edit identical to the draft would be refused as "not modified".
        self._shown: OrderedDict[tuple[int | str, int], tuple[str, str | None]] = \
            OrderedDict()

    def moved(self, chat: object) -> int | None:
        """The supergroup ``chat`` became, ``None`` if it did not move."""
        return self._migrated.get(chat) if isinstance(chat, int | str) else None

    def follow(self, chat: int | str, to: int) -> None:
        """``chat`` became supergroup ``to``: calls go there from now on."""
        self._migrated[chat] = to

    def current(self, chat: int | str) -> int | str:
        """The chat ``chat`` is now (itself, or the supergroup it became)."""
        return self._migrated.get(chat, chat)

    def ids(self, chat: int | str) -> ChatIds:
        """The message ids known of ``chat`` (created on first use, least recent forgotten)."""
        key = self.current(chat)
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = ChatIds()
            oldest = next(iter(self._ids))
            if len(self._ids) > CHATS and not self._ids[oldest].lock.locked():
                del self._ids[oldest]
        else:
            self._ids.move_to_end(key)
        return ids

    def saw(self, chat: int | str, message_id: int) -> None:
        """Message ``message_id`` exists in ``chat`` (received, or posted by Roost)."""
        ids = self.ids(chat)
        if ids.top is None or message_id > ids.top:
            ids.top = message_id
        ids.known[message_id] = None
        if len(ids.known) > KNOWN_IDS:
            ids.known.popitem(last=False)

    def floor_note(self, chat: int | str) -> str | None:
        """What a reply's first platform call notes for a later redelivery: the chat's
        highest known message id (``None``: none known)."""
        top = self.ids(chat).top
        return None if top is None else str(top)

    def remember_shown(self, chat: int | str, message_id: int, text: str,
                       mode: str | None) -> None:
        """Message ``message_id`` of ``chat`` now shows ``text`` in parse mode ``mode``."""
        key = (self.current(chat), message_id)
        self._shown[key] = (text, mode)
        self._shown.move_to_end(key)
        if len(self._shown) > SEEN_UPDATES:
            self._shown.popitem(last=False)

    def shows(self, chat: int | str, message_id: int, text: str, mode: str | None) -> bool:
        """Whether the message is known to show exactly ``text`` in ``mode``."""
        return self._shown.get((self.current(chat), message_id)) == (text, mode)

    def forget_shown(self, chat: int | str, message_id: int) -> None:
        """The message is gone."""
        self._shown.pop((self.current(chat), message_id), None)
