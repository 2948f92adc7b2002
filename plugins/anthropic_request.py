"""Roost's neutral request in the Messages API's words: messages, system, tools, cache marks.

Pure translation, no I/O but reading a message's files (through
:class:`roost.MediaReader`): :func:`to_anthropic_messages`
merges roles and turns parts into ``image``/``document`` blocks,
:func:`cache_breakpoints` places the (at most four) ``cache_control`` marks, and
:func:`with_note` puts the request's volatile note after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # the SDK's TypedDicts name the wire shapes; importing it is costly
    from anthropic.types import (
        CacheControlEphemeralParam,
        DocumentBlockParam,
        ImageBlockParam,
        MessageParam,
        TextBlockParam,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlockParam,
    )

# Built-in: the body is encoded as the provider's direct route sends it.
from plugins.anthropic_body import encode_json
from roost import (
    ANTHROPIC_MAX_PIXELS,
    ChatMessage,
    DocumentData,
    ImageData,
    MediaReader,
    Note,
    ToolSpec,
)

__all__ = [
    "MAX_CACHE_BREAKPOINTS",
    "Prefix",
    "cache_breakpoints",
    "mark_last",
    "mark_messages",
    "to_anthropic_messages",
    "to_anthropic_system",
    "to_anthropic_tools",
    "with_note",
]

if TYPE_CHECKING:
    _Block = (TextBlockParam | ToolUseBlockParam | ToolResultBlockParam | ImageBlockParam
              | DocumentBlockParam)

MAX_CACHE_BREAKPOINTS = 4
"""The Messages API refuses a request with more ``cache_control`` blocks (400)."""


def to_anthropic_messages(
    history: Sequence[ChatMessage], *, vision: bool = True, media: MediaReader | None = None
) -> list[MessageParam]:
    """Convert neutral history to Messages API ``messages``.

    Tool results become ``tool_result`` blocks in a user message, and
    consecutive messages of one role are merged, because the API requires
    strictly alternating roles. Within a user message tool results go first,
    as the API requires them right after the assistant's ``tool_use``.

    A message's parts become ``image`` and ``document`` blocks before its text
    (``media`` prepares them; a fresh reader without a cache if not given);
    with ``vision=False``, or for a file that is gone or unreadable, a text
    note takes the block's place. Reads files: call it off the event loop.
    """
    reader = media or MediaReader(documents=True, max_pixels=ANTHROPIC_MAX_PIXELS)
    merged: list[tuple[str, list[_Block]]] = []
    for message in history:
        role, blocks = _blocks_for(message, reader, vision)
        if not blocks:
            continue
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, blocks))
    result: list[MessageParam] = []
    for role, blocks in merged:
        if role == "user":
            blocks.sort(key=lambda b: b["type"] != "tool_result")
            result.append({"role": "user", "content": blocks})
        else:
            result.append({"role": "assistant", "content": blocks})
    return result


def _blocks_for(
    message: ChatMessage, media: MediaReader, vision: bool
) -> tuple[str, list[_Block]]:
    files = _part_blocks(message, media, vision)
    if message.role == "tool":
        result: ToolResultBlockParam = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content,
            "is_error": message.is_error,
        }
        if files:
            text: list[TextBlockParam] = (
                [{"type": "text", "text": message.content}] if message.content.strip() else [])
            inner = [b for b in files if b["type"] in ("text", "image", "document")]
            result["content"] = [*text, *inner]
        return "user", [result]
    blocks: list[_Block] = []
    if message.role == "user":
        # Images first: the API documents that models answer better that way.
        blocks.extend(files)
    else:
        blocks.extend(files)
    # The API rejects text blocks without non-whitespace text, and models do
    # write a bare "\n\n" before a tool call: such text carries nothing.
    if message.content.strip():
        blocks.append({"type": "text", "text": message.content})
    if message.role == "assistant":
        for call in message.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": dict(call.arguments),
                }
            )
    return message.role, blocks


def _part_blocks(message: ChatMessage, media: MediaReader, vision: bool) -> list[_Block]:
    """The image/document blocks and notes for ``message``'s parts."""
    if not message.parts:
        return []
    if message.role == "assistant":
        # The API takes no files from the assistant; say what there was.
        return [{"type": "text", "text": f"[{p.kind}: {p.path}]"} for p in message.parts]
    blocks: list[_Block] = []
    for item in media.read_all(message.parts, vision=vision):
        if isinstance(item, ImageData):
            image: ImageBlockParam = {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": item.mime_type,  # type: ignore[typeddict-item]
                    "data": item.data,  # Base64Text: the body takes it as it is
                },
            }
            blocks.append(image)
        elif isinstance(item, DocumentData):
            document: DocumentBlockParam = {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": item.data},
            }
            blocks.append(document)
        elif isinstance(item, Note):
            blocks.append({"type": "text", "text": item.text})
    return blocks


