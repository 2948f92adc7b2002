"""A small MCP server for Roost's tests, run as ``python toolbox.py`` (stdio) or
``python toolbox.py --http PORT``: on 127.0.0.1:PORT, Streamable HTTP at ``/mcp`` and the
older SSE transport at ``/sse``, both from one process (the tests share it).

Tools: ``add``, ``echo.upper`` (a name with a dot), ``where`` (the process's
cwd), ``fail`` (an ``isError`` result), ``picture`` (a PNG), ``big`` (a long
text), ``grow`` (adds ``hello`` and announces the changed list), ``crash``
(exits the process mid-call), ``pid``, ``slow``, ``wipe`` (marked destructive) and
``peek`` (marked destructive and read-only). ``TOOLBOX_MARK`` in the
environment is echoed by ``mark``; ``TOOLBOX_STUBBORN=1`` makes a stdio server
ignore the end of its stdin and SIGTERM (only SIGKILL ends it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import os
import signal
import sys
import time

# Importing the SDK builds some 600 pydantic models: nearly all of a server start's CPU,
# and the tests start dozens of servers. The cyclic collector ran over those objects again
# and again, while they were built and at each full collection afterwards: a third of
# the start (~1.0 s of CPU down to ~0.65 s per stdio session). They live as long as the
# process, so the collector is off while they are made and they are frozen out of its
# sight once the tools are registered (end of the module).
gc.disable()

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.types import ImageContent, ToolAnnotations  # noqa: E402

PNG = base64.b64encode(
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00"
    b"\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N"
    b"\x00\x00\x00\x00IEND\xaeB`\x82").decode()

server = MCPServer("toolbox")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(name="echo.upper")
def echo_upper(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@server.tool()
def where() -> str:
    """The server process's working directory."""
    return os.getcwd()


@server.tool()
def mark() -> str:
    """The TOOLBOX_MARK environment variable."""
    return os.environ.get("TOOLBOX_MARK", "(unset)")


@server.tool()
def getenv(name: str) -> str:
    """The environment variable ``name`` of the server process."""
    return os.environ.get(name, "(unset)")


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def fail(reason: str) -> str:
    """Always fails with ``reason`` (an ``isError`` result)."""
    raise ToolError(reason)


@server.tool()
def picture() -> list[object]:
    """A 1x1 PNG."""
    return ["here is a picture", ImageContent(type="image", data=PNG, mime_type="image/png")]


@server.tool()
def big(size: int) -> str:
    """``size`` characters of text."""
    return ("lorem ipsum " * (size // 12 + 1))[:size]


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool ``hello`` and tells the client the list changed."""
    server.add_tool(lambda: "hello!", name="hello", description="Say hello.")
    # Both ways: handshake-era clients read the notification, 2026 ones subscribe.
    with contextlib.suppress(Exception):
        await ctx.request_context.session.send_tool_list_changed()
    with contextlib.suppress(Exception):
        await ctx.notify_tools_changed()
    return "grown"


@server.tool(annotations=ToolAnnotations(destructiveHint=True))
def wipe(path: str) -> str:
    """Pretends to delete ``path`` (marked destructive)."""
    return f"wiped {path}"


@server.tool(annotations=ToolAnnotations(destructiveHint=True, readOnlyHint=True))
def peek(path: str) -> str:
    """Pretends to read ``path`` (marked destructive but read-only: read-only wins)."""
    return f"peeked {path}"


@server.tool()
def crash() -> str:
    """Exits the process without answering."""
    sys.stdout.flush()
    os._exit(3)


gc.freeze()  # what exists now is never collected: the collector skips it from here on
gc.enable()


def serve_http(port: int) -> None:
    """Streamable HTTP at ``/mcp`` and SSE at ``/sse`` (+ ``/messages/``) on one port."""
    import uvicorn

    app = server.streamable_http_app()  # its lifespan runs the Streamable HTTP sessions
    app.router.routes.extend(server.sse_app().routes)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    """Serve as the command line says: on stdio, or ``--http PORT``."""
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(int(sys.argv[2]))
        return
    stubborn = os.environ.get("TOOLBOX_STUBBORN") == "1"
    if stubborn:  # outlives its stdin and SIGTERM: only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server.run()
    if stubborn:
        time.sleep(600)


if __name__ == "__main__":
    main()
