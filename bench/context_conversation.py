"""Context bench part 1: prompt tokens per turn over a long tool-heavy chat, against a
naive agent that sends the whole stored conversation."""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench._common import percentile, print_table
from bench.context_app import (
    BenchChannel,
    BenchError,
    LoggingProvider,
    LookupTool,
    _last_user,
    bench_app,
    message_chars,
    request_chars,
    to_tokens,
    tools_chars,
)
from bench.context_content import (
    CHARS_PER_TOKEN,
    FLUSH_NOTE,
    REPLIES,
    SUMMARY_TEXT,
    TOOL_NAME,
    TOOL_OUTPUT_CHARS,
    USER_ID,
    USER_NAME,
    kind_of,
    question,
    tool_output,
)
from bot.contracts.llm import LLMRequest
from bot.engine.compaction import SUMMARY_SYSTEM
from bot.engine.context import CLEARED_RESULT
from bot.storage.sessions import session_key

# -- part 1: prompt tokens over a long conversation ----------------------------------


def conversation_script() -> list[dict[str, Any]]:
    """Scripted turns: memory flush, summarizer, then four chat turns used in rotation."""
    today = dt.datetime.now(dt.UTC).date().isoformat()
    flush = {"match": "^Pre-compaction memory flush", "steps": [
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": f"memory/{today}.md", "content": FLUSH_NOTE}}]},
        {"reply": "NO_REPLY"}]}
    summary = {"match": rf"^(\[Earlier summary\]|{USER_NAME}: )", "reply": SUMMARY_TEXT}
    chat = [{"steps": [
        {"tool_calls": [{"name": TOOL_NAME, "arguments": {"query": "{message}"}}]},
        {"reply": REPLIES[k]}]} for k in range(4)]
    return [flush, summary, *chat]


CallKind = Literal["chat", "flush", "summary"]


@dataclass(slots=True)
class Call:
    """One LLM request of the conversation."""

    turn: int
    kind: CallKind
    tokens: int
    """Characters of the request / ``CHARS_PER_TOKEN``."""
    usage: int
    """``usage.input_tokens`` as the scripted provider reported it."""
    messages: int
    trimmed: int = 0
    """Tool results soft-trimmed (head and tail kept) in this request."""
    cleared: int = 0
    """Tool results cleared by the hard pruning pass in this request."""


@dataclass(slots=True)
class Conversation:
    label: str
    turns: int
    calls: list[Call]
    naive: list[int]
    """The naive baseline's prompt tokens per turn (its two calls added)."""
    naive_uncapped: list[int]
    """The same with every tool result as the tool returned it."""
    compactions: int
    shortened: int
    """Tool results the run loop stored shorter than the tool returned them."""
    wall: float

    def per_turn(self, kinds: Sequence[CallKind] = ("chat",)) -> list[int]:
        totals = [0] * self.turns
        for call in self.calls:
            if call.kind in kinds:
                totals[call.turn - 1] += call.tokens
        return totals

    def usage_per_turn(self) -> list[int]:
        totals = [0] * self.turns
        for call in self.calls:
            if call.kind == "chat":
                totals[call.turn - 1] += call.usage
        return totals

    def count(self, kind: CallKind) -> int:
        return sum(call.kind == kind for call in self.calls)


def _classify(request: LLMRequest, turn_text: str) -> CallKind:
    if request.system == SUMMARY_SYSTEM:
        return "summary"
    last = _last_user(request)
    if last == turn_text:
        return "chat"
    if last.startswith("Pre-compaction memory flush"):
        return "flush"
    raise BenchError(f"unexpected request for {last[:60]!r}")


async def run_conversation(label: str, turns: int, **settings: Any) -> Conversation:
    provider = LoggingProvider(conversation_script())
    start = time.perf_counter()
    async with bench_app(provider, LookupTool(), **settings) as app:
        channel = BenchChannel("bench")
        await app.add_channel(channel)
        calls: list[Call] = []
        systems: list[tuple[int, int]] = []
        """Per turn: characters of the system prompt and of the tool schemas Roost sent."""
        seen = 0
        for turn in range(1, turns + 1):
            text = question(turn)
            await channel.say(channel.message(text, USER_ID, USER_NAME))
            await app.dispatcher.drain()
            await app.engine.compactor.wait()
            if len(channel.sent) != turn or channel.sent[-1].text != REPLIES[kind_of(turn)]:
                got = channel.sent[-1].text[:80] if channel.sent else "nothing"
                raise BenchError(f"turn {turn}: expected the scripted reply, got {got!r}")
            first_chat = True
            for request, usage in provider.log[seen:]:
                kind = _classify(request, text)
                tools = [m for m in request.messages if m.role == "tool"]
                calls.append(Call(
                    turn, kind, to_tokens(request_chars(request)), usage.input_tokens,
                    len(request.messages),
                    trimmed=sum("characters trimmed]..." in m.content for m in tools),
                    cleared=sum(m.content == CLEARED_RESULT for m in tools)))
                if kind == "chat" and first_chat:
                    systems.append((len(request.system), tools_chars(request.tools)))
                    first_chat = False
            seen = len(provider.log)
        session = await app.store.get(session_key(channel.message("", USER_ID)))
        async with app.store.db.execute(
            "SELECT run_id, role, content, tool_calls FROM messages WHERE session_id = ?"
            " ORDER BY id", (session.id,),
        ) as cur:
            rows = list(await cur.fetchall())
        compactions = session.compactions
    wall = time.perf_counter() - start

    # The whole stored conversation (compacted rows included), one list per run.
    runs: dict[str, list[tuple[str, str, int]]] = {}
    for run_id, role, content, calls_json in rows:
        stored_calls = [(c["name"], c["arguments"]) for c in json.loads(calls_json or "[]")]
        runs.setdefault(run_id, []).append((role, content,
                                            message_chars(content, stored_calls)))
    per_run = list(runs.values())
    if len(per_run) != turns or any([m[0] for m in r] != ["user", "assistant", "tool",
                                                          "assistant"] for r in per_run):
        raise BenchError(f"expected {turns} stored runs of user, tool call, result, answer")
    naive: list[int] = []
    uncapped: list[int] = []
    shortened = 0
    before = before_uncapped = 0
    for turn, ((system_chars, tool_chars), run) in enumerate(
            zip(systems, per_run, strict=True), 1):
        (_, _, user), (_, _, assistant), (_, stored, tool), (_, _, answer) = run
        full = len(tool_output(turn))
        shortened += stored != tool_output(turn)
        for chars, history, result in ((naive, before, tool), (uncapped, before_uncapped, full)):
            first = system_chars + tool_chars + history + user
            chars.append(to_tokens(first) + to_tokens(first + assistant + result))
        before += user + assistant + tool + answer
        before_uncapped += user + assistant + full + answer
    return Conversation(label, turns, calls, naive, uncapped, compactions, shortened, wall)


