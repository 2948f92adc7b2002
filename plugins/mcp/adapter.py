"""MCP tools as Roost tools, and MCP results as what the model reads.

Each tool becomes ``<server>__<tool>`` (:mod:`plugins.mcp.naming`) with the
server's description and JSON schema, in the tool group ``mcp:<server>`` (so
``group:mcp:<server>`` and ``group:mcp`` work in agents' allow/deny lists).
Roost never repeats a call to an MCP server (``max_attempts=1``): the server
may have acted on it. Failures are :class:`~roost.ToolError` codes the
executor's classifier reads:

- ``UNAVAILABLE`` (transient, counted by the tool's circuit breaker): the
  server is not running now (restarting, never started); nothing was sent;
- ``MCP_CONNECTION_LOST`` (permanent): the server went away during the call;
- ``TIMEOUT`` (transient): no answer within the server's ``timeout``;
- ``MCP_TOOL_ERROR`` (permanent): the tool reported an error (``isError``);
- ``MCP_PROTOCOL_ERROR`` (permanent): the server refused the request.

Results: text blocks as they are; structured content as JSON when no text
says the same; images, audio and binary resources are saved in the caller's
workspace under ``mcp/<server>/`` and described by a line giving the path
(``send_file`` can deliver them); each in a new file, never over an earlier one
(:mod:`plugins.mcp.files`). Large results go through Roost's large-result
store like any tool's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import mimetypes
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from plugins.mcp.connection import CallLost, ServerDown
from plugins.mcp.files import save_new
from plugins.mcp.manager import McpManager, McpServer
from plugins.mcp.naming import tool_names
from roost import ContentPart, Tool, ToolContext, ToolError, ToolResult, ToolRetry, sniff_mime

__all__ = ["GROUP_PREFIX", "build_tools", "render"]

GROUP_PREFIX = "mcp:"
NO_RETRY = ToolRetry(max_attempts=1)
MAX_DESCRIPTION = 4_000
"""Characters of a server's tool description passed on (some servers write essays)."""


NEEDS_APPROVAL = "needs_approval"
"""The ``Tool.meta`` key the tool policy reads (``bot.agents.tool_policy.NEEDS_APPROVAL``):
calls of the tool wait for a person's approval."""


def build_tools(manager: McpManager) -> list[Tool]:
    """The Roost tools of every enabled server's current list."""
    tools: list[Tool] = []
    taken: set[str] = set()
    for _, server in sorted(manager.servers.items()):
        if not server.config.enabled:
            continue
        by_name = {t.name: t for t in server.tools}
        for roost_name, mcp_name in tool_names(server.name, by_name, taken).items():
            tools.append(_tool(server, roost_name, by_name[mcp_name]))
            taken.add(roost_name)
    return tools


