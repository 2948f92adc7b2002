"""What the fake Messages API refuses the way the real one does: broken transcripts, bad media,
too many cache breakpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.testing._media import decode_base64, probe_image

# -- transcript validation ------------------------------------------------------


def transcript_error(body: Mapping[str, Any]) -> str | None:
    """What the real Messages API would reject in ``body``'s messages, or ``None``.

    The checks, with the API's own wording: a non-empty ``messages`` list;
    roles ``user`` and ``assistant`` only, the first one ``user``; no empty
    content (an empty string or list, or a text block without non-whitespace
    text, the final assistant message included); and, after consecutive
    messages of one role are merged as the API does, every ``tool_use`` answered
    by a ``tool_result`` with its id at the start of the very next message, and
    no ``tool_result`` without a ``tool_use`` in the message before.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    merged: list[tuple[int, str, list[Mapping[str, Any]]]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return f"messages.{i}: Input should be a valid dictionary"
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        blocks, problem = _content_blocks(i, message.get("content"))
        if problem is not None:
            return problem
        if merged and merged[-1][1] == role:
            merged[-1][2].extend(blocks)
        else:
            merged.append((i, role, blocks))
    if merged[0][1] != "user":
        return 'messages: first message must use the "user" role'
    for k, (i, role, blocks) in enumerate(merged):
        if role == "assistant":
            problem = _unanswered_tool_uses(
                i, blocks, merged[k + 1] if k + 1 < len(merged) else None
            )
        else:
            previous = merged[k - 1][2] if k > 0 else []
            problem = _orphan_tool_results(i, blocks, previous)
        if problem is not None:
            return problem
    return None


def _content_blocks(i: int, content: object) -> tuple[list[Mapping[str, Any]], str | None]:
    empty = f"messages.{i}: all messages must have non-empty content"
    if isinstance(content, str):
        if not content:
            return [], empty
        if not content.strip():
            return [], f"messages.{i}: text content blocks must contain non-whitespace text"
        return [{"type": "text", "text": content}], None
    if not isinstance(content, list) or not content:
        return [], empty
    blocks: list[Mapping[str, Any]] = []
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            return [], f"messages.{i}.content.{j}: Input should be a valid content block"
        if block["type"] == "text":
            text = block.get("text")
            if not isinstance(text, str) or not text:
                return [], f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            if not text.strip():
                return [], (
                    f"messages.{i}.content.{j}.text: "
                    "text content blocks must contain non-whitespace text"
                )
        blocks.append(block)
    return blocks, None


def _unanswered_tool_uses(
    i: int,
    blocks: Sequence[Mapping[str, Any]],
    following: tuple[int, str, list[Mapping[str, Any]]] | None,
) -> str | None:
    uses = [str(b.get("id")) for b in blocks if b["type"] == "tool_use"]
    if not uses:
        return None
    answered: set[str] = set()
    if following is not None:
        # Results must open the next message: text before them does not count.
        for block in following[2]:
            if block["type"] != "tool_result":
                break
            answered.add(str(block.get("tool_use_id")))
    missing = [u for u in uses if u not in answered]
    if not missing:
        return None
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message."
    )


def _orphan_tool_results(
    i: int, blocks: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]]
) -> str | None:
    uses = {str(b.get("id")) for b in previous if b["type"] == "tool_use"}
    for j, block in enumerate(blocks):
        if block["type"] == "tool_result" and str(block.get("tool_use_id")) not in uses:
            return (
                f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                "corresponding `tool_use` block in the previous message."
            )
    return None


# -- prompt caching ---------------------------------------------------------------

MAX_CACHE_BREAKPOINTS = 4
"""Blocks with ``cache_control`` one request may carry."""
CACHE_TTLS = ("5m", "1h")


def cache_control_error(body: Mapping[str, Any]) -> str | None:
    """What the real Messages API would reject in ``body``'s ``cache_control`` marks.

    Marks may sit on tools, system blocks, message content blocks and blocks
    inside a ``tool_result``; each must be ``{"type": "ephemeral"}`` with an
    optional ``ttl`` of ``5m`` or ``1h``, and there may be at most
    :data:`MAX_CACHE_BREAKPOINTS` of them (the API's wording).
    """
    found: list[tuple[str, Any]] = []

    def look(where: str, block: Any) -> None:
        if not isinstance(block, Mapping):
            return
        if "cache_control" in block:
            found.append((where, block["cache_control"]))
        inner = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(inner, list):
            for k, b in enumerate(inner):
                look(f"{where}.content.{k}", b)

    for i, tool in enumerate(body.get("tools") or ()):
        look(f"tools.{i}", tool)
    system = body.get("system")
    if isinstance(system, list):
        for i, block in enumerate(system):
            look(f"system.{i}", block)
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for j, block in enumerate(content):
                look(f"messages.{i}.content.{j}", block)
    for where, mark in found:
        if mark is None:
            continue
        if not isinstance(mark, Mapping) or mark.get("type") != "ephemeral":
            return f"{where}.cache_control.type: Input should be 'ephemeral'"
        if mark.get("ttl") is not None and mark.get("ttl") not in CACHE_TTLS:
            return f"{where}.cache_control.ttl: Input should be '5m' or '1h'"
    marks = sum(mark is not None for _, mark in found)
    if marks > MAX_CACHE_BREAKPOINTS:
        return (f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                f"provided. Found {marks}.")
    return None


