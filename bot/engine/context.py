"""What one request is built from: the system prompt, the history pipeline, the segments
fitted into the window, and the token estimates they are measured with.

A request's prompt has four segments, fitted into ``window - reserve``:

* ROM: the system prompt from plugins' and offered tools' ordered sections
  (:func:`system_prompt`), fixed for the run; volatile sections go in each request's note.
* Kernel: who the user is and what this session pinned (USER.md, pins).
* L2: the compaction summary of older history, as two messages.
* L1: recent turns after the history pipeline (:func:`recent_history`: limit turns →
  drop old images → prune tool results → repair tool pairing), newest kept first.

The current message always goes in; L1 gives way first (oldest turns whole), then L2,
then the Kernel is cut: ``rom + kernel + l2 + l1 + current <= window - reserve``
whenever the ROM and the current message fit. History stages never mutate messages
(the same objects live in the session); :func:`compaction_due` says when it is too long.

Token estimates (:class:`TokenEstimator`) are characters / ratio plus a fixed overhead
per message and tool call; the ratio starts at a per-provider default and is calibrated
from every response's real ``usage.input_tokens`` (``bench/bench_context.py`` measures
the error).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.agents.patterns import PatternLibrary, render
from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, ContentPart, LLMRequest, ToolSpec
from bot.contracts.prompt import Order, PromptContext, PromptSection
from bot.contracts.tools import Tool, ToolPrompt
from bot.engine.media import drop_images
from bot.media.images import image_tokens
from bot.observability.tracing import RunTrace
from bot.pluginhost.manager import PluginHost
from workspaces import read_cached

log = logging.getLogger("roost.engine.context")


@dataclass(slots=True)
class Context:
    """What one LLM request is built from, with each segment's token count."""

    rom: str
    """ROM: the system prompt."""
    kernel: str
    """Kernel: USER.md and the session's pinned facts."""
    l2: list[ChatMessage]
    """L2: the compaction summary of older history (empty when there is none)."""
    l1: list[ChatMessage]
    """L1: the recent turns that fit."""
    current: ChatMessage
    """The message being answered."""
    budget: int
    """Tokens the segments may use: the window less the reserve for the answer."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Estimated tokens of each segment, by name."""

    @property
    def system(self) -> str:
        """ROM and Kernel joined: providers take one system prompt."""
        return f"{self.rom}\n\n{self.kernel}" if self.kernel else self.rom

    @property
    def messages(self) -> list[ChatMessage]:
        """L2, L1 and the current message, in order."""
        return [*self.l2, *self.l1, self.current]


def kernel_text(user_md: str, pins: Sequence[str], limit_chars: int = 6_000) -> str:
    """The Kernel segment: the user's profile and the session's pinned facts."""
    parts = []
    if user_md.strip():
        parts.append(f"## About the user (USER.md)\n{user_md.strip()[:limit_chars]}")
    if pins:
        parts.append("## Pinned facts for this conversation\n"
                     + "\n".join(f"- {p}" for p in pins))
    return "\n\n".join(parts)


def build_context(
    *,
    rom: str,
    kernel: str,
    summary: str,
    history: Sequence[ChatMessage],
    current: ChatMessage,
    estimator: TokenEstimator,
    window: int,
    reserve: int,
) -> Context:
    """Fit the segments into the budget, evicting the oldest L1 turns first."""
    budget = window - reserve
    rom_t, cur_t = estimator.text(rom), estimator.message(current)
    l2 = summary_messages(summary) if summary else []
    l2_t = estimator.messages(l2)
    kernel_t = estimator.text(kernel)
    if rom_t + kernel_t + l2_t + cur_t > budget and l2:
        l2, l2_t = [], 0
    if rom_t + kernel_t + cur_t > budget and kernel:
        room = max(0, budget - rom_t - cur_t)
        kernel = kernel[: int(room * estimator.ratio)]
        kernel_t = estimator.text(kernel)
    room = budget - rom_t - kernel_t - l2_t - cur_t
    l1 = _newest_turns(history, room, estimator)
    l1_t = estimator.messages(l1)
    tokens = {"rom": rom_t, "kernel": kernel_t, "l2": l2_t, "l1": l1_t, "current": cur_t,
              "total": rom_t + kernel_t + l2_t + l1_t + cur_t, "budget": budget}
    return Context(rom, kernel, l2, l1, current, budget, tokens)