def _tool(server: McpServer, roost_name: str, tool: types.Tool) -> Tool:
    mcp_name = tool.name

    async def execute(context: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        try:
            result = await server.call(mcp_name, dict(args), context)
        except ServerDown as exc:
            raise ToolError(str(exc), code="UNAVAILABLE", retryable=True,
                            details={"server": server.name,
                                     "retry_after": round(exc.retry_after, 1)}) from None
        except CallLost as exc:
            raise ToolError(str(exc), code="MCP_CONNECTION_LOST",
                            details={"server": server.name}) from None
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                raise ToolError(f"MCP server '{server.name}' gave no answer within "
                                f"{server.config.timeout:g}s", code="TIMEOUT",
                                retryable=True) from None
            raise ToolError(f"MCP server '{server.name}' refused the call: {exc.message} "
                            f"(error {exc.code})", code="MCP_PROTOCOL_ERROR") from None
        text, parts = await render(result, context.workspace, server.name)
        if result.is_error:
            raise ToolError(text or f"{mcp_name} failed without saying why",
                            code="MCP_TOOL_ERROR")
        return ToolResult(text, parts=parts)

    description = (tool.description or tool.title or f"The {mcp_name} tool").strip()
    if len(description) > MAX_DESCRIPTION:
        description = description[:MAX_DESCRIPTION] + "..."
    schema = dict(tool.input_schema) if tool.input_schema else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    config = server.config
    return Tool(
        name=roost_name,
        description=f"{description}\n(From the MCP server '{server.name}'.)",
        input_schema=schema,
        execute=execute,
        # Starting a lazy server belongs to its first call's time.
        timeout=config.timeout + config.connect_timeout,
        retry=NO_RETRY,
        meta={"group": f"{GROUP_PREFIX}{server.name}", "mcp_server": server.name,
              "mcp_tool": mcp_name, NEEDS_APPROVAL: config.approve and destructive(tool)},
        read_only=read_only(tool),
    )


def read_only(tool: types.Tool) -> bool:
    """Whether the server marks ``tool`` read-only (``readOnlyHint: true``): an edit of
    the message may restart a run that called only such tools."""
    hints = tool.annotations
    return hints is not None and hints.read_only_hint is True


def destructive(tool: types.Tool) -> bool:
    """Whether the server marks ``tool`` destructive (``destructiveHint: true``) and not
    read-only (``readOnlyHint``); the protocol's default for an unmarked tool is not."""
    hints = tool.annotations
    return hints is not None and hints.destructive_hint is True and not hints.read_only_hint


async def render(result: types.CallToolResult, workspace: Path,
                 server: str) -> tuple[str, tuple[ContentPart, ...]]:
    """The text the model reads for ``result``, and its images as content parts.

    Every file is saved in ``workspace``; images also reach the model as parts
    (providers that take no images in tool results get a note naming the file).
    """
    texts: list[str] = []
    lines: list[str] = []
    parts: list[ContentPart] = []
    for index, block in enumerate(result.content):
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            line, saved = await _save(workspace, server, index, block.data, block.mime_type,
                                      kind)
            lines.append(line)
            if saved is not None and kind == "image":
                parts.append(ContentPart("image", saved.relative, saved.mime, size=saved.size,
                                         root=str(workspace)))
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                texts.append(resource.text)
            else:
                line, _ = await _save(workspace, server, index, resource.blob,
                                      resource.mime_type or "application/octet-stream",
                                      f"resource {resource.uri}")
                lines.append(line)
        elif isinstance(block, types.ResourceLink):
            lines.append(f"[resource link: {block.uri}"
                         + (f" ({block.name})" if block.name else "") + "]")
        else:
            lines.append(f"[{getattr(block, 'type', 'content')} content not shown]")
    structured = result.structured_content
    if structured is not None and not _said(texts, structured):
        texts.append(json.dumps(structured, ensure_ascii=False, indent=1))
    return "\n".join([*texts, *lines]).strip(), tuple(parts)


def _said(texts: list[str], structured: Any) -> bool:
    """Whether a text block already carries ``structured`` (servers usually send both)."""
    wrapped = structured.get("result") if isinstance(structured, dict) and \
        len(structured) == 1 else None
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if value == structured or (wrapped is not None and value == wrapped):
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Saved:
    relative: str
    mime: str
    size: int


async def _save(workspace: Path, server: str, index: int, data: str, mime: str,
                what: str) -> tuple[str, _Saved | None]:
    """Write a file a tool returned into the workspace: the line naming it, and where."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{what} ({mime}) could not be decoded]", None
    extension = mimetypes.guess_extension(mime.split(";")[0].strip()) or ".bin"
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{index}"
    try:
        relative = await asyncio.to_thread(save_new, workspace, server, stem, extension, raw)
    except OSError as exc:
        return f"[{what} ({mime}, {len(raw)} bytes) could not be saved: " \
               f"{exc.strerror or exc}]", None
    saved = _Saved(relative, sniff_mime(raw, mime), len(raw))
    return f"[{what} ({mime}, {len(raw)} bytes) saved as {saved.relative}]", saved
