"""The context bench's app plumbing: the bench tool, a provider that logs each request,
a channel under any platform name, and request-size helpers."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._common import roost_app
from bench.context_content import CHARS_PER_TOKEN, TOOL_NAME, tool_output
from bot.app.roost import Roost
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import ChatMessage, LLMRequest, LLMResponse, OnRetry, OnText, ToolSpec, Usage
from bot.contracts.messages import ChatType, InboundMessage, OutboundMessage
from bot.contracts.tools import Tool, ToolContext
from plugins.scripted_provider import ScriptedProvider, _turn

# -- app plumbing -----------------------------------------------------------------


class LookupTool:
    """A plugin offering ``lookup``, whose results are large (see :func:`tool_output`)."""

    @staticmethod
    async def _lookup(context: ToolContext, args: Mapping[str, Any]) -> str:
        match = re.match(r"Q(\d+):", str(args.get("query", "")))
        return tool_output(int(match.group(1)) if match else 0)

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        schema = {"type": "object", "additionalProperties": False, "required": ["query"],
                  "properties": {"query": {"type": "string",
                                           "description": "What to look up, in plain words."}}}
        return [Tool(TOOL_NAME, "Look up issues, logs, docs pages or sales reports and return "
                     "the raw result.", schema, self._lookup)]


class LoggingProvider(ScriptedProvider):
    """The scripted provider, also keeping each request with the usage it reported."""

    def __init__(self, script: Sequence[Mapping[str, Any]], name: str = "scripted") -> None:
        super().__init__([_turn(t, i, Path("<bench>")) for i, t in enumerate(script)],
                         loop=True)
        self.name = name
        self.log: list[tuple[LLMRequest, Usage]] = []

    async def complete(
        self,
        request: LLMRequest,
        *,
        on_text: OnText | None = None,
        on_retry: OnRetry | None = None,
    ) -> LLMResponse:
        response = await super().complete(request, on_text=on_text, on_retry=on_retry)
        self.log.append((request, response.usage))
        return response


class BenchChannel(Channel):
    """A channel under any platform name that records what the core sends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handler: InboundHandler | None = None
        self.sent: list[OutboundMessage] = []
        self._ids = itertools.count(1)

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    def message(self, text: str, sender: str, name: str = "", chat: str = "",
                chat_type: ChatType = "direct") -> InboundMessage:
        return InboundMessage(channel=self.name, chat_id=chat or sender, chat_type=chat_type,
                              sender_id=sender, sender_name=name, text=text,
                              message_id=str(next(self._ids)),
                              mentioned=True)  # addressed: the bench measures answered turns

    async def say(self, message: InboundMessage) -> None:
        assert self.handler is not None, "channel not started"
        await self.handler(message)


class BenchError(RuntimeError):
    """The core did not behave the way the bench expects."""


def bench_app(provider: LoggingProvider, *plugins: object,
              **settings: Any) -> contextlib.AbstractAsyncContextManager[Roost]:
    """A fresh app with Roost's default settings (plus ``settings``) on a temp data dir."""
    return roost_app(provider, *plugins, **settings)


def _last_user(request: LLMRequest) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


def message_chars(content: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> int:
    """Characters of one message: its text and its tool calls (name and JSON arguments)."""
    return len(content) + sum(len(name) + len(json.dumps(dict(args), ensure_ascii=False))
                              for name, args in calls)


def _calls(message: ChatMessage) -> list[tuple[str, Mapping[str, Any]]]:
    return [(c.name, c.arguments) for c in message.tool_calls]


def tools_chars(tools: Sequence[ToolSpec]) -> int:
    return sum(len(t.name) + len(t.description) + len(json.dumps(dict(t.input_schema)))
               for t in tools)


def request_chars(request: LLMRequest) -> int:
    """Characters the provider is sent: system, messages (with tool calls), tool schemas."""
    return (len(request.system) + tools_chars(request.tools)
            + sum(message_chars(m.content, _calls(m)) for m in request.messages))


def to_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)
