"""A provider that replays a script: for demos and tests, never a fallback.

A script is YAML or JSON::

    loop: false            # cycle through unmatched turns when exhausted
    turns:
      - match: "(?i)hello"  # regex searched in the last user message
        reply: "Hi!"
      - steps:              # a turn with tool calls: one step per model call
          - text: "Saving."
            tool_calls: [{name: write_file, arguments: {path: a.md, content: "{message}"}}]
          - reply: "Saved."

Turns with ``match`` are chosen by pattern; the others in order. A step may
also set ``delay`` (seconds before answering), ``chunk`` (stream it in pieces
of this many characters), ``chunk_delay``, or ``error`` (fail with this
message; ``retryable: true`` marks it transient). ``{message}`` in a reply or
in string arguments is replaced by the last user message; ``{error_id}`` and
``{result_id}`` by the newest error or stored-result ID in the tool results,
so a script can follow the error channel like a model would; ``{result}`` by the
newest tool result of the turn, and ``{1}``, ``{2}``... by the groups of the
turn's ``match``, so a reply can say what actually happened.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from roost import (
    ChatMessage,
    LLMRequest,
    LLMResponse,
    OnRetry,
    OnText,
    ProviderError,
    ToolCall,
    Usage,
    tools_chars,
)


class ScriptError(ValueError):
    """The script file is missing or malformed."""


@dataclass(frozen=True, slots=True)
class Step:
    """One model answer."""

    text: str = ""
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    delay: float = 0.0
    chunk: int = 0
    chunk_delay: float = 0.0
    error: str = ""
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    """The answers to one user message."""

    steps: tuple[Step, ...]
    match: re.Pattern[str] | None = None


def load_script(path: Path) -> tuple[list[Turn], bool]:
    """Parse a script file into turns and the ``loop`` flag."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"cannot read script {path}: {exc}") from exc
    try:
        data = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScriptError(f"script {path} is not valid {path.suffix[1:] or 'YAML'}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list) or not data["turns"]:
        raise ScriptError(f"script {path} needs a non-empty 'turns' list")
    return [_turn(t, i, path) for i, t in enumerate(data["turns"])], bool(data.get("loop"))


def _turn(data: Any, index: int, path: Path) -> Turn:
    where = f"script {path}, turn {index + 1}"
    if not isinstance(data, dict):
        raise ScriptError(f"{where}: must be a mapping")
    steps_data = data.get("steps") or [data]
    if not isinstance(steps_data, list):
        raise ScriptError(f"{where}: 'steps' must be a list")
    try:
        pattern = re.compile(data["match"]) if data.get("match") else None
    except re.error as exc:
        raise ScriptError(f"{where}: bad 'match' pattern: {exc}") from exc
    steps = []
    for step in steps_data:
        if not isinstance(step, dict):
            raise ScriptError(f"{where}: each step must be a mapping")
        calls = step.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
        ):
            raise ScriptError(f"{where}: tool_calls must be a list of {{name, arguments}}")
        steps.append(Step(
            text=str(step.get("reply", step.get("text", ""))),
            tool_calls=tuple(calls),
            delay=float(step.get("delay", 0)),
            chunk=int(step.get("chunk", 0)),
            chunk_delay=float(step.get("chunk_delay", 0)),
            error=str(step.get("error", "")),
            retryable=bool(step.get("retryable", False)),
        ))
    return Turn(tuple(steps), pattern)


