"""Where a reply goes, and the chat and message ids of the core's strings as Telegram's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """Where a reply goes: the chat, its forum topic, and the message it answers."""

    chat_id: int | str
    thread_id: int | None = None
    reply_to: int | None = None

    @classmethod
    def of(cls, chat_id: str, thread_id: str | None, reply_to: str | None) -> Target:
        return cls(chat_id_of(chat_id), int_or_none(thread_id), int_or_none(reply_to))

    def unthreaded(self) -> Target:
        """The same chat and topic, not replying: for the pieces after the first."""
        return Target(self.chat_id, self.thread_id)


def chat_id_of(chat_id: str) -> int | str:
    """A chat id as Telegram takes it: a number, or an ``@channel`` name as it is."""
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def int_or_none(value: str | None) -> int | None:
    """``value`` as a number, ``None`` when absent or not one."""
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