def _newest_turns(history: Sequence[ChatMessage], room: int,
                  estimator: TokenEstimator) -> list[ChatMessage]:
    """The newest whole turns (each starting at a user message) that fit in ``room``.

    ``history`` has been through the history pipeline, so its tool pairing is
    sound, and a cut at a user message keeps it so.
    """
    if room <= 0:
        return []
    used, start = 0, len(history)
    turn_cost = 0
    for i in range(len(history) - 1, -1, -1):
        turn_cost += estimator.message(history[i])
        if history[i].role == "user":
            if used + turn_cost > room:
                break
            used += turn_cost
            start, turn_cost = i, 0
    return list(history[start:])

# -- the system prompt ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    """A run's system prompt: ``rom`` (the stable sections) and ``kernel`` are its
    segments, ``text`` what the provider gets; ``volatile`` goes in each request's note."""

    rom: str
    kernel: str
    text: str
    volatile: str


def assemble(sections: Iterable[PromptSection]) -> str:
    """Join non-empty sections by order (stable for equal orders)."""
    ordered = sorted((s for s in sections if s.text.strip()), key=lambda s: s.order)
    return "\n\n".join(s.text.strip() for s in ordered)


async def system_prompt(host: PluginHost, prompt: PromptContext, *, text: str,
                        patterns: PatternLibrary | None, trace: RunTrace,
                        facts: Sequence[str], tools: Mapping[str, Tool],
                        tool_timeout: float) -> SystemPrompt:
    """Plugins' sections for ``prompt``, the offered ``tools``' own (:func:`tool_sections`)
    and ``patterns``' best matches for ``text``, with the Kernel unless the mode is minimal."""
    sections = [*await host.hooks.roost_prompt_sections(prompt=prompt),
                *await tool_sections(tools, prompt, tool_timeout)]
    if patterns is not None:
        sections.append(await matched_patterns(patterns, text, trace))
    # Volatile sections (the time...) go in each request's note, after the cached
    # prefix: the system prompt stays byte-identical from turn to turn.
    stable = [s for s in sections if not s.volatile]
    workspace = prompt.workspace
    kernel = "" if prompt.mode == "minimal" else kernel_text(
        read_cached(workspace / "USER.md", 8_000, within=workspace), facts)
    # The Kernel goes before the recency reminders; it is counted as its own segment.
    return SystemPrompt(assemble(stable), kernel,
                        assemble([*stable, PromptSection("kernel", kernel, Order.KERNEL)]),
                        assemble(s for s in sections if s.volatile))


async def tool_sections(tools: Mapping[str, Tool], prompt: PromptContext,
                        tool_timeout: float) -> list[PromptSection]:
    """The sections of each distinct ``prompt`` callable of ``tools`` (the run's offered
    tools), called once each within its first tool's timeout (else ``tool_timeout``); one
    that raises or takes longer is logged and left out, like a failing prompt-section hook."""
    called: list[ToolPrompt] = []
    sections: list[PromptSection] = []
    for name, tool in tools.items():
        func = tool.prompt
        if func is None or func in called:  # bound methods of one object compare equal
            continue
        called.append(func)
        try:
            async with asyncio.timeout(tool.timeout or tool_timeout):
                got: object = await func(prompt)
        except Exception as exc:
            log.error("the prompt of tool %r raised %s; left out of this run", name,
                      type(exc).__name__, exc_info=exc)
            continue
        for item in got if isinstance(got, list | tuple) else [got]:
            if isinstance(item, PromptSection):
                sections.append(item)
            elif item is not None:
                log.error("the prompt of tool %r returned %s, not a PromptSection; ignored",
                          name, type(item).__name__)
    return sections