class ScriptedProvider:
    """Answers from a script; deterministic and safe for concurrent sessions."""

    name = "scripted"

    def __init__(self, turns: list[Turn], *, loop: bool = False) -> None:
        self.turns = turns
        self.loop = loop
        self._ordered = [i for i, t in enumerate(turns) if t.match is None]
        self._cursor = 0
        # Which turn answers a given user message and how many of its steps were
        # served, so follow-up calls (after tool results) continue that turn even
        # when the conversation in between was compacted.
        self._chosen: dict[tuple[str, float], list[int]] = {}
        self.requests: list[LLMRequest] = []

    @classmethod
    def from_file(cls, path: Path) -> ScriptedProvider:
        """Load the script at ``path``."""
        turns, loop = load_script(path)
        return cls(turns, loop=loop)

    async def complete(
        self,
        request: LLMRequest,
        *,
        on_text: OnText | None = None,
        on_retry: OnRetry | None = None,
    ) -> LLMResponse:
        """Answer with the next step of the turn for the last user message."""
        self.requests.append(request)
        user = _last_user(request.messages)
        progress = self._progress(user)
        turn, step_index = self.turns[progress[0]], progress[1]
        progress[1] += 1
        if step_index >= len(turn.steps):
            raise ProviderError(
                f"scripted provider: the turn for {user.content[:40]!r} has only "
                f"{len(turn.steps)} step(s) but the model was called again"
            )
        step = turn.steps[step_index]
        if step.delay:
            await asyncio.sleep(step.delay)
        if step.error:
            raise ProviderError(step.error, retryable=step.retryable)
        values = {"{message}": user.content, **_references(request.messages),
                  **_groups(turn, user.content)}
        text = _fill(step.text, values)
        if on_text is not None and text:
            size = step.chunk or len(text)
            for start in range(0, len(text), size):
                if step.chunk_delay and start:
                    await asyncio.sleep(step.chunk_delay)
                on_text(text[start:start + size])
        calls = tuple(
            ToolCall(
                id=f"call_{step_index}_{n}",
                name=c["name"],
                arguments=_fill(c.get("arguments") or {}, values),
            )
            for n, c in enumerate(step.tool_calls)
        )
        # Like a real provider, count the whole request: system, messages, tools.
        chars = len(request.system) + sum(len(m.content) for m in request.messages)
        chars += tools_chars(request.tools)
        usage = Usage(chars // 4 + 1, len(text) // 4 + 1)
        return LLMResponse(text, calls, usage, "tool_use" if calls else "end_turn")

    async def aclose(self) -> None:
        """Nothing to close."""

    def _progress(self, user: ChatMessage) -> list[int]:
        key = (user.content, user.created_at)
        progress = self._chosen.get(key)
        if progress is not None:
            return progress
        for i, turn in enumerate(self.turns):
            if turn.match is not None and turn.match.search(user.content):
                chosen = i
                break
        else:
            if self._cursor >= len(self._ordered):
                if not self.loop or not self._ordered:
                    raise ProviderError(
                        "scripted provider: the script has no turn left for "
                        f"{user.content[:40]!r}"
                    )
                self._cursor = 0
            chosen = self._ordered[self._cursor]
            self._cursor += 1
        if len(self._chosen) > 10_000:
            self._chosen.clear()
        progress = self._chosen[key] = [chosen, 0]
        return progress


def _last_user(messages: tuple[ChatMessage, ...]) -> ChatMessage:
    for message in reversed(messages):
        if message.role == "user":
            return message
    raise ProviderError("scripted provider: the request has no user message")


_REFERENCES = {
    "{error_id}": re.compile(r"\[Error ID: (err_\w+)\]"),
    "{result_id}": re.compile(r"\[Result stored as (res_\w+)"),
}


def _groups(turn: Turn, text: str) -> dict[str, str]:
    match = turn.match.search(text) if turn.match is not None else None
    if match is None:
        return {}
    return {f"{{{n}}}": (group or "").strip() for n, group in enumerate(match.groups(), 1)}


def _references(messages: tuple[ChatMessage, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for message in reversed(messages):
        if message.role == "user":
            break  # only the current turn's tool results can be referred to
        if message.role != "tool":
            continue
        # Without the recap the engine appends to the turn's last tool result.
        found.setdefault("{result}", message.content.split("<TOOL_EXECUTION_SUMMARY>")[0].strip())
        for name, pattern in _REFERENCES.items():
            match = pattern.search(message.content)
            if match and name not in found:
                found[name] = match.group(1)
    return found


def _fill(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for placeholder, replacement in values.items():
            value = value.replace(placeholder, replacement)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return value
