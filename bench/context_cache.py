"""Context bench part 4: prompt caching over a tool-heavy chat.

The same scripted conversation as part 1 (one ``lookup`` call returning 5-20 KB
per turn, then the answer), 50 turns, with Roost's defaults (compaction and the
memory flush on), driven through the real ``AnthropicProvider`` and SDK against
the fake Messages API, which accounts for prompt caching as the real API
documents it (:mod:`bot.testing.anthropic_cache`: prefix keys, 20-block
lookback, 1024-token minimum, 5-minute TTL; tokens estimated at 4 characters of
JSON each). Run twice: with Roost's cache breakpoints, and without any (as
Roost sent requests before prompt caching). Every LLM call counts: the chat
calls, the summarizer and the memory flush runs.

Billed-equivalent input tokens weigh each token by its price relative to plain
input, as Anthropic bills them: read from the cache 0.1x, written to it 1.25x,
neither 1x.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from bench._common import print_table, roost_app
from bench.context_app import BenchChannel, BenchError, LookupTool
from bench.context_content import (
    REPLIES,
    SUMMARY_TEXT,
    TOOL_NAME,
    USER_ID,
    USER_NAME,
    kind_of,
    question,
)
from bot.config.settings import Settings
from bot.engine.compaction import SUMMARY_SYSTEM
from bot.testing.anthropic import DropConnection, FakeAnthropic, Reply, ToolUse
from bot.testing.anthropic_cache import CacheUsage
from plugins.anthropic_provider import AnthropicProvider

CACHE_TURNS = 50
TARGET_CACHE_SHARE = 0.85
"""Of all input tokens, the share read from the cache (issue 18)."""
READ_PRICE = 0.1
WRITE_PRICE = 1.25
PAUSE = 360.0
"""Seconds of a pause: past the 5-minute cache lifetime."""
PAUSE_EVERY = 5
MODEL = "claude-sonnet-bench"
"""A Sonnet-class name: the fake's minimum cacheable prefix is 1024 tokens."""

Kind = Literal["chat", "flush", "summary"]


