"""System-prompt sections: the plugin contract and the assembler."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bot.messages import InboundMessage

PromptMode = Literal["full", "minimal"]


@dataclass(frozen=True, slots=True)
class PromptContext:
    """What section builders may look at."""

    message: InboundMessage
    session_key: str
    workspace: Path
    tool_names: Sequence[str]
    model: str
    provider: str
    agent: str
    mode: PromptMode = "full"


@dataclass(frozen=True, slots=True)
class PromptSection:
    """A block of the system prompt. Lower ``order`` comes first."""

    name: str
    text: str
    order: int = 500


def assemble(sections: Iterable[PromptSection]) -> str:
    """Join non-empty sections by order (stable for equal orders)."""
    ordered = sorted((s for s in sections if s.text.strip()), key=lambda s: s.order)
    return "\n\n".join(s.text.strip() for s in ordered)
