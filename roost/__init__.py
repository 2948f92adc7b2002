"""Roost's public API for plugin authors: import from here, not from ``bot``.

A plugin is a module or object with functions named after the hooks in
:mod:`bot.contracts.hookspecs` (each hook's docstring is its documentation), marked with
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

from bot.agents.router import user_workspace
from bot.config.agents import DEFAULT_AGENT, AgentConfig
from bot.config.masking import mask_text
from bot.config.mcp import McpServerConfig
from bot.config.mcp import expand as expand_env
from bot.config.settings import Settings
from bot.config.tls import client_tls
from bot.contracts.channel import (
    Channel,
    ChannelContext,
    ChannelHealth,
    ChannelSpec,
    InboundHandler,
    ReplyStream,
    marked_send,
)
from bot.contracts.commands import Command, CommandContext
from bot.contracts.events import RunEvent
from bot.contracts.files import OpenFile
from bot.contracts.guard import GuardPattern, InputCheck
from bot.contracts.health import HealthReport
from bot.contracts.hookspecs import hookimpl
from bot.contracts.jobs import JobSpec
from bot.contracts.judge import Judge, Verdict
from bot.contracts.llm import (
    ChatMessage,
    ContentPart,
    LLMProvider,
    LLMRequest,
    LLMResponse,
    OnRetry,
    OnText,
    ProviderError,
    Sanitizer,
    Session,
    ToolCall,
    ToolSpec,
    Usage,
    agent_of,
)
from bot.contracts.media import MediaError, MediaTooLarge, Transcriber
from bot.contracts.messages import (
    Attachment,
    ChatType,
    InboundMessage,
    OutboundFile,
    OutboundMessage,
    ReactionEvent,
    ReplyReaction,
)
from bot.contracts.migrations import Migrations
from bot.contracts.prompt import Order, PromptContext, PromptSection
from bot.contracts.providers import LazyProvider, ProviderSpec
from bot.contracts.runtime import NO_REPLY, RunOutcome, Runtime
from bot.contracts.search import SearchBackend, SearchResult
from bot.contracts.services import Services
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolPrompt, ToolResult, ToolRetry
from bot.contracts.views import (
    ERROR_ID_EXAMPLE,
    ERROR_ID_RE,
    RESULT_ID_EXAMPLE,
    RESULT_ID_RE,
    AccessView,
    AgentError,
    AgentsView,
    AgentView,
    ErrorsView,
    JobError,
    JobListing,
    JobRecordView,
    OfferView,
    PluginsView,
    ResultsView,
    SchedulerView,
    SessionsView,
    StoredErrorView,
    UsageScope,
    UsageView,
)
from bot.engine.compaction import FLUSH_ITERATIONS, FLUSH_TIMEOUT, FLUSH_TOOLS
from bot.engine.context import repair_pairing, tools_chars
from bot.engine.exec_summary import SqlStatement, parse_statement
from bot.engine.media import text_only
from bot.engine.requests import RunRequest
from bot.media.documents import pdf_text
from bot.media.reader import (
    ANTHROPIC_MAX_PIXELS,
    OPENAI_SHORT_EDGE,
    Base64Text,
    DocumentData,
    ImageData,
    MediaReader,
    Note,
)
from bot.media.sniff import sniff_mime
from bot.resilience.breaker import CircuitBreaker
from bot.resilience.retry import JitterMode, RetryPolicy, is_retryable_status, parse_retry_after
from bot.storage.access import normalize_code
from bot.storage.db import transaction
from bot.storage.usage import day_of, month_of
from bot.tools.args import check_keys, int_arg, str_arg
from bot.tools.structured_errors import CONNECTION as ERROR_TYPE_CONNECTION
from bot.tools.structured_errors import ERROR_TYPES, StructuredError
from bot.tools.structured_errors import EXISTS as ERROR_TYPE_EXISTS
from bot.tools.structured_errors import FOREIGN_KEY as ERROR_TYPE_FOREIGN_KEY
from bot.tools.structured_errors import NOT_FOUND as ERROR_TYPE_NOT_FOUND
from bot.tools.structured_errors import PERMISSION as ERROR_TYPE_PERMISSION
from bot.tools.structured_errors import SYNTAX as ERROR_TYPE_SYNTAX
from bot.tools.structured_errors import TIMEOUT as ERROR_TYPE_TIMEOUT
from bot.tools.structured_errors import UNKNOWN as ERROR_TYPE_UNKNOWN
from bot.tools.structured_errors import extract as structure_error
from workspaces import read_cached, resolve_in_workspace, workspace_dir, workspace_lock
from workspaces.beneath import (
    Parts,
    lstat_at,
    make_dirs,
    open_beneath,
    open_dir,
    open_root,
    read_fd,
    write_atomic,
)
from workspaces.root import WorkspaceRoot, clip, user_parts

__all__ = [
    "ANTHROPIC_MAX_PIXELS",
    "DEFAULT_AGENT",
    "ERROR_ID_EXAMPLE",
    "ERROR_ID_RE",
    "ERROR_TYPES",
    "ERROR_TYPE_CONNECTION",
    "ERROR_TYPE_EXISTS",
    "ERROR_TYPE_FOREIGN_KEY",
    "ERROR_TYPE_NOT_FOUND",
    "ERROR_TYPE_PERMISSION",
    "ERROR_TYPE_SYNTAX",
    "ERROR_TYPE_TIMEOUT",
    "ERROR_TYPE_UNKNOWN",
    "FLUSH_ITERATIONS",
    "FLUSH_TIMEOUT",
    "FLUSH_TOOLS",
    "NO_REPLY",
    "OPENAI_SHORT_EDGE",
    "RESULT_ID_EXAMPLE",
    "RESULT_ID_RE",
    "AccessView",
    "AgentConfig",
    "AgentError",
    "AgentView",
    "AgentsView",
    "Attachment",
    "Base64Text",
    "Channel",
    "ChannelContext",
    "ChannelHealth",
    "ChannelSpec",
    "ChatMessage",
    "ChatType",
    "CircuitBreaker",
    "Command",
    "CommandContext",
    "ContentPart",
    "DocumentData",
    "ErrorsView",
    "GuardPattern",
    "HealthReport",
    "ImageData",
    "InboundHandler",
    "InboundMessage",
    "InputCheck",
    "JitterMode",
    "JobError",
    "JobListing",
    "JobRecordView",
    "JobSpec",
    "Judge",
    "LLMProvider",
    "LLMRequest",
    "LLMResponse",
    "LazyProvider",
    "McpServerConfig",
    "MediaError",
    "MediaReader",
    "MediaTooLarge",
    "Migrations",
    "Note",
    "OfferView",
    "OnRetry",
    "OnText",
    "OpenFile",
    "Order",
    "OutboundFile",
    "OutboundMessage",
    "Parts",
    "PluginsView",
    "PromptContext",
    "PromptSection",
    "ProviderError",
    "ProviderSpec",
    "ReactionEvent",
    "ReplyReaction",
    "ReplyStream",
    "ResultsView",
    "RetryPolicy",
    "RunEvent",
    "RunOutcome",
    "RunRequest",
    "Runtime",
    "Sanitizer",
    "SchedulerView",
    "SearchBackend",
    "SearchResult",
    "Services",
    "Session",
    "SessionsView",
    "Settings",
    "SqlStatement",
    "StoredErrorView",
    "StructuredError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolPrompt",
    "ToolResult",
    "ToolRetry",
    "ToolSpec",
    "Transcriber",
    "Usage",
    "UsageScope",
    "UsageView",
    "Verdict",
    "WorkspaceRoot",
    "agent_of",
    "check_keys",
    "client_tls",
    "clip",
    "day_of",
    "expand_env",
    "hookimpl",
    "int_arg",
    "is_retryable_status",
    "lstat_at",
    "make_dirs",
    "marked_send",
    "mask_text",
    "month_of",
    "normalize_code",
    "open_beneath",
    "open_dir",
    "open_root",
    "parse_retry_after",
    "parse_statement",
    "pdf_text",
    "read_cached",
    "read_fd",
    "repair_pairing",
    "resolve_in_workspace",
    "sniff_mime",
    "str_arg",
    "structure_error",
    "text_only",
    "tools_chars",
    "transaction",
    "user_parts",
    "user_workspace",
    "workspace_dir",
    "workspace_lock",
    "write_atomic",
]
