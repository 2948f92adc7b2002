"""Small pure helpers of a run: the workspace path, what the model sees of a message."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from bot.agents.router import Agent
from bot.contracts.llm import ChatMessage, LLMRequest
from bot.observability.tracing import VERBOSE_INPUT_CHARS
from workspaces import TEMPLATE_NAMES, workspace_dir


def seeded_files(agent: Agent) -> tuple[str, ...]:
    """A predefined agent's persona is its own: each user's workspace gets only USER.md."""
    return ("USER.md",) if agent.type == "predefined" else TEMPLATE_NAMES


@functools.lru_cache(maxsize=4096)
def workspace_for(root: Path, channel: str, user_id: str) -> Path:
    # Sanitizing and hashing ids is pure; active users hit this every run.
    return workspace_dir(root, channel, user_id)


def verbose_input(request: LLMRequest) -> str:
    data = {"system": request.system,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "note": request.note}
    return json.dumps(data, ensure_ascii=False)[:VERBOSE_INPUT_CHARS]


def for_model(message: ChatMessage, group: bool) -> ChatMessage:
    """Attribute user messages in groups, where several people share a history."""
    if not group or message.role != "user" or not message.sender_id:
        return message
    who = message.sender_name or message.sender_id
    return ChatMessage("user", f"[{who} (id {message.sender_id})]: {message.content}",
                       created_at=message.created_at, parts=message.parts)
