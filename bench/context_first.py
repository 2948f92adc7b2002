"""Context bench part 2: the bytes of the first Anthropic request per channel and chat
type, and what each system-prompt section contributes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench._common import print_table
from bench.context_app import BenchChannel, BenchError, LoggingProvider, bench_app
from bench.context_content import PEER_FIRST_REQUEST, TARGET_FIRST_REQUEST_BYTES
from bot.contracts.llm import LLMRequest
from bot.contracts.messages import ChatType
from bot.contracts.prompt import PromptContext, PromptSection
from bot.engine.context import kernel_text
from bot.storage.sessions import session_key
from plugins.anthropic_request import (
    cache_breakpoints,
    to_anthropic_messages,
    to_anthropic_system,
    to_anthropic_tools,
    with_note,
)
from workspaces import read_cached, workspace_dir

# -- part 2: the first request ----------------------------------------------------

NOTE = " (in the note)"
"""Marks a volatile section: sent after the conversation, not in the system prompt."""

FIRST_VARIANTS: tuple[tuple[str, ChatType, str, str], ...] = (
    # channel, chat type, sender id, chat id: realistic ids for each platform
    ("telegram", "direct", "5123456789", ""),
    ("telegram", "group", "5123456790", "-1001987654321"),
    ("discord", "direct", "912345678901234567", ""),
    ("discord", "group", "912345678901234568", "1098765432109876543"),
    ("slack", "direct", "U05QX7RT2AB", ""),
    ("slack", "group", "U05QX7RT2AC", "C05QX7RT9ZZ"),
    ("console", "direct", "local", ""),
    ("console", "group", "local-2", "console-room"),
)
SHORT = {"telegram": "tg", "discord": "dc", "slack": "sl", "console": "co"}


@dataclass(slots=True)
class FirstRequest:
    channel: str
    chat_type: ChatType
    body: int
    system: int
    tools: int
    messages: int
    per_tool: dict[str, int]
    sections: dict[str, int]
    """UTF-8 bytes of each system-prompt section (kernel included), in order."""
    separators: int
    system_raw: int
    request: LLMRequest

    @property
    def label(self) -> str:
        return f"{SHORT[self.channel]}/{self.chat_type[0]}"


def _json_bytes(value: Any) -> int:
    # How the Anthropic SDK serializes a body: compact separators, UTF-8.
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def anthropic_body(request: LLMRequest) -> dict[str, Any]:
    """The JSON body ``AnthropicProvider`` sends for ``request`` (streaming): the system
    prompt as a text block, cache breakpoints, the note after the last one."""
    messages = to_anthropic_messages(request.messages)
    tools = to_anthropic_tools(request.tools)
    system = to_anthropic_system(request.system)
    cache_breakpoints(tools, system, messages)
    with_note(messages, request.note)
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens,
                            "messages": messages, "stream": True}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = tools
    return body


async def first_requests() -> list[FirstRequest]:
    provider = LoggingProvider([{"reply": "Hi! I'm new here. What should I call you?"}],
                               name="anthropic")
    results: list[FirstRequest] = []
    async with bench_app(provider) as app:
        channels = {name: BenchChannel(name) for name in SHORT}
        for channel in channels.values():
            await app.add_channel(channel)
        for name, chat_type, sender, chat in FIRST_VARIANTS:
            channel = channels[name]
            message = channel.message("hello", sender, "Alice", chat, chat_type)
            seen = len(provider.log)
            await channel.say(message)
            await app.dispatcher.drain()
            new = provider.log[seen:]
            if len(new) != 1:
                raise BenchError(f"{name}/{chat_type}: expected one LLM call, got {len(new)}")
            request = new[0][0]
            body = anthropic_body(request)
            tools = body.get("tools", [])

            # The sections as the run built them, plus the Kernel the engine adds.
            key = session_key(message)
            workspace = workspace_dir(app.settings.workspaces_dir, name, sender)
            prompt = PromptContext(
                message=message, session_key=key, workspace=workspace,
                tool_names=sorted(t.name for t in request.tools), model=app.settings.model,
                provider=provider.name, agent="default")
            collected = await app.host.hooks.roost_prompt_sections(prompt=prompt)
            session = await app.store.get(key)
            kernel = kernel_text(read_cached(workspace / "USER.md", 8_000), session.facts)
            parts = [s for s in collected if isinstance(s, PromptSection) and s.text.strip()]
            parts.append(PromptSection("kernel (USER.md, pins)", kernel, 850))
            parts = sorted((s for s in parts if s.text.strip()), key=lambda s: s.order)
            # Volatile sections (the time; the sender in a group) travel in the note.
            sections = {s.name + (NOTE if s.volatile else ""):
                        len(s.text.strip().encode()) for s in parts}
            stable = sum(not s.volatile for s in parts)
            results.append(FirstRequest(
                name, chat_type, _json_bytes(body), _json_bytes(body.get("system", "")),
                _json_bytes(tools), _json_bytes(body["messages"]),
                {t["name"]: _json_bytes(t) for t in tools}, sections,
                2 * (stable - 1), len(request.system.encode()), request))
    return results


def report_first_requests(results: Sequence[FirstRequest]) -> None:
    print(f"\n== 2. First Anthropic request: fresh workspace, 'hello', all built-in tools; "
          f"JSON body as the SDK sends it (compact, UTF-8); target <= "
          f"{TARGET_FIRST_REQUEST_BYTES:,} B (peers: {PEER_FIRST_REQUEST}) ==")
    rows = []
    for r in results:
        verdict = "PASS" if r.body <= TARGET_FIRST_REQUEST_BYTES else "MISS"
        rows.append([f"{r.channel}/{r.chat_type}", f"{r.body:,}", f"{r.body / 1024:.1f} KB",
                     f"{r.system:,}", f"{r.tools:,}", f"{r.messages:,}",
                     f"{r.body - r.system - r.tools - r.messages:,}", verdict])
    print_table(["channel", "body B", "body KB", "system", "tools", "messages", "envelope",
                 "result"], rows, numbers_right=True)
    first = results[0]
    print("tools (JSON bytes each): " + ", ".join(f"{n} {b:,}" for n, b in
                                                 first.per_tool.items()))
    after = [r.body - r.sections.get("bootstrap", 0) - 2 for r in results]
    print(f"after the first run (once BOOTSTRAP.md is emptied, its section goes): about "
          f"{min(after):,}-{max(after):,} B")

    print("\nsystem prompt by section (UTF-8 bytes of each section's text; JSON escaping "
          "adds the rest):")
    names: list[str] = []
    for r in results:
        names += [n for n in r.sections if n not in names]
    rows = []
    for name in names:
        rows.append([name, *(f"{r.sections[name]:,}" if name in r.sections else "-"
                             for r in results)])
    rows.append(["(blank lines between sections)", *(f"{r.separators:,}" for r in results)])
    rows.append(["= system prompt, raw (without the note)",
                 *(f"{r.system_raw:,}" for r in results)])
    rows.append(["= system prompt, JSON text blocks", *(f"{r.system:,}" for r in results)])
    print_table(["section", *(r.label for r in results)], rows, numbers_right=True)
    mismatched = [r.label for r in results
                  if sum(v for n, v in r.sections.items() if not n.endswith(NOTE))
                  + r.separators != r.system_raw]
    if mismatched:
        print("note: the sections re-collected after the run do not add up to the sent "
              f"system prompt for {', '.join(mismatched)} (e.g. the minute changed).")
