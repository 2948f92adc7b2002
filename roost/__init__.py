"""Roost's public API for plugin authors: import from here, not from ``bot``.

A plugin is a module or object with functions named after the hooks in
:mod:`bot.hookspecs` (each hook's docstring is its documentation), marked with
:data:`hookimpl` and registered through the ``roost`` entry-point group::

    from roost import Tool, ToolContext, hookimpl

    async def shout(ctx: ToolContext, args): return str(args["text"]).upper()

    @hookimpl
    def roost_tools(settings, services):
        return [Tool("shout", "Upper-case some text.",
                     {"type": "object", "properties": {"text": {"type": "string"}}},
                     shout)]

Everything named here is kept stable across releases (a test fails when a name
disappears); modules under ``bot``, ``channels`` and ``plugins`` are Roost's
implementation and may change. Test helpers live in :mod:`roost.testing`.
"""

from __future__ import annotations

from bot.channel import Channel, ChannelSpec, InboundHandler, ReplyStream
from bot.commands import Command, CommandContext
from bot.config import Settings
from bot.events import RunEvent
from bot.guard import GuardPattern, InputCheck
from bot.hookspecs import hookimpl
from bot.jobs import JobSpec
from bot.judge import Judge, Verdict
from bot.llm import (
    ChatMessage,
    LLMProvider,
    LLMRequest,
    LLMResponse,
    OnRetry,
    OnText,
    ProviderError,
    ToolCall,
    ToolSpec,
    Usage,
)
from bot.messages import Attachment, ChatType, InboundMessage, OutboundMessage
from bot.prompt import Order, PromptContext, PromptSection
from bot.providers import ProviderSpec
from bot.sanitize import Sanitizer
from bot.services import Services
from bot.tool_args import check_keys, int_arg, str_arg
from bot.tools import Tool, ToolContext, ToolError, ToolResult, ToolRetry

__all__ = [
    "Attachment",
    "Channel",
    "ChannelSpec",
    "ChatMessage",
    "ChatType",
    "Command",
    "CommandContext",
    "GuardPattern",
    "InboundHandler",
    "InboundMessage",
    "InputCheck",
    "JobSpec",
    "Judge",
    "LLMProvider",
    "LLMRequest",
    "LLMResponse",
    "OnRetry",
    "OnText",
    "Order",
    "OutboundMessage",
    "PromptContext",
    "PromptSection",
    "ProviderError",
    "ProviderSpec",
    "ReplyStream",
    "RunEvent",
    "Sanitizer",
    "Services",
    "Settings",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "ToolRetry",
    "ToolSpec",
    "Usage",
    "Verdict",
    "check_keys",
    "hookimpl",
    "int_arg",
    "str_arg",
]
