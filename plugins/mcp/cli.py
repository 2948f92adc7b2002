"""``roost mcp list`` and ``roost mcp test NAME``: check servers without running Roost.

Each server is started (in a scratch directory for ``per_user`` ones), its
tools listed, and the server ended, as Roost would at startup; a server that
fails says why (the last lines of its stderr included). URLs and errors are
masked (:func:`roost.mask_text`): no credential of a server is printed.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mcp_types as types

from plugins.mcp.connection import Connection, ServerDown
from plugins.mcp.naming import tool_names
from roost import McpServerConfig, Settings, mask_text

__all__ = ["list_servers", "test_server"]


async def _probe(name: str, config: McpServerConfig) -> tuple[list[types.Tool], str]:
    scratch = Path(tempfile.mkdtemp(prefix="roost-mcp-")) if config.per_user else None
    try:
        return await Connection(name, config, cwd=scratch, restart=False).list_once(), ""
    except ServerDown as exc:
        return [], mask_text(str(exc))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


async def list_servers(settings: Settings) -> tuple[int, str]:
    """Every configured server: reachable or not, and its tools. Exit code 1 if one fails."""
    servers = settings.mcp.servers
    if not servers:
        return 0, "No MCP servers are configured ([mcp.servers.<name>] in roost.toml)."
    enabled = {n: c for n, c in sorted(servers.items()) if c.enabled}
    results = await asyncio.gather(*(_probe(n, c) for n, c in enabled.items()))
    lines: list[str] = []
    failed = False
    for name, config in sorted(servers.items()):
        where = mask_text(str(config.command if config.kind == "stdio" else config.url))
        head = f"{name} ({config.kind}, {config.startup}{', per user' if config.per_user else ''})"
        if not config.enabled:
            lines.append(f"{head}: disabled")
            continue
        tools, error = results[list(enabled).index(name)]
        if error:
            failed = True
            lines.append(f"{head}: FAILED — {error}\n    {where}")
        else:
            names = ", ".join(sorted(tool_names(name, [t.name for t in tools]))) or "(none)"
            lines.append(f"{head}: ok, {len(tools)} tools\n    {names}")
    return (1 if failed else 0), "\n".join(lines)


async def test_server(settings: Settings, name: str) -> tuple[int, str]:
    """Start server ``name``, list its tools in detail, end it."""
    config = settings.mcp.servers.get(name)
    if config is None:
        known = ", ".join(sorted(settings.mcp.servers)) or "none"
        return 2, f"No MCP server named {name!r} (configured: {known})."
    tools, error = await _probe(name, config)
    if error:
        return 1, error
    lines = [f"{name}: connected, {len(tools)} tools"]
    by_mcp = {mcp: roost for roost, mcp in tool_names(name, [t.name for t in tools]).items()}
    for tool in tools:
        lines.append(f"\n{by_mcp[tool.name]}  (MCP name: {tool.name})")
        description = (tool.description or "").strip().splitlines()
        if description:
            lines.append(f"  {description[0]}")
        lines.extend(f"  - {param}" for param in _params(tool.input_schema))
    return 0, "\n".join(lines)


def _params(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    out = []
    for key, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        out.append(f"{key}: {kind}{'' if key in required else ' (optional)'}")
    return out