def _stats(values: Sequence[int]) -> list[str]:
    return [f"{statistics.fmean(values):,.0f}", f"{statistics.median(values):,.0f}",
            f"{percentile(values, 95):,.0f}", f"{max(values):,}", f"{sum(values):,}"]


def report_conversation(results: Sequence[Conversation]) -> None:
    default = results[0]
    turns = default.turns
    print(f"\n== 1. Prompt tokens per turn: {turns}-turn direct chat, one {TOOL_NAME} call "
          f"per turn ({TOOL_OUTPUT_CHARS[0] // 1000}-{TOOL_OUTPUT_CHARS[1] // 1000} KB "
          f"result), {CHARS_PER_TOKEN} chars/token ==")
    rows: list[list[str]] = []
    for result in results:
        chat = result.per_turn()
        rows.append([f"Roost, {result.label}: chat calls", *_stats(chat)])
        background = result.per_turn(("flush", "summary"))
        if sum(background):
            rows.append([f"Roost, {result.label}: + flush & summary calls",
                         *_stats(result.per_turn(("chat", "flush", "summary")))])
        rows.append([f"Roost, {result.label}: provider usage.input_tokens",
                     *_stats(result.usage_per_turn())])
    rows.append(["naive: system + full stored history", *_stats(default.naive)])
    if default.naive_uncapped != default.naive:
        rows.append(["naive, tool results uncapped", *_stats(default.naive_uncapped)])
    print_table(["per turn (2 LLM calls)", "mean", "median", "p95", "max",
                 f"total ({turns} turns)"], rows, numbers_right=True)

    naive_total = sum(default.naive)
    print()
    for result in results:
        everything = result.per_turn(("chat", "flush", "summary"))
        chat = result.per_turn()
        print(f"naive/Roost ({result.label}): total {naive_total / sum(everything):.1f}x "
              f"(all calls) / {naive_total / sum(chat):.1f}x (chat calls only); "
              f"median turn {statistics.median(default.naive) / statistics.median(chat):.1f}x; "
              f"turn {turns} {default.naive[-1] / chat[-1]:.1f}x")
    print()
    step = max(1, turns // 8)
    windows = [(a, min(a + step - 1, turns)) for a in range(1, turns + 1, step)]

    def means(values: Sequence[int]) -> str:
        return ", ".join(f"{statistics.fmean(values[a - 1:b]) / 1000:,.0f}k"
                         for a, b in windows)

    print("growth: mean tokens per turn (chat calls) over turns "
          + ", ".join(f"{a}-{b}" for a, b in windows))
    for result in results:
        print(f"  Roost, {result.label}: {means(result.per_turn())}")
    print(f"  naive: {means(default.naive)}")
    print()
    for result in results:
        chats = [c for c in result.calls if c.kind == "chat"]
        trimmed = [c for c in chats if c.trimmed]
        cleared = [c for c in chats if c.cleared]
        flush_runs = sum(1 for i, c in enumerate(result.calls)
                         if c.kind == "flush" and (i == 0 or result.calls[i - 1].kind != "flush"))
        print(f"Roost, {result.label}: {result.compactions} post-run compactions, "
              f"{result.count('summary')} summarizer calls, {flush_runs} memory-flush runs "
              f"({result.count('flush')} calls); soft-trimmed tool results in "
              f"{len(trimmed)}/{len(chats)} chat calls (at most "
              f"{max((c.trimmed for c in chats), default=0)} per call), hard-cleared in "
              f"{len(cleared)}; history sent: max "
              f"{max(c.messages for c in chats)} messages; {result.wall:.1f}s")
    print(f"Tool results the run loop stored shortened (its per-result cap; the naive row "
          f"uses the stored history too): {default.shortened}/{turns}.")
