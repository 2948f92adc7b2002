"""MCP servers written with the SDK's server side (MCPServer, formerly FastMCP) for the tests."""
