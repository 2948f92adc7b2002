"""Prompt caching as the Messages API documents it, for the fake (:mod:`bot.testing.anthropic`).

A block carrying ``cache_control`` is a breakpoint. The cache key of a
breakpoint is the exact prefix of the request up to and including that block,
in the order tools → system → messages (and the model: caches are per model).
On each request:

* Every breakpoint looks for the longest cached prefix ending at its own block
  or at one of the 20 block boundaries before it (the documented lookback);
  the longest hit among all breakpoints is read (``cache_read_input_tokens``)
  and its entry's 5-minute lifetime starts again.
* Each breakpoint after the hit whose prefix reaches the model's minimum
  cacheable length (1024 tokens; 2048 for Haiku-class models) is written
  (``cache_creation_input_tokens``: the tokens from the hit to the last written
  breakpoint). A shorter prompt is simply not cached: no write, no error.
* ``input_tokens`` counts what is left: the tokens after the last hit or write.

The 4-breakpoint limit is checked with the other request checks
(:func:`bot.testing.anthropic_checks.cache_control_error`). Tokens are
estimated, not tokenized (:func:`block_tokens`). The clock is injectable so
tests can expire entries without sleeping.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHARS_PER_TOKEN",
    "LOOKBACK_BLOCKS",
    "MEDIA_TOKENS",
    "CacheUsage",
    "PromptCache",
    "block_tokens",
    "min_cacheable_tokens",
    "prompt_blocks",
]

CHARS_PER_TOKEN = 4
"""The fake's token estimate: characters of a block's JSON per token."""
MEDIA_TOKENS = 1_500
"""What an image or a PDF block counts as, whatever the size of its base64 text."""
LOOKBACK_BLOCKS = 20
"""Block boundaries before a breakpoint that are checked for a cached prefix."""
TTLS = {"5m": 300.0, "1h": 3600.0}
"""``cache_control.ttl`` values and their lifetimes; ``5m`` is the default."""


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches: 2048 tokens for Haiku-class models, else 1024."""
    return 2048 if "haiku" in model.lower() else 1024


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _without_marks(block: Any) -> Any:
    """``block`` without its ``cache_control`` (a marker is not content)."""
    if isinstance(block, Mapping):
        return {k: _without_marks(v) for k, v in block.items() if k != "cache_control"}
    if isinstance(block, list):
        return [_without_marks(v) for v in block]
    return block


def _is_media(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") in ("image", "document")


def block_tokens(block: Any) -> int:
    """The fake's token estimate for one block: its JSON at :data:`CHARS_PER_TOKEN`
    characters a token, images and documents at :data:`MEDIA_TOKENS` each."""
    media = 0

    def strip(value: Any) -> Any:
        nonlocal media
        if _is_media(value):
            media += 1
            return None
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = _canonical(strip(block))
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) + media * MEDIA_TOKENS


@dataclass(frozen=True, slots=True)
class _Block:
    key: str
    """The hash of the whole prefix through this block."""
    tokens: int
    """Tokens of the prefix through this block."""
    ttl: float | None
    """The lifetime this block's ``cache_control`` asks for; ``None``: not a breakpoint."""


def prompt_blocks(body: Mapping[str, Any]) -> list[tuple[Any, str | None]]:
    """The request's blocks in cache order (tools, system, messages) with each
    block's ``cache_control.ttl`` (``"5m"`` when marked without one), ``None`` if unmarked.

    A string ``system`` or message ``content`` is one text block.
    """
    found: list[tuple[Any, str | None]] = []

    def add(where: str, block: Any) -> None:
        mark = block.get("cache_control") if isinstance(block, Mapping) else None
        ttl = str(mark.get("ttl") or "5m") if isinstance(mark, Mapping) else None
        found.append(([where, _without_marks(block)], ttl))

    for tool in body.get("tools") or ():
        add("tool", tool)
    system = body.get("system")
    if isinstance(system, str) and system:
        add("system", {"type": "text", "text": system})
    elif isinstance(system, list):
        for block in system:
            add("system", block)
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, Mapping):
            continue
        where = f"{i}:{message.get('role')}"
        content = message.get("content")
        if isinstance(content, str):
            add(where, {"type": "text", "text": content})
        elif isinstance(content, list):
            for block in content:
                add(where, block)
    return found


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """How one request's input tokens split: read, written, and neither."""

    read: int
    written: int
    uncached: int

    @property
    def total(self) -> int:
        """Every input token of the request."""
        return self.read + self.written + self.uncached


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float


@dataclass(slots=True)
class PromptCache:
    """The fake's prompt cache: prefix keys and when each expires.

    ``clock`` (seconds, :func:`time.monotonic` by default) decides expiry; a test
    passes its own to move time forward without sleeping.
    """

    clock: Callable[[], float] = time.monotonic
    entries: dict[str, _Entry] = field(default_factory=dict)
    """Cached prefix keys with their expiry (clock time) and lifetime."""
    min_tokens: int | None = None
    """The minimum cacheable length for every model; ``None``: by model
    (:func:`min_cacheable_tokens`)."""

    def clear(self) -> None:
        """Forget every entry (as if they had all expired)."""
        self.entries.clear()

    def estimate(self, body: Mapping[str, Any]) -> int:
        """Every input token of the request, by the estimate; nothing is read or written."""
        return sum(block_tokens(block[1]) for block, _ in prompt_blocks(body))

    def account(self, body: Mapping[str, Any]) -> CacheUsage:
        """Look the request's breakpoints up, write what is new; the token split."""
        now = self.clock()
        for key in [k for k, e in self.entries.items() if e.expires <= now]:
            del self.entries[key]
        blocks = self._blocks(body)
        total = blocks[-1].tokens if blocks else 0
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None]
        hit = -1
        for mark in marks:
            for i in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                if blocks[i].key in self.entries:
                    hit = max(hit, i)
                    break
        read = 0
        if hit >= 0:
            read = blocks[hit].tokens
            entry = self.entries[blocks[hit].key]
            entry.expires = now + entry.ttl  # a read starts the lifetime again
        minimum = self.min_tokens if self.min_tokens is not None else \
            min_cacheable_tokens(str(body.get("model", "")))
        last_written = hit
        for mark in marks:
            block = blocks[mark]
            if mark > hit and block.tokens >= minimum and block.ttl is not None:
                self.entries[block.key] = _Entry(now + block.ttl, block.ttl)
                last_written = mark
        written = blocks[last_written].tokens - read if last_written > hit else 0
        return CacheUsage(read, written, total - read - written)

    def _blocks(self, body: Mapping[str, Any]) -> list[_Block]:
        digest = hashlib.sha256(_canonical(body.get("model", "")).encode())
        tokens = 0
        out: list[_Block] = []
        for block, ttl in prompt_blocks(body):
            digest.update(_canonical(block).encode())
            tokens += block_tokens(block[1])
            out.append(_Block(digest.copy().hexdigest(), tokens,
                              TTLS.get(ttl, TTLS["5m"]) if ttl is not None else None))
        return out
