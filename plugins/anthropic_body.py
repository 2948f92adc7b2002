"""The Messages API request body's JSON, with images' and documents' base64 spliced in.

:func:`encode_json` writes JSON as the SDK sends it; :func:`encode_messages` writes the
``messages`` array in pieces with each :class:`roost.Base64Text`
copied in as it is, which the JSON encoder would otherwise scan character by character.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from roost import Base64Text

__all__ = ["encode_json", "encode_messages"]


def _jsonable(value: object) -> object:
    """What the C encoder cannot take itself: mappings and sequences of other types."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                               default=_jsonable).encode
"""JSON as the SDK sends it (compact, UTF-8 text, no NaN)."""


def encode_messages(messages: list[Any]) -> list[bytes]:
    """``messages`` as compact UTF-8 JSON (as :func:`encode_json` writes them), in
    pieces to join, with every :class:`roost.Base64Text` source of a
    block (an image or a document, also inside a ``tool_result``) spliced in as it is.

    The encoder scans a string character by character and, once any character of the
    body is past Latin-1 (a dash in the system prompt), has it widened to two bytes per
    character and encoded back to UTF-8 with the rest; a base64 source spliced in
    skips all of that (bench/README.md has the figures).
    """
    payloads: list[str] = []
    # Where each payload goes: a name no text of the request can hold, as it is made
    # after the request was (a random part), escaped by the encoder like any string.
    marker = f"\x00{secrets.token_hex(8)}:"
    swapped = [_swap_message(message, payloads, marker) for message in messages]
    if not payloads:
        return [encode_json(messages).encode()]
    text = encode_json(swapped)
    pieces: list[bytes] = []
    start = 0
    for index, payload in enumerate(payloads):
        token = encode_json(f"{marker}{index}")
        at = text.find(token, start)
        if at < 0:  # cannot happen: the encoder wrote every marker, in order
            return [encode_json(messages).encode()]
        pieces += (text[start:at].encode(), b'"', payload.encode("ascii"), b'"')
        start = at + len(token)
    pieces.append(text[start:].encode())
    return pieces


def _swap_message(message: Any, payloads: list[str], marker: str) -> Any:
    """``message`` with a marker in place of each :class:`Base64Text` of its blocks
    (copies of what changes; the caller's dicts stay as they are)."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    blocks = _swap_blocks(content, payloads, marker)
    return message if blocks is content else {**message, "content": blocks}


def _swap_blocks(blocks: list[Any], payloads: list[str], marker: str) -> list[Any]:
    swapped: list[Any] | None = None
    for index, block in enumerate(blocks):
        new = block
        if isinstance(block, dict):
            source = block.get("source")
            inner = block.get("content")
            if isinstance(source, dict) and isinstance(source.get("data"), Base64Text):
                payloads.append(source["data"])
                new = {**block, "source": {**source, "data": f"{marker}{len(payloads) - 1}"}}
            elif isinstance(inner, list):
                blocks_inside = _swap_blocks(inner, payloads, marker)
                if blocks_inside is not inner:
                    new = {**block, "content": blocks_inside}
        if new is not block:
            if swapped is None:
                swapped = list(blocks)
            swapped[index] = new
    return blocks if swapped is None else swapped
