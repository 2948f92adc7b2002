"""The configured MCP servers of one Roost service: their tool lists and connections.

Startup choice (``startup = "lazy"``, the default): a server's tool list is
kept in ``<data_dir>/mcp-tools.json``, keyed by a fingerprint of its
configuration. When the list is there, the server's tools are offered from it
at once and the server is started only when one of them is first called. When
it is not (first start, or the configuration changed), the server is started
in the background at startup just to list its tools, then ended; the tools
are offered from the moment the listing arrives; runs that start before it
arrives wait for it (at most the server's ``connect_timeout``), so the first
message after a start sees the new server's tools. Otherwise runs never wait
for a server and pay nothing per turn: the tools are ordinary entries of the
tool snapshot.
A lazily started server left unused for ``idle_timeout`` is ended again
(:meth:`McpServer.end_idle`). ``startup = "eager"`` servers are started in the
background at startup and kept running. ``tools/list_changed`` replaces the
cached list and the offered tools at once (:meth:`McpManager.changed` asks Roost
to collect tools again).

A ``per_user`` stdio server runs once per workspace it is used from (its cwd
is the workspace), up to :data:`MAX_USER_PROCESSES` at a time, the least
recently used ended first; its tools are listed by an instance started in an
empty scratch directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types as types

from plugins.mcp import PLUGIN
from plugins.mcp.connection import RESTART, Connection, ServerDown
from roost import McpServerConfig, Runtime, Settings, ToolContext

__all__ = ["MAX_USER_PROCESSES", "McpManager", "McpServer", "ToolCache"]

log = logging.getLogger("roost.plugins.mcp")

MAX_USER_PROCESSES = 16
"""Per-user server processes kept at once (per server); the least recently used go first."""

CACHE_FILE = "mcp-tools.json"

ERROR_PREFIX = "MCP servers that could not be started: "


class ToolCache:
    """Each server's last tool list on disk, valid while its configuration is unchanged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, Any] = {}
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self._data = loaded
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("MCP tool cache %s unreadable (%s); servers will be listed again",
                        path, exc)

    def get(self, server: str, fingerprint: str) -> list[types.Tool] | None:
        """The cached tools of ``server``, or ``None`` when absent or stale."""
        entry = self._data.get(server)
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
            return None
        try:
            return [types.Tool.model_validate(t) for t in entry.get("tools", [])]
        except ValueError:
            return None

    def put(self, server: str, fingerprint: str, tools: list[types.Tool]) -> None:
        """Remember ``tools`` (written at once, atomically; a failure is only logged)."""
        self._data[server] = {
            "fingerprint": fingerprint,
            "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                      for t in tools]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".mcp-tools-")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self._data, out)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("MCP tool cache %s not written: %s", self.path, exc)


def fingerprint(config: McpServerConfig) -> str:
    """A digest of what decides a server's tools (its whole configuration)."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


class McpServer:
    """One configured server: its tool list and its connection (one per workspace
    for ``per_user``)."""

    def __init__(self, name: str, config: McpServerConfig, cache: ToolCache,
                 on_change: Callable[[McpServer], None],
                 on_failure: Callable[[str, str], None] | None = None) -> None:
        self.name = name
        self.on_failure = on_failure
        """``on_failure(server, why)``: a start failed (``why`` is ``""`` once it ran)."""
        self.config = config
        self.cache = cache
        self.on_change = on_change
        self.fingerprint = fingerprint(config)
        cached = cache.get(name, self.fingerprint)
        self.tools: list[types.Tool] = cached or []
        self.listed = cached is not None
        """Whether :attr:`tools` came from the server (now or an earlier run)."""
        self.list_error = ""
        self.shared: Connection | None = None
        self.users: OrderedDict[str, Connection] = OrderedDict()
        self._lister: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._answered = asyncio.Event()
        """Set once a listing answered: the tools, or why the server could not start."""

    # ---- lifecycle

    def start(self, *, listing: bool = False) -> None:
        """Begin what the startup mode asks for, in the background (returns at once).

        ``listing`` lists the tools again even when a list is cached (``/mcp restart``).
        """
        if listing:
            self.listed = False
        if self.config.startup == "eager" and not self.config.per_user:
            self._shared().start()
        elif not self.listed and (self._lister is None or self._lister.done()):
            self._lister = asyncio.create_task(self._list_until_listed(),
                                               name=f"listing MCP server {self.name}")

    async def stop(self) -> None:
        """End every process and connection of this server."""
        if self._lister is not None:
            self._lister.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lister
        connections = [c for c in (self.shared, *self.users.values()) if c is not None]
        self.users.clear()
        await asyncio.gather(*(c.stop() for c in connections), *self._stopping)

    async def _list_until_listed(self) -> None:
        """List the tools with a throwaway instance, retrying on :data:`RESTART` waits."""
        failures = 0
        scratch = Path(tempfile.mkdtemp(prefix="roost-mcp-")) if self.config.per_user else None
        try:
            while not self.listed:
                probe = Connection(self.name, self.config, cwd=scratch, restart=False)
                try:
                    self._take(await probe.list_once())
                    self.list_error = ""
                    self._failed("")
                    return
                except ServerDown:
                    self.list_error = probe.error
                    self._failed(probe.error)
                failures += 1
                delay = RESTART.delay(failures)
                log.warning("MCP server %s: listing its tools failed (%s); again in %.1fs",
                            self.name, self.list_error, delay)
                await asyncio.sleep(delay)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    async def wait_listed(self, limit: float) -> bool:
        """Wait until the tools are listed or a listing failed, at most ``limit``
        seconds; whether they are listed."""
        if not self.listed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await self._answered.wait()
        return self.listed

    def _failed(self, why: str) -> None:
        if why:
            self._answered.set()
        if self.on_failure is not None:
            self.on_failure(self.name, why)

    def _shared(self) -> Connection:
        if self.shared is None:
            self.shared = Connection(self.name, self.config, on_tools=self._on_tools,
                                     on_failure=self._failed)
        return self.shared

    def _for_workspace(self, workspace: Path) -> Connection:
        key = str(workspace)
        connection = self.users.get(key)
        if connection is None:
            connection = Connection(self.name, self.config, cwd=workspace,
                                    on_tools=self._on_tools)
            self.users[key] = connection
            while len(self.users) > MAX_USER_PROCESSES:
                self._stop_later(self.users.popitem(last=False)[1])
        self.users.move_to_end(key)
        return connection

    def end_idle(self) -> None:
        """End connections unused for ``idle_timeout`` (not an eager server's); in the
        background. Their tools stay offered; the next call starts them again."""
        limit = self.config.idle_timeout
        if not limit:
            return
        idle = [key for key, c in self.users.items() if c.running and c.idle_for() >= limit]
        for key in idle:
            self._stop_later(self.users.pop(key))
        shared = self.shared
        if (shared is not None and self.config.startup == "lazy" and shared.ready
                and shared.idle_for() >= limit):
            log.info("MCP server %s unused for %.0fs: ending it", self.name, limit)
            self._stop_later(shared)

    def _stop_later(self, connection: Connection) -> None:
        task = asyncio.create_task(connection.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def connection_for(self, workspace: Path) -> Connection:
        """The connection a call from ``workspace`` uses (made, not started, if new)."""
        return self._for_workspace(workspace) if self.config.per_user else self._shared()

    # ---- tools

    def _on_tools(self, _connection: Connection, tools: list[types.Tool]) -> None:
        self._take(tools)

    def _take(self, tools: list[types.Tool]) -> None:
        changed = not self.listed or _dump(tools) != _dump(self.tools)
        self.tools = tools
        self.listed = True
        self._answered.set()
        if changed:
            self.cache.put(self.name, self.fingerprint, tools)
            self.on_change(self)

    async def call(self, tool: str, arguments: dict[str, Any],
                   context: ToolContext) -> types.CallToolResult:
        """Call ``tool``, starting the server first if it is not running."""
        connection = self.connection_for(context.workspace)
        budget = max(0.1, context.remaining())
        await connection.wait_ready(min(self.config.connect_timeout, budget))
        limit = min(self.config.timeout, max(0.1, context.remaining()))
        return await connection.call(tool, arguments, limit)

    # ---- reporting

    def status(self) -> dict[str, Any]:
        """State, tool count and last error, for ``/mcp`` and ``roost mcp list``."""
        connections = [c for c in (self.shared, *self.users.values()) if c is not None]
        if not self.config.enabled:
            state, detail = "disabled", ""
        elif connections:
            running = [c for c in connections if c.state == "ready"]
            worst = next((c for c in connections if c.state in ("restarting", "starting")),
                         None)
            if worst is not None:
                state, detail = worst.state, worst.describe()
            elif running:
                state, detail = "running", ""
            elif connections[0].error:
                state, detail = "stopped", connections[0].error
            else:
                state, detail = "idle", "starts when a tool is called"
            if self.config.per_user:
                detail = f"{len(running)} running for workspaces; {detail}".rstrip("; ")
        elif not self.listed:
            state = "failed" if self.list_error else "listing"
            detail = self.list_error
        else:
            state, detail = "idle", "starts when a tool is called"
        return {"name": self.name, "transport": self.config.kind,
                "startup": self.config.startup, "per_user": self.config.per_user,
                "state": state, "tools": len(self.tools), "detail": detail}


class McpManager:
    """Every configured MCP server of one service, and the tools they offer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cache = ToolCache(settings.data_dir / CACHE_FILE)
        self.servers = {name: McpServer(name, config, self.cache, self.changed, self.failed)
                        for name, config in settings.mcp.servers.items()}
        self.failures: dict[str, str] = {}
        """Servers whose last start failed, and why (shown by /status)."""
        self.runtime: Runtime | None = None
        self.version = 0
        """Bumped whenever a server's tool list changes (the adapter rebuilds then)."""
        self.suspended = False
        self._refreshing = False
        self._dirty = False

    def suspend(self) -> None:
        """Mark the servers as ended because the plugin was disabled (:meth:`start` resumes)."""
        self.suspended = True

    def start(self, runtime: Runtime | None) -> None:
        """Start what each server's mode asks for, in the background; never waits."""
        if runtime is not None:
            self.runtime = runtime
        self.suspended = False
        for server in self.servers.values():
            if server.config.enabled:
                server.start()

    async def first_listing(self) -> None:
        """Wait for the first listing of every enabled server never listed before (each
        at most its ``connect_timeout``), then offer what was listed.

        :func:`plugins.mcp.roost_startup` holds runs on this, so the first message
        after a start sees a new server's tools instead of racing their listing.
        """
        waiting = [s for s in self.servers.values() if s.config.enabled and not s.listed]
        listed = await asyncio.gather(*(s.wait_listed(s.config.connect_timeout)
                                        for s in waiting))
        if any(listed) and self.runtime is not None:
            await self.runtime.refresh_tools()

    async def stop(self) -> None:
        """End every server (all at once: each may take its 2 s + 2 s shutdown)."""
        await asyncio.gather(*(s.stop() for s in self.servers.values()))

    def end_idle(self) -> None:
        """:meth:`McpServer.end_idle` for every server."""
        for server in self.servers.values():
            server.end_idle()

    def changed(self, _server: McpServer) -> None:
        """A tool list changed: have Roost collect the tools again (coalesced)."""
        self.version += 1
        runtime = self.runtime
        if runtime is None:
            return  # before startup: the first collection is still to come
        if self._refreshing:
            self._dirty = True
            return
        self._refreshing = True
        runtime.background(self._refresh(runtime), "offering the new MCP tool list")

    async def _refresh(self, runtime: Runtime) -> None:
        try:
            self._dirty = True
            while self._dirty:
                self._dirty = False
                await runtime.refresh_tools()
        finally:
            self._refreshing = False

    def failed(self, server: str, why: str) -> None:
        """Server ``server`` could not be started (``why``), or runs again (``""``).

        Failing servers are listed as this plugin's error, which ``/status`` and
        ``roost plugins list`` show; it goes away once every server has started.
        """
        if why:
            self.failures[server] = why
        else:
            self.failures.pop(server, None)
        if self.runtime is None:
            return
        errors = self.runtime.plugins.errors
        text = "; ".join(f"{name}: {error}" for name, error in sorted(self.failures.items()))
        if text:
            errors[PLUGIN] = f"{ERROR_PREFIX}{text}"
        elif errors.get(PLUGIN, "").startswith(ERROR_PREFIX):
            del errors[PLUGIN]

    def status(self) -> list[dict[str, Any]]:
        """Each server's :meth:`McpServer.status`, by name."""
        return [s.status() for _, s in sorted(self.servers.items())]


def _dump(tools: list[types.Tool]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