# -- image and document validation ----------------------------------------------

IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
"""The image formats the Messages API takes."""
MAX_IMAGE_BASE64 = 5 * 1024 * 1024
"""The per-image limit; the API measures the base64 text, not the decoded bytes."""
MAX_IMAGE_EDGE = 8000
MAX_IMAGE_EDGE_MANY = 2000
"""The pixel limit per side, and the tighter one when a request has over 20 images."""
MANY_IMAGES = 20
MAX_IMAGES = 100


def media_error(body: Mapping[str, Any]) -> str | None:
    """What the real Messages API would reject in ``body``'s image and document blocks.

    With the API's own wording: an image's ``media_type`` one of JPEG, PNG, GIF,
    WebP; its data valid base64 of at most 5 MB (of base64 text), an image
    of the declared type, at most 8000 px a side (2000 px when the request
    holds over 20 images, at most 100 images in all); a base64 document's
    ``media_type`` ``application/pdf`` and its data a PDF. Blocks nested in a
    ``tool_result`` are checked too. Call after :func:`transcript_error`.
    """
    found: list[tuple[str, Mapping[str, Any]]] = []
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, Mapping):
                continue
            where = f"messages.{i}.content.{j}"
            found.append((where, block))
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list):
                found.extend((f"{where}.content.{k}", b) for k, b in enumerate(inner)
                             if isinstance(b, Mapping))
    images = sum(1 for _, block in found if block.get("type") == "image")
    if images > MAX_IMAGES:
        return f"messages: Too many images: {images} > {MAX_IMAGES}"
    edge = MAX_IMAGE_EDGE_MANY if images > MANY_IMAGES else MAX_IMAGE_EDGE
    for where, block in found:
        if block.get("type") == "image":
            problem = _image_problem(where, block.get("source"), edge)
        elif block.get("type") == "document":
            problem = _document_problem(where, block.get("source"))
        else:
            continue
        if problem is not None:
            return problem
    return None


def _image_problem(where: str, source: object, edge: int) -> str | None:
    if not isinstance(source, Mapping) or source.get("type") not in ("base64", "url", "file"):
        return f"{where}.image.source: Input tag does not match any of the expected tags: " \
            "'base64', 'url', 'file'"
    if source["type"] != "base64":
        return None
    at = f"{where}.image.source.base64"
    declared = source.get("media_type")
    if declared not in IMAGE_MEDIA_TYPES:
        return (f"{at}.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' "
                "or 'image/webp'")
    text = source.get("data")
    data = decode_base64(text)
    if data is None:
        return f"{at}: invalid base64 data"
    assert isinstance(text, str)
    if len(text) > MAX_IMAGE_BASE64:
        return f"{at}: image exceeds 5 MB maximum: {len(text)} bytes > {MAX_IMAGE_BASE64} bytes"
    probe = probe_image(data)
    if probe is None or not probe.mime_type:
        return f"{at}.data: Could not process image"
    if probe.mime_type != declared:
        return (f"{at}.data: The image was specified using the {declared} media type, but "
                f"the image appears to be a {probe.mime_type} image")
    if max(probe.width, probe.height) > edge:
        many = " for many-image requests" if edge == MAX_IMAGE_EDGE_MANY else ""
        return (f"{at}.data: At least one of the image dimensions exceed max allowed "
                f"size{many}: {edge} pixels")
    return None


def _document_problem(where: str, source: object) -> str | None:
    kinds = ("base64", "text", "content", "url", "file")
    if not isinstance(source, Mapping) or source.get("type") not in kinds:
        return f"{where}.document.source: Input tag does not match any of the expected tags: " \
            "'base64', 'text', 'content', 'url', 'file'"
    if source["type"] == "text":
        if source.get("media_type") != "text/plain":
            return f"{where}.document.source.text.media_type: Input should be 'text/plain'"
        return None
    if source["type"] != "base64":
        return None
    at = f"{where}.document.source.base64"
    if source.get("media_type") != "application/pdf":
        return f"{at}.media_type: Input should be 'application/pdf'"
    data = decode_base64(source.get("data"))
    if data is None:
        return f"{at}: invalid base64 data"
    if not data.startswith(b"%PDF-"):
        return f"{where}.pdf: The PDF specified was not valid."
    return None
