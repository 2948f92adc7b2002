"""The ``[mcp.servers.<name>]`` tables of ``roost.toml``: MCP servers whose tools Roost offers.

A server is either a command Roost runs and talks to over stdio::

    [mcp.servers.github]
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-github"]
    env = { GITHUB_PERSONAL_ACCESS_TOKEN = "${GITHUB_TOKEN}" }

or a URL (Streamable HTTP; ``transport = "sse"`` for older servers)::

    [mcp.servers.search]
    url = "https://mcp.example.com/mcp"
    headers = { Authorization = "Bearer ${SEARCH_TOKEN}" }

``${NAME}`` in ``env`` and ``headers`` values is replaced by the environment
variable ``NAME`` when the server is started, so secrets stay out of the file;
``roost config show`` masks every value that is not such a reference. The MCP
plugin (``plugins/mcp``) runs the servers; this module only validates shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.config.masking import SECRET_MASK

SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""Server names start every tool name (``<server>__<tool>``), so they are kept plain."""

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

Transport = Literal["stdio", "http", "sse"]
Startup = Literal["lazy", "eager"]


class McpServerConfig(BaseModel):
    """One ``[mcp.servers.<name>]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    """The program to run (stdio); ``args`` are its arguments."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the process (it gets only PATH, HOME and the like besides)."""
    cwd: Path | None = None
    """Working directory of the process; ignored with ``per_user`` (the workspace is)."""
    url: str | None = None
    """The endpoint of a server Roost connects to (Streamable HTTP or SSE)."""
    headers: dict[str, str] = Field(default_factory=dict)
    transport: Transport | None = None
    """``stdio`` with ``command``, ``http`` (default) or ``sse`` with ``url``."""
    startup: Startup = "lazy"
    """``lazy``: started when its tools are first needed; ``eager``: at startup."""
    per_user: bool = False
    """A stdio server run once per user workspace, with that workspace as its cwd."""
    timeout: float = Field(60.0, gt=0)
    """Seconds one tool call may take."""
    connect_timeout: float = Field(30.0, gt=0)
    """Seconds to start the server and list its tools."""
    idle_timeout: float = Field(600.0, ge=0)
    """Seconds a lazily started server (or a per-user one) may go unused before it is
    ended; the next call starts it again. 0 keeps it running. Eager servers stay."""
    enabled: bool = True
    approve: bool = True
    """Whether calls of this server's tools that it marks destructive (``destructiveHint``,
    not ``readOnlyHint``) wait for a person's approval; ``false`` trusts them."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _one_way_in(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set either command (a stdio server) or url (an HTTP server)")
        if self.command is not None:
            if self.transport not in (None, "stdio"):
                raise ValueError(f"transport {self.transport!r} needs url, not command")
            if self.headers:
                raise ValueError("headers are for url servers; a command gets env")
        else:
            if self.transport == "stdio":
                raise ValueError("transport 'stdio' needs command, not url")
            if self.per_user:
                raise ValueError("per_user is for stdio servers (command)")
            if self.env or self.args or self.cwd is not None:
                raise ValueError("env, args and cwd are for command servers")
        return self

    @property
    def kind(self) -> Transport:
        """How Roost talks to the server."""
        if self.command is not None:
            return "stdio"
        return self.transport or "http"


class McpConfig(BaseModel):
    """The ``[mcp]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _plain_names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(f"MCP server name {name!r} must be 1-40 letters, digits, "
                                 "'_' or '-'")
        return value


def expand(value: str, environ: Mapping[str, str]) -> str:
    """``value`` with every ``${NAME}`` replaced by ``environ[NAME]``.

    Raises :class:`KeyError` naming the first variable that is not set.
    """
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise KeyError(name)
        return environ[name]

    return _REFERENCE.sub(one, value)


def masked(config: McpConfig) -> dict[str, Any]:
    """``config`` as plain data with every ``env``/``headers`` value masked, except
    values that are only ``${NAME}`` references (they hold no secret)."""
    data = config.model_dump(mode="json")
    for server in data.get("servers", {}).values():
        for table in ("env", "headers"):
            server[table] = {k: v if _REFERENCE.fullmatch(v) else SECRET_MASK
                             for k, v in server.get(table, {}).items()}
    return data
