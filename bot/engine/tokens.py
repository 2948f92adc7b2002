"""Token estimates for budgeting, calibrated by what providers actually count.

Method: tokens ≈ characters / ratio, plus a fixed overhead per message and per
tool call. The ratio starts at a per-provider default (Claude ≈ 3.5 characters
per token on English chat, GPT-family BPEs ≈ 4) and is then calibrated from
every response's real ``usage.input_tokens`` against the characters of the
request that produced it (an exponentially weighted average), so an estimator
converges to whatever tokenizer the model behind the provider uses. See
``bench/bench_context.py`` for its measured error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from bot.contracts.llm import ChatMessage, ContentPart, LLMRequest, ToolSpec
from bot.media.images import image_tokens

DEFAULT_RATIOS = {"anthropic": 3.5, "openai": 4.0}
DEFAULT_RATIO = 4.0
NON_LATIN_CHARS_PER_TOKEN = 1.5
_DENSE = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]")
"""CJK ideographs, kana and Hangul: about one token per character."""
_NON_LATIN = re.compile(r"[\u0370-\u03ff\u0400-\u052f\u0590-\u06ff\u0900-\u0dff\u0e00-\u0e7f]")
"""Greek, Cyrillic, Hebrew, Arabic, Indic scripts and Thai."""
MESSAGE_OVERHEAD = 4
TOOL_CALL_OVERHEAD = 8
DOCUMENT_PAGE_TOKENS = 2_000
"""A PDF page as a model reads it (its text and an image of it): Anthropic counts
1,500-3,000 tokens per page."""
_MIN_RATIO, _MAX_RATIO = 1.0, 8.0
_MEMO_MIN_CHARS = 512
_MEMO_SIZE = 64
_script_counts: dict[str, tuple[int, int]] = {}
"""Dense and other non-Latin characters of recent long non-ASCII texts (emptied when full)."""


def _count_scripts(text: str) -> tuple[int, int]:
    return len(_DENSE.findall(text)), len(_NON_LATIN.findall(text))
_SMOOTHING = 0.2


class TokenEstimator:
    """Estimates tokens for one provider; ``calibrate`` keeps it honest."""

    def __init__(self, provider: str = "", ratio: float | None = None) -> None:
        self.ratio = ratio or DEFAULT_RATIOS.get(provider, DEFAULT_RATIO)
        self.samples = 0

    def text(self, text: str) -> int:
        """Tokens in a piece of text."""
        return int(self.weight(text) / self.ratio) + 1 if text else 0

    def weight(self, text: str) -> float:
        """``text``'s length in English-equivalent characters.

        BPE vocabularies split other scripts far finer than English: about a
        token per CJK character and one per 1-2 letters of Cyrillic, Arabic,
        Hebrew or Devanagari. At the English ratio those would be
        underestimated and overflow the window (bench/bench_context.py measures it).
        """
        if text.isascii():  # the common case, and O(1) to check
            return len(text)
        long = len(text) >= _MEMO_MIN_CHARS
        if long:
            # The system prompt (ROM) and the Kernel come back every run (and several
            # times in one): one dash in them sent kilobytes through two regexes.
            counts = _script_counts.get(text)
            if counts is None:
                counts = _count_scripts(text)
                if len(_script_counts) >= _MEMO_SIZE:
                    _script_counts.clear()
                _script_counts[text] = counts
        else:
            counts = _count_scripts(text)
        dense, other = counts
        return len(text) - dense - other + (dense + other / NON_LATIN_CHARS_PER_TOKEN) * self.ratio

    def message(self, message: ChatMessage) -> int:
        """Tokens one history message costs, tool calls and images included."""
        return (MESSAGE_OVERHEAD + int(self.message_weight(message) / self.ratio) + 1
                + (parts_tokens(message.parts) if message.parts else 0))

    def message_weight(self, message: ChatMessage) -> float:
        """A message's size in English-equivalent characters, computed once per message.

        The weight does not depend on the calibrated ratio, so it is cached on the
        message: every run re-estimates the whole history several times.
        """
        if message.weight < 0:
            weight = self.weight(message.content)
            for call in message.tool_calls:
                weight += (TOOL_CALL_OVERHEAD * DEFAULT_RATIO + len(call.name)
                           + self.weight(json.dumps(call.arguments, ensure_ascii=False,
                                                    default=str)))
            message.weight = weight
        return message.weight

    def messages(self, messages: Iterable[ChatMessage]) -> int:
        """Tokens of a list of messages (the same sum as ``message`` over each)."""
        # Whole histories go through here several times per run: cached weights
        # are read inline instead of through two calls per message.
        ratio, total, count = self.ratio, 0, 0
        for m in messages:
            weight = m.weight if m.weight >= 0 else self.message_weight(m)
            total += int(weight / ratio)
            if m.parts:
                total += parts_tokens(m.parts)
            count += 1
        return total + count * (MESSAGE_OVERHEAD + 1)

    def request_chars(self, request: LLMRequest) -> float:
        """English-equivalent characters of a request: system, messages, note, tool schemas."""
        chars = self.weight(request.system) + (self.weight(request.note) if request.note else 0)
        for m in request.messages:
            chars += m.weight if m.weight >= 0 else self.message_weight(m)
        return chars + len(request.messages) * MESSAGE_OVERHEAD * self.ratio \
            + tools_chars(request.tools)

    def request(self, request: LLMRequest) -> int:
        """Tokens of a whole request, images and documents included."""
        return int(self.request_chars(request) / self.ratio) + 1 + request_parts_tokens(request)

    def calibrate(self, request: LLMRequest, actual_input_tokens: int) -> None:
        """Move the ratio toward what the provider reported for ``request``."""
        # Images are counted by their own rule, not by characters: only the text's
        # share of the reported tokens says something about the ratio.
        actual_input_tokens -= request_parts_tokens(request)
        if actual_input_tokens <= 0:
            return
        observed = self.request_chars(request) / actual_input_tokens
        observed = min(_MAX_RATIO, max(_MIN_RATIO, observed))
        self.ratio += _SMOOTHING * (observed - self.ratio)
        self.samples += 1


def parts_tokens(parts: Iterable[ContentPart]) -> int:
    """What files cost a request: an image width × height / 750 (as sent, long edge at
    most 1568 px), a document :data:`DOCUMENT_PAGE_TOKENS` per page."""
    total = 0
    for part in parts:
        if part.kind == "image":
            total += image_tokens(part.width, part.height)
        elif part.kind == "document":
            total += DOCUMENT_PAGE_TOKENS * max(1, part.pages)
    return total


def request_parts_tokens(request: LLMRequest) -> int:
    """:func:`parts_tokens` of every message of ``request`` (0 for a text-only model)."""
    if not request.vision:
        return 0
    return sum(parts_tokens(m.parts) for m in request.messages if m.parts)


TOOLS_CHARS_CACHE: dict[tuple[str, ...], int] = {}


def tools_chars(tools: tuple[ToolSpec, ...]) -> int:
    """Characters the tool definitions add to a request, computed once per tool set.

    The same tool set goes out with every request of every run; names identify
    it well enough for an estimate (specs hold dicts, so they cannot be hashed).
    """
    key = tuple(t.name for t in tools)
    chars = TOOLS_CHARS_CACHE.get(key)
    if chars is None:
        chars = sum(len(t.name) + len(t.description) + len(json.dumps(t.input_schema))
                    for t in tools)
        if len(TOOLS_CHARS_CACHE) < 256:
            TOOLS_CHARS_CACHE[key] = chars
    return chars


class Estimators:
    """One :class:`TokenEstimator` per provider, calibrated as runs go; shared by the
    engine and the budgets."""

    def __init__(self) -> None:
        self._by_provider: dict[str, TokenEstimator] = {}

    def for_provider(self, provider: str) -> TokenEstimator:
        """The estimator calibrated for ``provider`` (made on first use)."""
        estimator = self._by_provider.get(provider)
        if estimator is None:
            estimator = self._by_provider[provider] = TokenEstimator(provider)
        return estimator
