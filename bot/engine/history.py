"""The history pipeline: limit turns → prune tool results → repair tool pairing.

Each stage is a pure function over a list of messages and returns a new list;
messages are never mutated, because the same objects live in the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bot.contracts.llm import ChatMessage

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
