"""How a chat message is stored: a ``messages`` row and back, its content parts as JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from bot.contracts.llm import ChatMessage, ContentPart, ToolCall


def message_row(session_id: int, run_id: str, m: ChatMessage) -> tuple[Any, ...]:
    """The ``messages`` row of ``m``, in the order of the columns the session store inserts."""
    calls = (
        json.dumps([{"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
                    for c in m.tool_calls])
        if m.tool_calls else None
    )
    return (session_id, run_id, m.role, m.content, m.sender_id, m.sender_name, calls,
            m.tool_call_id, m.tool_name, int(m.is_error), m.created_at, encode_parts(m.parts))


def row_message(r: Any) -> ChatMessage:
    """The message of a ``messages`` row read back (role through parts)."""
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in json.loads(r[4])) \
        if r[4] else ()
    return ChatMessage(
        role=r[0], content=r[1], sender_id=r[2], sender_name=r[3], tool_calls=calls,
        tool_call_id=r[5], tool_name=r[6], is_error=bool(r[7]), created_at=r[8],
        parts=decode_parts(r[9]),
    )


_PART_FIELDS = frozenset(f.name for f in dataclasses.fields(ContentPart))


def encode_parts(parts: Sequence[ContentPart]) -> str | None:
    """A message's parts as JSON references (path, type, size...), ``None`` for none."""
    if not parts:
        return None
    return json.dumps([dataclasses.asdict(p) for p in parts], ensure_ascii=False)


def decode_parts(text: str | None) -> tuple[ContentPart, ...]:
    """The inverse of :func:`encode_parts`; fields a newer Roost added are ignored."""
    if not text:
        return ()
    return tuple(ContentPart(**{k: v for k, v in item.items() if k in _PART_FIELDS})
                 for item in json.loads(text))
