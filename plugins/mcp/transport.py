"""How Roost reaches an MCP server: the transport for its kind, watched for closing.

stdio spawns the server with its stderr in a file; ``sse`` and streamable HTTP
send the configured headers. :func:`watched` relays the incoming stream and says
when it ends (a stdio server that exits closes its stdout). :func:`describe_failure`
and :func:`with_stderr` turn a failed start or call into one line for ``/mcp``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TextIO

import anyio
from mcp import StdioServerParameters, stdio_client
from mcp.client._transport import Transport, TransportStreams
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from roost import McpServerConfig, expand_env

# The SDK's HTTP client logs every request at INFO (one line per tool call); Roost
# quiets its other HTTP clients the same way, unless a level was set on purpose.
if logging.getLogger("httpx2").level == logging.NOTSET:
    logging.getLogger("httpx2").setLevel(logging.WARNING)

_STDERR_TAIL = 600


def open_transport(config: McpServerConfig, environ: Mapping[str, str], cwd: Path | None,
                   stack: AsyncExitStack, errlog: TextIO | None) -> Transport:
    """The transport for ``config``'s kind; ``${VAR}`` in its env and headers from ``environ``.

    A stdio server's stderr goes to ``errlog``; an HTTP client is closed with ``stack``.
    Raises ``RuntimeError`` naming an unset variable.
    """
    try:
        if config.kind == "stdio":
            assert config.command is not None and errlog is not None
            env = {k: expand_env(v, environ) for k, v in config.env.items()}
            params = StdioServerParameters(command=config.command, args=list(config.args),
                                           env=env, cwd=cwd)
            return stdio_client(params, errlog=errlog)
        headers = {k: expand_env(v, environ) for k, v in config.headers.items()}
    except KeyError as exc:
        raise RuntimeError(f"environment variable {exc.args[0]} is not set") from None
    assert config.url is not None
    if config.kind == "sse":
        return sse_client(config.url, headers=headers, timeout=config.connect_timeout)
    http = create_mcp_http_client(headers=headers)
    stack.push_async_callback(http.aclose)
    return streamable_http_client(config.url, http_client=http)


@asynccontextmanager
async def watched(transport: Transport,
                  on_closed: Callable[[], None]) -> AsyncIterator[TransportStreams]:
    """``transport`` with its incoming stream relayed, calling ``on_closed`` when it ends:
    a stdio server that exits closes its stdout, which is how a crash is seen at once."""
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            try:
                async with send:
                    async for item in read:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
            finally:
                on_closed()

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                yield receive, write
            finally:
                tg.cancel_scope.cancel()


def describe_failure(exc: BaseException) -> str:
    """One line about why a start or call failed, never a traceback."""
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return describe_failure(inner)
    if isinstance(exc, RuntimeError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def with_stderr(reason: str, errlog: TextIO | None) -> str:
    """``reason`` plus the last lines the server wrote to stderr, if any."""
    if errlog is None:
        return reason
    try:
        errlog.flush()
        size = errlog.seek(0, os.SEEK_END)
        errlog.seek(max(0, size - _STDERR_TAIL * 4))
        tail = errlog.read()[-_STDERR_TAIL:].strip()
    except (OSError, ValueError):
        return reason
    if not tail:
        return reason
    last = " | ".join(line.strip() for line in tail.splitlines()[-3:] if line.strip())
    return f"{reason}; its stderr ends: {last}"
