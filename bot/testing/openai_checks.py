"""The checks the fake Chat Completions server refuses requests by, in OpenAI's wording.

:func:`transcript_error` (roles, tool calls answered in order) runs first, then
:func:`content_error` (content part types, images: where, how encoded, how large).
Each returns ``(message, param, code)`` for a 400 ``invalid_request_error``, or ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.testing._media import decode_base64, probe_image

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def transcript_error(body: Mapping[str, Any]) -> tuple[str, str, str | None] | None:
    """What OpenAI would reject in ``body``'s messages: ``(message, param, code)`` or ``None``.

    The checks, with OpenAI's own wording: a non-empty ``messages`` list; known
    roles; every assistant message with ``tool_calls`` followed directly by
    ``tool`` messages answering each call id; no ``tool`` message that does
    not answer a call of the assistant message before that run of tool messages.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return (
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
    pending: list[str] = []
    calls: set[str] = set()
    opened_at = 0
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in _ROLES:
            supported = "'system', 'assistant', 'user', 'tool', and 'function'"
            return (
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                f"messages[{i}].role",
                "invalid_value",
            )
        assert isinstance(message, Mapping)
        if role == "tool":
            call_id = str(message.get("tool_call_id"))
            if not calls:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                    None,
                )
            if call_id not in calls:
                return (
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                    None,
                )
            pending = [p for p in pending if p != call_id]
            continue
        if pending:
            return _unanswered(opened_at, pending)
        calls = set()
        if role == "assistant" and message.get("tool_calls"):
            pending = [str(c.get("id")) for c in message["tool_calls"] if isinstance(c, Mapping)]
            calls = set(pending)
            opened_at = i
    return _unanswered(opened_at, pending) if pending else None


def _unanswered(i: int, pending: Sequence[str]) -> tuple[str, str, str | None]:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(pending)}",
        f"messages.[{i}].role",
        None,
    )


# -- content parts ----------------------------------------------------------------

_PART_TYPES = ("text", "image_url", "input_audio", "refusal", "audio", "file")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""OpenAI's per-image limit (decoded bytes)."""
_UNSUPPORTED_IMAGE = (
    "You uploaded an unsupported image. Please make sure your image is below 20 MB in size "
    "and is of one the following formats: ['png', 'jpeg', 'gif', 'webp']."
)


def content_error(body: Mapping[str, Any]) -> tuple[str, str | None, str | None] | None:
    """What OpenAI would reject in the content parts of ``body``'s messages, or ``None``.

    ``(message, param, code)`` with OpenAI's wording: part types it knows;
    images only in user messages; an ``image_url`` that is ``http(s)`` or a
    ``data:image/...;base64,`` URL whose payload is valid base64 of a PNG,
    JPEG, GIF or WebP image of at most 20 MB. Call after :func:`transcript_error`.
    """
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in _PART_TYPES:
                supported = ", ".join(f"'{t}'" for t in _PART_TYPES[:-1])
                return (f"Invalid value: '{kind}'. Supported values are: {supported}, "
                        f"and '{_PART_TYPES[-1]}'.",
                        f"messages[{i}].content[{j}].type", "invalid_value")
            if kind != "image_url":
                continue
            assert isinstance(part, Mapping)
            role = message.get("role")
            if role != "user":
                return (f"Image URLs are only allowed for messages with role 'user', but this "
                        f"message with role '{role}' contains an image URL.",
                        f"messages[{i}].content[{j}].type", "invalid_value")
            problem = _image_url_problem(part.get("image_url"), f"messages[{i}].content[{j}]")
            if problem is not None:
                return problem
    return None


def _image_url_problem(image_url: object, where: str
                       ) -> tuple[str, str | None, str | None] | None:
    url = image_url.get("url") if isinstance(image_url, Mapping) else None
    if not isinstance(url, str):
        return (f"Missing required parameter: '{where}.image_url.url'.",
                f"{where}.image_url.url", "missing_required_parameter")
    if url.startswith(("http://", "https://")):
        return None
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        return (f"Invalid image URL: '{where}.image_url.url'. Expected a valid URL or a "
                "base64-encoded data URL with an image MIME type.",
                f"{where}.image_url.url", "invalid_value")
    if not head[5:].startswith("image/"):
        return ("Invalid MIME type. Only image types are supported.", None,
                "invalid_image_format")
    data = decode_base64(payload)
    if data is None:
        return (f"Invalid base64 image_url: '{where}.image_url.url'.",
                f"{where}.image_url.url", "invalid_value")
    probe = probe_image(data)
    if len(data) > MAX_IMAGE_BYTES or probe is None or not probe.mime_type:
        return (_UNSUPPORTED_IMAGE, None, "invalid_image_format")
    return None
