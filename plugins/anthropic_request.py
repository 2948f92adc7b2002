"""Roost's neutral request in the Messages API's words: messages, system, tools, cache marks.

Pure translation, no I/O but reading a message's files (through
:class:`~plugins.provider_media.MediaReader`): :func:`to_anthropic_messages`
merges roles and turns parts into ``image``/``document`` blocks,
:func:`cache_breakpoints` places the (at most four) ``cache_control`` marks, and
:func:`with_note` puts the request's volatile note after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # the SDK's TypedDicts name the wire shapes; importing it costs ~45 MiB
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

# Built-in: images and PDFs are prepared by the providers' shared media reader.
from plugins.provider_media import (
    ANTHROPIC_MAX_PIXELS,
    DocumentData,
    ImageData,
    MediaReader,
    Note,
)
from roost import ChatMessage, ToolSpec

__all__ = [
    "MAX_CACHE_BREAKPOINTS",
    "cache_breakpoints",
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
                    "data": item.data,
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
    marks: list[dict[str, object]] = []
    if tools:
        marks.append(cast(dict[str, object], tools[-1]))
    if system:
        marks.append(cast(dict[str, object], system[-1]))
    users = [m for m in messages if m["role"] == "user" and isinstance(m["content"], list)]
    for message in users[-2:]:
        blocks = cast(list[dict[str, object]], message["content"])
        if blocks:
            marks.append(blocks[-1])
    marks = marks[-MAX_CACHE_BREAKPOINTS:] if len(marks) > MAX_CACHE_BREAKPOINTS else marks
    ephemeral: CacheControlEphemeralParam = {"type": "ephemeral"}
    for block in marks:
        block["cache_control"] = ephemeral
    return len(marks)


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
