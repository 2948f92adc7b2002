"""An MCP server (the SDK's) with one tool, ``blob``: its text argument returned as a
binary resource, a file the client saves. Run as ``python blobs.py`` (stdio)."""

from __future__ import annotations

import base64

from mcp.server.mcpserver import MCPServer
from mcp.types import BlobResourceContents, EmbeddedResource

server = MCPServer("blobs")


@server.tool()
def blob(text: str) -> list[object]:
    """``text`` as a binary resource."""
    data = base64.b64encode(text.encode()).decode()
    return [EmbeddedResource(type="resource", resource=BlobResourceContents(
        uri=f"blobs://blob/{len(text)}", blob=data, mime_type="application/octet-stream"))]


def main() -> None:
    """Serve on stdio."""
    server.run()


if __name__ == "__main__":
    main()