async def matched_patterns(library: PatternLibrary, text: str,
                           trace: RunTrace) -> PromptSection:
    """The library's top patterns for ``text`` (a volatile section: in the note)."""
    if library.reload_due():
        # Parsing YAML and rebuilding the index is file I/O: off the event loop.
        await asyncio.to_thread(library.reload_if_changed)
    span = trace.start("patterns", "patterns", library=str(library.directory))
    matches = library.match(text)
    span.end(matched={m.name: round(m.score, 4) for m in matches})
    return PromptSection("patterns", render(matches), Order.PATTERNS, volatile=True)


# -- the history pipeline -------------------------------------------------------------

MISSING_RESULT = "[Tool result missing -- session was compacted]"
CLEARED_RESULT = "[Old tool result content cleared]"


@dataclass(frozen=True, slots=True)
class PruneSettings:
    """Thresholds of the two pruning passes (ratios are of the context window)."""
    soft_ratio: float = 0.3
    hard_ratio: float = 0.5
    keep_last_assistants: int = 3
    soft_min_chars: int = 4_000
    soft_head: int = 1_500
    soft_tail: int = 1_500
    hard_min_prunable_chars: int = 50_000


def limit_turns(messages: Sequence[ChatMessage], turns: int) -> list[ChatMessage]:
    """Keep the last ``turns`` user turns with their assistant and tool messages."""
    seen = 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            seen += 1
            if seen == turns:
                return list(messages[i:])
    return list(messages)


def prune(
    messages: Sequence[ChatMessage],
    ratio: Callable[[Sequence[ChatMessage]], float],
    settings: PruneSettings = PruneSettings(),
) -> list[ChatMessage]:
    """Shrink old tool results while the context is too full.

    ``ratio(messages)`` is the estimated share of the context window the
    request would fill. Pass 1 (ratio >= soft) keeps the head and tail of long
    tool results; pass 2 (ratio >= hard, and at least ``hard_min_prunable_chars``
    of prunable results) clears results oldest first until the ratio drops.
    The first user message and everything from the last
    ``keep_last_assistants`` assistant messages on are never touched.
    """
    out = list(messages)
    if ratio(out) < settings.soft_ratio:
        return out
    prunable = _prunable(out, settings.keep_last_assistants)
    if not prunable:
        return out
    original = sum(len(out[i].content) for i in prunable)
    for i in prunable:
        content = out[i].content
        if len(content) > settings.soft_min_chars:
            cut = len(content) - settings.soft_head - settings.soft_tail
            out[i] = dataclasses.replace(
                out[i], content=f"{content[:settings.soft_head]}\n...[{cut} characters trimmed]"
                f"...\n{content[-settings.soft_tail:]}")
    if ratio(out) < settings.hard_ratio or original < settings.hard_min_prunable_chars:
        return out
    for i in prunable:
        if out[i].content != CLEARED_RESULT:
            out[i] = dataclasses.replace(out[i], content=CLEARED_RESULT)
            if ratio(out) < settings.hard_ratio:
                break
    return out


def _prunable(messages: Sequence[ChatMessage], keep_last: int) -> list[int]:
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if len(assistants) < keep_last:
        return []
    cutoff = assistants[-keep_last] if keep_last else len(messages)
    return [i for i in range(cutoff) if messages[i].role == "tool"]