def _text_of(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    return "".join(b.get("text", "") for b in blocks or () if isinstance(b, dict))


class ConversationModel(FakeAnthropic):
    """The fake Messages API answering part 1's script from the conversation itself.

    A new question gets a ``lookup`` call with the question as its query, a tool
    result gets the turn's reply, the summarizer a fixed summary and the memory
    flush ``NO_REPLY``. :attr:`kinds` says which each request was.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(api_key="bench-key", model=MODEL, clock=clock)
        self.kinds: list[Kind] = []

    def _next_item(self) -> Reply | DropConnection | None:
        body = self.requests[-1].body
        messages: list[dict[str, Any]] = body.get("messages", [])
        if _text_of(body.get("system")) == SUMMARY_SYSTEM:
            self.kinds.append("summary")
            return Reply((SUMMARY_TEXT,), ping=False)
        first = messages[-1]["content"][0] if messages else {}
        if first.get("type") == "tool_result":
            asked = next(t for m in reversed(messages) if m["role"] == "user"
                         for b in m["content"] if b.get("type") == "text"
                         and (t := b["text"]).startswith("Q"))
            match = re.match(r"Q(\d+):", asked)
            self.kinds.append("chat")
            return Reply((REPLIES[kind_of(int(match.group(1)) if match else 1)],), ping=False)
        text = str(first.get("text", ""))
        if text.startswith("Pre-compaction memory flush"):
            self.kinds.append("flush")
            return Reply(("NO_REPLY",), ping=False)
        self.kinds.append("chat")
        return Reply((ToolUse(TOOL_NAME, {"query": text}),), ping=False)


@dataclass(slots=True)
class CacheRun:
    """One run of the conversation: each turn's calls, as the fake accounted them."""

    label: str
    turns: list[list[tuple[Kind, CacheUsage]]] = field(default_factory=list)

    def calls(self, kinds: Sequence[Kind] = ("chat", "flush", "summary")) -> list[CacheUsage]:
        return [u for turn in self.turns for kind, u in turn if kind in kinds]

    def share_read(self, kinds: Sequence[Kind] = ("chat", "flush", "summary")) -> float:
        calls = self.calls(kinds)
        total = sum(u.total for u in calls)
        return sum(u.read for u in calls) / total if total else 0.0

    def billed_per_turn(self) -> list[float]:
        return [sum(billed(u) for _, u in turn) for turn in self.turns]

    def input_per_turn(self) -> list[int]:
        return [sum(u.total for _, u in turn) for turn in self.turns]


def billed(usage: CacheUsage) -> float:
    """Input tokens weighted by their price: uncached 1x, read 0.1x, written 1.25x."""
    return usage.uncached + READ_PRICE * usage.read + WRITE_PRICE * usage.written


class PausingClock:
    """The fake's cache clock: a second per turn, plus :data:`PAUSE` before some turns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def run_cache_conversation(label: str, turns: int, *, prompt_cache: bool,
                                 pause_every: int = 0) -> CacheRun:
    """``pause_every``: the user comes back after :data:`PAUSE` (past the cache's
    5-minute lifetime) before every such turn."""
    run = CacheRun(label)
    clock = PausingClock()
    async with ConversationModel(clock) as fake:
        provider = AnthropicProvider(Settings(anthropic_api_key="bench-key",
                                              anthropic_base_url=fake.base_url),
                                     prompt_cache=prompt_cache)
        async with roost_app(cast(Any, provider), LookupTool(), model=MODEL) as app:
            channel = BenchChannel("bench")
            await app.add_channel(channel)
            for turn in range(1, turns + 1):
                clock.now += PAUSE if pause_every and turn % pause_every == 0 else 1.0
                seen = len(fake.cache_usage)
                await channel.say(channel.message(question(turn), USER_ID, USER_NAME))
                await app.dispatcher.drain()
                await app.engine.compactor.wait()
                if len(channel.sent) != turn or channel.sent[-1].text != REPLIES[kind_of(turn)]:
                    got = channel.sent[-1].text[:80] if channel.sent else "nothing"
                    raise BenchError(f"cache run, turn {turn}: expected the reply, got {got!r}")
                if len(fake.kinds) != len(fake.cache_usage):
                    raise BenchError("the fake answered a request it did not account for")
                run.turns.append(list(zip(fake.kinds[seen:], fake.cache_usage[seen:],
                                          strict=True)))
    return run


async def run_cache_conversations(turns: int = CACHE_TURNS) -> list[CacheRun]:
    """With Roost's cache breakpoints, without (as before prompt caching), and with
    them but a pause past the cache lifetime before every :data:`PAUSE_EVERY`-th turn."""
    return [await run_cache_conversation("caching", turns, prompt_cache=True),
            await run_cache_conversation("no caching (before)", turns, prompt_cache=False),
            await run_cache_conversation(f"caching, 6-min pause every {PAUSE_EVERY} turns",
                                         turns, prompt_cache=True, pause_every=PAUSE_EVERY)]


def report_cache(runs: Sequence[CacheRun]) -> None:
    cached, plain, paused = runs
    turns = len(cached.turns)
    print(f"\n== 4. Prompt caching: {turns}-turn direct chat, one {TOOL_NAME} call per turn, "
          "real AnthropicProvider against the fake's cache accounting (every call counted: "
          "chat, memory flush, summarizer) ==")
    share, share_chat = cached.share_read(), cached.share_read(("chat",))
    with_billed, without_billed = cached.billed_per_turn(), plain.billed_per_turn()
    rows = [
        ["input tokens read from the cache, all calls", f"{share:.1%}",
         f"{plain.share_read():.1%}", f">= {TARGET_CACHE_SHARE:.0%}",
         "PASS" if share >= TARGET_CACHE_SHARE else "MISS"],
        ["  chat calls only", f"{share_chat:.1%}", f"{plain.share_read(('chat',)):.1%}",
         "", ""],
        ["billed-equivalent input tokens per turn, mean",
         f"{statistics.fmean(with_billed):,.0f}", f"{statistics.fmean(without_billed):,.0f}",
         "", ""],
        ["  median", f"{statistics.median(with_billed):,.0f}",
         f"{statistics.median(without_billed):,.0f}", "", ""],
        [f"  total ({turns} turns)", f"{sum(with_billed):,.0f}", f"{sum(without_billed):,.0f}",
         "", ""],
        ["input tokens per turn (cached or not), mean",
         f"{statistics.fmean(cached.input_per_turn()):,.0f}",
         f"{statistics.fmean(plain.input_per_turn()):,.0f}", "", ""],
        ["cache writes per turn, mean (tokens)",
         f"{statistics.fmean(sum(u.written for _, u in t) for t in cached.turns):,.0f}",
         "0", "", ""],
    ]
    print_table(["figure", cached.label, plain.label, "target", "result"], rows,
                numbers_right=True)
    saving = sum(without_billed) / sum(with_billed) if sum(with_billed) else 0.0
    print(f"billed-equivalent input: {saving:.1f}x less with caching "
          f"({1 - 1 / saving:.0%} saved)" if saving else "billed-equivalent input: n/a")
    step = max(1, turns // 5)
    windows = [(a, min(a + step - 1, turns)) for a in range(1, turns + 1, step)]
    print("billed-equivalent input per turn over turns " + ", ".join(f"{a}-{b}"
                                                                  for a, b in windows))
    for run, values in ((cached, with_billed), (plain, without_billed)):
        print(f"  {run.label}: " + ", ".join(
            f"{statistics.fmean(values[a - 1:b]) / 1000:,.1f}k" for a, b in windows))
    paused_billed = paused.billed_per_turn()
    print(f"{paused.label}: {paused.share_read():.1%} read from the cache, billed-equivalent "
          f"input {statistics.fmean(paused_billed):,.0f} per turn "
          f"({sum(without_billed) / sum(paused_billed):.1f}x less than without caching).")
    print("The caching column assumes each turn comes within the 5-minute cache lifetime of "
          "the last (an active chat); after a longer pause the first call of a turn writes "
          "the whole prefix again at 1.25x.")
