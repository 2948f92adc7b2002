"""One connection to an MCP server, kept alive: start, list tools, call, restart, stop.

A :class:`Connection` owns a supervisor task. The task opens the MCP client
(spawning the process for a stdio server), lists the tools, and then waits
until the connection is lost (the process exited, the HTTP server stopped
answering) or :meth:`Connection.stop` is called. A lost connection is
restarted after :data:`RESTART` delays: about half a second first, doubling
to at most a minute, starting over once a connection lasted a minute.
Meanwhile calls fail at once (:class:`ServerDown`); a call that was in flight
when the connection was lost raises :class:`CallLost` and is never sent again,
since the server may have acted on it.

The MCP SDK's client is built on anyio task groups, which must be entered and
left by the same task: everything that opens or closes the client runs in
the supervisor task; other tasks only send requests through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from plugins.mcp.transport import describe_failure, open_transport, watched, with_stderr
from roost import McpServerConfig, RetryPolicy

__all__ = ["RESTART", "STABLE_AFTER", "CallLost", "Connection", "ServerDown", "State"]

log = logging.getLogger("roost.plugins.mcp")

RESTART = RetryPolicy(attempts=1_000_000, base_delay=0.5, multiplier=2.0, max_delay=60.0,
                      jitter=0.2, jitter_mode="up")
"""Waits before restarting a lost server: 0.5-0.6 s, doubling to 60 s (72 s with jitter)."""

STABLE_AFTER = 60.0
"""A connection that lasted this many seconds restarts from the shortest wait again."""

MAX_LIST_PAGES = 100
"""tools/list pages read at most (a server paginating forever cannot hang Roost)."""

State = Literal["stopped", "starting", "ready", "restarting"]

ToolsCallback = Callable[["Connection", list[types.Tool]], None]
FailureCallback = Callable[[str], None]

_CLIENT_INFO = types.Implementation(name="roost", version="0.1.0")


class ServerDown(Exception):
    """The server is not connected now; nothing was sent. ``retry_after`` is in seconds."""

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CallLost(Exception):
    """The connection was lost while a call was in flight; the server may have acted on it."""


class Connection:
    """One live client of one MCP server (one process for stdio), restarted when lost.

    ``cwd`` overrides the configured working directory (per-user servers run in
    the workspace). ``on_tools(connection, tools)`` is called with every listing:
    after each start and after each ``tools/list_changed``. ``restart=False``
    makes a one-shot connection (listing a server, ``roost mcp test``).
    """

    mode = "auto"
    """How the protocol version is agreed: ``auto`` tries the 2026 ``server/discover`` and
    falls back to the ``initialize`` handshake older servers know (``legacy`` forces it)."""

    def __init__(self, name: str, config: McpServerConfig, *, cwd: Path | None = None,
                 on_tools: ToolsCallback | None = None,
                 on_failure: FailureCallback | None = None, restart: bool = True,
                 environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 policy: RetryPolicy = RESTART) -> None:
        self.name = name
        self.config = config
        self.cwd = cwd if cwd is not None else config.cwd
        self.on_tools = on_tools
        self.on_failure = on_failure
        """Told why a start failed, and ``""`` once the server runs."""
        self.restart = restart
        self.environ = environ if environ is not None else os.environ
        self.clock = clock
        self.policy = policy
        self.state: State = "stopped"
        self.error = ""
        """Why the last start failed or the last connection ended ('' when none did)."""
        self.tools: list[types.Tool] = []
        self.ever_ready = False
        self.ready_at = 0.0
        self.retry_at = 0.0
        self.restarts = 0
        self.protocol_version = ""
        self.last_used = clock()
        self.in_flight = 0
        """Calls sent and not answered yet (an idle server is ended only with none)."""
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._attempt_done = asyncio.Event()
        self._relist = asyncio.Event()
        self._stopping = False
        self._wanted = False
        self._lost_reason = ""

    # ---- lifecycle

    @property
    def running(self) -> bool:
        """Whether the supervisor task is alive (connected, starting or waiting to restart)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the supervisor if it is not running (returns at once).

        Called while a :meth:`stop` is still ending the previous connection, it
        starts again once that is over.
        """
        if self.running and not self._stopping:
            return
        previous = self._task if self.running else None
        self._wanted = True
        self._attempt_done.clear()
        self.state = "starting"
        self._task = asyncio.create_task(self._after(previous), name=f"mcp server {self.name}")

    async def _after(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(previous)
        if not self._wanted:  # stopped again meanwhile
            self.state = "stopped"
            self._attempt_done.set()
            return
        self._stopping = False
        await self._supervise()

    async def stop(self) -> None:
        """End the connection; a stdio server gets its stdin closed, SIGTERM after 2 s,
        then SIGKILL (the SDK's shutdown sequence). Returns once it is over."""
        self._stopping = True
        self._wanted = False
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        if self._task is task and not self._wanted:
            self.state = "stopped"

    async def list_once(self) -> list[types.Tool]:
        """Connect, list the tools and disconnect (``restart=False`` connections);
        raises :class:`ServerDown` saying why it failed."""
        self.restart = False
        self.start()
        assert self._task is not None
        await asyncio.shield(self._task)
        if not self.ever_ready:
            raise ServerDown(self.describe())
        return self.tools

    @property
    def ready(self) -> bool:
        """Whether calls can be sent now."""
        return self.state == "ready"

    async def wait_ready(self, limit: float) -> None:
        """Start if needed and wait until connected; :class:`ServerDown` otherwise.

        A server waiting to be restarted fails at once, saying when it will be tried.
        """
        self.last_used = self.clock()
        if self.state == "ready":
            return
        if self.state == "restarting":
            raise ServerDown(self.describe(), max(0.0, self.retry_at - self.clock()))
        self.start()
        try:
            async with asyncio.timeout(limit):
                await self._attempt_done.wait()
        except TimeoutError:
            raise ServerDown(f"MCP server '{self.name}' did not start within {limit:g}s; "
                             "try again later") from None
        if not self.ready:
            raise ServerDown(self.describe(), max(0.0, self.retry_at - self.clock()))

    def describe(self) -> str:
        """The state in one sentence, for errors, ``/mcp`` and ``roost mcp list``."""
        if self.state == "ready":
            return f"MCP server '{self.name}' is running"
        if self.state == "starting":
            return f"MCP server '{self.name}' is starting"
        if self.state == "stopped":
            return f"MCP server '{self.name}' is not running" + (
                f" ({self.error})" if self.error else "")
        wait = max(0.0, self.retry_at - self.clock())
        what = "crashed" if self.ever_ready else "could not be started"
        return (f"MCP server '{self.name}' {what} ({self.error or 'no reason given'}); "
                f"next start in {wait:.1f}s")

    # ---- calls

    async def call(self, tool: str, arguments: dict[str, Any],
                   limit: float) -> types.CallToolResult:
        """Call ``tool``; raises :class:`ServerDown`, :class:`CallLost`, :class:`MCPError`."""
        client = self._client
        self.last_used = self.clock()
        if client is None or self.state != "ready":
            raise ServerDown(self.describe(), max(0.0, self.retry_at - self.clock()))
        self.in_flight += 1
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=limit)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self.lost("the connection closed during a call")
                raise CallLost(self._lost_text()) from exc
            raise
        except (httpx2.TransportError, OSError, anyio.BrokenResourceError,
                anyio.ClosedResourceError) as exc:
            self.lost(f"{type(exc).__name__}: {exc}")
            raise CallLost(self._lost_text()) from exc
        finally:
            self.in_flight -= 1
            self.last_used = self.clock()

    def idle_for(self) -> float:
        """Seconds since the last call ended or the server became ready (0 while a call
        is in flight or the server is not ready: a starting server is about to be used)."""
        if self.in_flight or self.state != "ready":
            return 0.0
        return max(0.0, self.clock() - self.last_used)

    def lost(self, reason: str) -> None:
        """Mark the connection as lost (a call saw it fail); the supervisor restarts it.

        Calls fail fast from here on, before the supervisor has even noticed.
        """
        if self.state == "ready" and not self._stopping:
            self._lost_reason = self._lost_reason or reason
            self.error = self._lost_reason
            self.state = "restarting"
            self.retry_at = self.clock() + self.policy.backoff(1)
            self._client = None
        self._wake.set()

    def _lost_text(self) -> str:
        return (f"MCP server '{self.name}' stopped while handling this call "
                f"({self._lost_reason or 'connection lost'}); it is being restarted. "
                "The call was not repeated because the server may have acted on it.")

    # ---- the supervisor

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            self._attempt_done.clear()
            self.state = "starting"
            self._lost_reason = ""
            try:
                await self._session()
            except Exception as exc:
                self.error = describe_failure(exc)
                log.warning("MCP server %s: %s", self.name, self.error)
                if self.on_failure is not None:
                    self.on_failure(self.error)
            finally:
                self._client = None
            if self._stopping:
                break
            self.state = "restarting"
            self._attempt_done.set()
            if not self.restart:
                break
            if self.ever_ready and self.ready_at and self.clock() - self.ready_at >= STABLE_AFTER:
                failures = 0
            failures += 1
            delay = self.policy.delay(failures)
            self.retry_at = self.clock() + delay
            log.warning("MCP server %s: restarting in %.1fs", self.name, delay)
            self._wake.clear()
            if self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self.restarts += 1
        if self._task is asyncio.current_task():  # not when a new start follows a stop
            self.state = "stopped"
            self._attempt_done.set()

    async def _session(self) -> None:
        """One connection, from start to loss (returns) or a failed start (raises)."""
        self._wake.clear()
        with contextlib.ExitStack() as files:
            errlog: TextIO | None = None
            if self.config.kind == "stdio":
                errlog = files.enter_context(
                    tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
            await self._connected(errlog)

    async def _connected(self, errlog: TextIO | None) -> None:
        try:
            async with AsyncExitStack() as stack:
                # asyncio's timeout, not anyio's: an anyio cancel scope could not be
                # left while the client's task group, entered inside it, stays open.
                async with asyncio.timeout(self.config.connect_timeout):
                    transport = open_transport(self.config, self.environ, self.cwd, stack,
                                               errlog)
                    client = Client(watched(transport, self._closed), mode=self.mode,
                                    message_handler=self._on_message, cache=None,
                                    client_info=_CLIENT_INFO)
                    await stack.enter_async_context(client)
                self.protocol_version = client.protocol_version
                await self._serve(client)
            if not self._stopping and self.restart:
                reason = self._lost_reason or "the server closed the connection"
                self.error = with_stderr(reason, errlog)
                log.warning("MCP server %s stopped: %s", self.name, self.error)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                exc = TimeoutError(f"no answer within {self.config.connect_timeout:g}s")
            raise RuntimeError(with_stderr(describe_failure(exc), errlog)) from exc

    def _ready(self, client: Client, tools: list[types.Tool]) -> None:
        self.tools = tools
        self._client = client
        self.state = "ready"
        self.error = ""
        self.ever_ready = True
        self.ready_at = self.last_used = self.clock()
        self._attempt_done.set()
        log.info("MCP server %s ready: %d tools (protocol %s)", self.name, len(tools),
                 self.protocol_version)
        if self.on_failure is not None:
            self.on_failure("")
        if self.on_tools is not None:
            self.on_tools(self, tools)

    async def _serve(self, client: Client) -> None:
        """List the tools, then keep the connection until it is lost or stopped,
        listing again on every change."""
        async with anyio.create_task_group() as tg:
            async with asyncio.timeout(self.config.connect_timeout):
                if self.restart and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    # Subscribed before listing: no change falls between the two.
                    await tg.start(self._listener, client)
                tools = await list_tools(client)
            self._ready(client, tools)
            tg.start_soon(self._relister, client)
            if not self._stopping and self.restart:
                await self._wake.wait()
            tg.cancel_scope.cancel()
        self._client = None

    def _closed(self) -> None:
        self.lost("the server closed the connection")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist.set()
        elif isinstance(message, Exception):
            log.debug("MCP server %s: transport error: %s", self.name, message)

    async def _relister(self, client: Client) -> None:
        while True:
            await self._relist.wait()
            self._relist.clear()
            try:
                tools = await list_tools(client)
            except Exception as exc:
                log.warning("MCP server %s: listing tools after a change failed: %s",
                            self.name, describe_failure(exc))
                continue
            self.tools = tools
            log.info("MCP server %s: tool list changed (%d tools)", self.name, len(tools))
            if self.on_tools is not None:
                self.on_tools(self, tools)

    async def _listener(self, client: Client, *,
                        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                        ) -> None:
        """2026-07-28 servers announce changes on a ``subscriptions/listen`` stream;
        ``task_status`` is told once the server acknowledged it (or refused)."""
        started = False
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                task_status.started()
                started = True
                async for _event in subscription:
                    self._relist.set()
        except (ListenNotSupportedError, MCPError, SubscriptionLost, TimeoutError) as exc:
            log.debug("MCP server %s: no change subscription: %s", self.name, exc)
        finally:
            if not started:
                task_status.started()


async def list_tools(client: Client) -> list[types.Tool]:
    """Every tool of the server, following pagination (at most :data:`MAX_LIST_PAGES`)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