def repair_pairing(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Make every tool call have exactly one result, right after it.

    Drops tool results at the start and ones that answer no pending call,
    and adds a placeholder result for each call left unanswered, so the list
    is valid for every provider's API.
    """
    out: list[ChatMessage] = []
    pending: dict[str, str] = {}

    def close_pending() -> None:
        for call_id, name in pending.items():
            out.append(ChatMessage("tool", MISSING_RESULT, tool_call_id=call_id, tool_name=name))
        pending.clear()

    for m in messages:
        if m.role == "tool":
            if m.tool_call_id in pending:
                del pending[m.tool_call_id]
                out.append(m)
            continue  # orphan or duplicate
        if pending:
            close_pending()
        out.append(m)
        if m.role == "assistant":
            pending.update((c.id, c.name) for c in m.tool_calls)
    close_pending()
    return out


def summary_messages(summary: str) -> list[ChatMessage]:
    """The two messages that carry a compaction summary into the next run."""
    return [
        ChatMessage("user", f"[Summary of earlier conversation]\n{summary}"),
        ChatMessage("assistant", "I understand the context of our earlier conversation "
                    "and will continue from there."),
    ]

def recent_history(messages: Sequence[ChatMessage], *, turns: int, group: bool,
                   estimator: TokenEstimator, window: int,
                   prune_settings: PruneSettings) -> list[ChatMessage]:
    """Stored history through the pipeline, as the model sees it: limit turns → drop old
    images → prune → repair pairing → attribute group messages."""
    limited = limit_turns(messages, turns)

    def ratio(ms: Sequence[ChatMessage]) -> float:
        return estimator.messages(ms) / window

    if any(m.parts for m in limited):
        # Old images go first, replaced by a line naming the file, before any text is cut.
        limited = drop_images(limited, ratio, prune_settings.soft_ratio)
    pruned = prune(limited, ratio, prune_settings)
    return [for_model(m, group) for m in repair_pairing(pruned)]


def compaction_due(messages: Sequence[ChatMessage], settings: Settings,
                   estimator: TokenEstimator) -> bool:
    """Whether a session's history is long enough to compact: over
    ``compact_min_messages``, or ``compact_ratio`` of the window."""
    return (len(messages) > settings.compact_min_messages
            or estimator.messages(messages) >= settings.compact_ratio * settings.context_window)


def current_turn(user: ChatMessage, group: bool, notes: Sequence[str]) -> ChatMessage:
    """The message being answered as the model sees it, with the gates' notes after it."""
    current = for_model(user, group)
    if not notes:
        return current
    return ChatMessage("user", current.content + "\n\n" + "\n".join(notes),
                       created_at=user.created_at, parts=current.parts)


def for_model(message: ChatMessage, group: bool) -> ChatMessage:
    """Attribute user messages in groups, where several people share a history."""
    if not group or message.role != "user" or not message.sender_id:
        return message
    who = message.sender_name or message.sender_id
    return ChatMessage("user", f"[{who} (id {message.sender_id})]: {message.content}",
                       created_at=message.created_at, parts=message.parts)


# -- token estimates ------------------------------------------------------------------

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


_SMOOTHING = 0.2


def _count_scripts(text: str) -> tuple[int, int]:
    return len(_DENSE.findall(text)), len(_NON_LATIN.findall(text))


class TokenEstimator:
    """Estimates tokens for one provider; ``calibrate`` keeps it honest."""

    def __init__(self, provider: str = "", ratio: float | None = None) -> None:
        self.ratio = ratio or DEFAULT_RATIOS.get(provider, DEFAULT_RATIO)
        self.samples = 0

    def text(self, text: str) -> int:
        """Tokens in a piece of text."""
        return int(self.weight(text) / self.ratio) + 1 if text else 0

    def weight(self, text: str) -> float:
        """``text``'s length in English-equivalent characters: BPE vocabularies split
        other scripts finer (about a token per CJK character, one per 1-2 letters of
        Cyrillic, Arabic, Hebrew or Devanagari)."""
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
        """A message's size in English-equivalent characters, cached on the message (it
        does not depend on the ratio; every run re-estimates the whole history)."""
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
    """Characters the tool definitions add to a request, computed once per tool set (by
    its names: specs hold dicts, which cannot be hashed)."""
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
