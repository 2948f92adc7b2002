"""A request's prompt in four segments (ROM, Kernel, L2, L1) fitted into ``window - reserve``.

* ROM: the system prompt, fixed for the run.
* Kernel: who the user is and what this session pinned (USER.md, pins).
* L2: the compaction summary of older history, as two messages.
* L1: recent turns after the history pipeline, newest kept first.

The current user message always goes in. L1 gives way first (oldest turns
dropped whole), then L2, then the Kernel is cut, so the invariant
``rom + kernel + l2 + l1 + current <= window - reserve`` holds whenever the
ROM and the current message fit at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.contracts.llm import ChatMessage
from bot.engine.history import summary_messages
from bot.engine.tokens import TokenEstimator


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