def to_anthropic_system(system: str) -> list[TextBlockParam]:
    """The system prompt as text blocks (a list, so it can carry a cache breakpoint)."""
    return [{"type": "text", "text": system}] if system.strip() else []


def cache_breakpoints(tools: list[ToolParam], system: list[TextBlockParam],
                      messages: list[MessageParam]) -> int:
    """Mark where the prompt cache is written and read; returns how many marks were set.

    The cache key of a mark is the exact prefix tools → system → messages up to
    and including the marked block. Marked: the last tool (shared by every chat of
    the agent), the last system block, the last block of the previous request's
    final message (the user message before the latest assistant turn: the prefix
    the previous request wrote) and the last block of the final message (what the
    next request reads). Never more than :data:`MAX_CACHE_BREAKPOINTS`.
    """
    return mark_last(tools) + mark_last(system) + mark_messages(messages)


def mark_last(blocks: list[ToolParam] | list[TextBlockParam]) -> int:
    """Mark the last of ``blocks`` (the tools, or the system prompt); returns the marks set."""
    if not blocks:
        return 0
    ephemeral: CacheControlEphemeralParam = {"type": "ephemeral"}
    cast(dict[str, object], blocks[-1])["cache_control"] = ephemeral
    return 1


def mark_messages(messages: list[MessageParam]) -> int:
    """Mark the last block of the last two user messages (see :func:`cache_breakpoints`).

    With the tools and the system prompt marked that makes four, the most the API
    takes, so these two never need to give way.
    """
    users = [m for m in messages if m["role"] == "user" and isinstance(m["content"], list)]
    ephemeral: CacheControlEphemeralParam = {"type": "ephemeral"}
    marked = 0
    for message in users[-2:]:
        blocks = cast(list[dict[str, object]], message["content"])
        if blocks:
            blocks[-1]["cache_control"] = ephemeral
            marked += 1
    return marked


class Prefix:
    """The tools and system prompt of an agent's requests, built and encoded once.

    They are the same for every call of the agent (until plugins or its prompt
    change), and encoding them is most of the JSON work of a short turn.
    """

    __slots__ = ("_entries",)

    SIZE = 16
    """Entries kept (a few agents, with and without cache marks)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str, bool], tuple[object, list[ToolParam],
                                                        list[TextBlockParam], tuple[str, str]]] = {}

    def get(self, specs: Sequence[ToolSpec], system: str, marked: bool
            ) -> tuple[list[ToolParam], list[TextBlockParam], tuple[str, str]]:
        """``(tools, system blocks, (system JSON, tools JSON))``, marked for the cache if asked.

        ``specs`` is recognised by identity (the plugin snapshot's tuple), so a
        changed tool set is built afresh. The lists must not be changed.
        """
        key = (id(specs), system, marked)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is specs:
            return entry[1], entry[2], entry[3]
        tools = to_anthropic_tools(specs)
        blocks = to_anthropic_system(system)
        if marked:
            mark_last(tools)
            mark_last(blocks)
        encoded = (encode_json(blocks) if blocks else "", encode_json(tools) if tools else "")
        if len(self._entries) >= self.SIZE:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (specs, tools, blocks, encoded)
        return tools, blocks, encoded


def with_note(messages: list[MessageParam], note: str) -> None:
    """Append the request's volatile ``note`` after the final message's cached blocks."""
    if not note.strip():
        return
    block: TextBlockParam = {"type": "text", "text": note}
    if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
        cast("list[_Block]", messages[-1]["content"]).append(block)
    else:
        messages.append({"role": "user", "content": [block]})


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[ToolParam]:
    """Convert tool specs to the Messages API ``tools`` parameter."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": cast(dict[str, object], dict(tool.input_schema)),
        }
        for tool in tools
    ]
