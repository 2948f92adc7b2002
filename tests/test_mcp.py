"""MCP servers' tools through real runs: a server written with the SDK (tests/mcp_servers)
run as a stdio subprocess and as a Streamable HTTP (and SSE) server on 127.0.0.1.

A stdio server is a fork of a process that imported the SDK (tests/mcp_forks.py) but for
the first test, which runs ``python toolbox.py`` itself; starts are still spent where the
behaviour needs them: what does not depend on a process of its own
(calling, results, timeouts, the error channel, ``/mcp``, SSE) talks to one HTTP server
per pytest worker (:func:`toolbox_http`); a stdio server is ``eager`` (one start) where
being lazy is not the point, or its tools are cached (:func:`seed_tool_cache`) where
listing them is not: a lazy server not listed yet is started twice, to list and to call.
The process tests (crash, restart, idle ends, per-user, shutdown) start their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import psutil
import pytest

import plugins.mcp as mcp_plugin
from bot.agents.tool_policy import ToolPolicy
from bot.app.roost import Roost
from bot.config.mcp import McpConfig, McpServerConfig, expand
from bot.config.settings import Settings
from bot.testing.app import ChatChannel, app_factory
from plugins.mcp.connection import Connection
from plugins.mcp.manager import CACHE_FILE, McpManager, ToolCache, fingerprint
from plugins.mcp.naming import MAX_NAME, tool_name, tool_names
from roost import Tool, ToolContext
from tests import mcp_forks
from tests.mcp_forks import SERVERS
from tests.roost_forks import popen

TOOLBOX = str(SERVERS / "toolbox.py")


def stdio(**extra: Any) -> dict[str, Any]:
    """The toolbox on stdio, a fork of a process that imported the SDK (tests/mcp_forks.py)."""
    return mcp_forks.stdio(TOOLBOX, **extra)


def toml_server(name: str, config: dict[str, Any]) -> str:
    """``config`` as the TOML table ``[mcp.servers.NAME]``."""
    lines = [f"[mcp.servers.{name}]"]
    for key, value in config.items():
        if isinstance(value, dict):
            value = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
        else:
            value = json.dumps(value)
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def call(name: str, arguments: dict[str, Any] | None = None,
         reply: str = "done") -> dict[str, Any]:
    """A scripted turn: one tool call, then a reply."""
    return {"steps": [{"tool_calls": [{"name": name, "arguments": arguments or {}}]},
                      {"reply": reply}]}


async def eventually(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Wait until ``predicate()`` holds (servers start in the background)."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


def manager(app: Roost) -> McpManager:
    found = mcp_plugin.manager_of(app.services)
    assert found is not None
    return found


def offered(app: Roost) -> set[str]:
    return set(app.engine.plugins.tools)


def children() -> set[int]:
    """This process's live MCP server processes: the scripts in ``tests/mcp_servers`` (and
    their launchers) and the servers forked for them (:func:`tests.mcp_forks.live`).

    Only those: other processes of the worker come and go on their own (a test
    PostgreSQL server's autovacuum workers and backends are its descendants too).
    """
    found = set(mcp_forks.live())
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.status() != psutil.STATUS_ZOMBIE and \
                    str(SERVERS) in " ".join(process.cmdline()):
                found.add(process.pid)
    return found


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    async with app_factory(tmp_path) as factory:
        yield factory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_http(port: int) -> subprocess.Popen[bytes]:
    """The toolbox as a Streamable HTTP (``/mcp``) and SSE (``/sse``) server on
    127.0.0.1:``port``, listening."""
    process = subprocess.Popen([sys.executable, TOOLBOX, "--http", str(port)],
                               stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            assert process.poll() is None, "the HTTP server exited"
            assert time.monotonic() < deadline, "the HTTP server never listened"
            time.sleep(0.05)


def end(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:  # uvicorn waits for open streams to end
        process.kill()
        process.wait(5)


@pytest.fixture(scope="session")
def toolbox_http() -> Iterator[str]:
    """The toolbox as an HTTP server on 127.0.0.1, shared by this module's tests run by one
    xdist worker; its base URL (Streamable HTTP at ``/mcp``, SSE at ``/sse``).

    Kept for the whole session, not the module: the suite runs ``slow`` tests first
    (tests/conftest.py), so a worker comes back to this module after others and would
    start it again. Tests that use it must not change it (``grow``, ``crash``) nor
    depend on its process.
    """
    port = free_port()
    process = serve_http(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        end(process)


@pytest.fixture(scope="session")
def toolbox_tools(toolbox_http: str) -> list[mcp_types.Tool]:
    """The toolbox's tool list, as the shared server lists it."""
    config = McpServerConfig(url=f"{toolbox_http}/mcp")
    return asyncio.run(Connection("toolbox", config, restart=False).list_once())


def seed_tool_cache(data_dir: Path, tools: list[mcp_types.Tool],
                    servers: dict[str, Any]) -> Path:
    """``data_dir`` with ``tools`` cached as the tool list of each of ``servers`` (an
    ``mcp.servers`` table), as an earlier run of Roost would have left it: lazy and
    per-user servers then start only when called, not also once to be listed."""
    cache = ToolCache(data_dir / CACHE_FILE)
    for name, config in McpConfig.model_validate({"servers": servers}).servers.items():
        cache.put(name, fingerprint(config), tools)
    return data_dir


# ---- names and configuration


def test_tool_names_are_server_prefixed_and_safe_for_providers() -> None:
    assert tool_name("toolbox", "add") == "toolbox__add"
    assert tool_name("toolbox", "echo.upper") == "toolbox__echo_upper"
    assert tool_name("my-server", "ünïcode tool/x") == "my-server___n_code_tool_x"


def test_long_tool_names_are_cut_with_a_stable_hash() -> None:
    long = "a" * 100
    name = tool_name("server", long)
    assert len(name) == MAX_NAME
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", name)
    assert name == tool_name("server", long)
    assert name != tool_name("server", long + "b")


def test_tool_names_that_collide_after_cleaning_get_distinct_names() -> None:
    names = tool_names("s", ["a.b", "a_b"])
    assert len(names) == 2
    assert set(names.values()) == {"a.b", "a_b"}
    assert all(len(n) <= MAX_NAME for n in names)


def test_tools_of_two_servers_that_would_share_a_name_get_distinct_names() -> None:
    first = tool_names("a", ["b__c"])
    second = tool_names("a__b", ["c"], taken=first)
    assert list(first) == ["a__b__c"]
    [other] = second
    assert other != "a__b__c" and len(other) <= MAX_NAME
    assert second == tool_names("a__b", ["c"], taken=first)  # stable


def test_a_server_needs_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ValueError, match="either command"):
        McpConfig.model_validate({"servers": {"x": {}}})
    with pytest.raises(ValueError, match="either command"):
        McpConfig.model_validate({"servers": {"x": {"command": "a", "url": "http://b"}}})
    with pytest.raises(ValueError, match="per_user"):
        McpConfig.model_validate({"servers": {"x": {"url": "http://b", "per_user": True}}})
    with pytest.raises(ValueError, match="name"):
        McpConfig.model_validate({"servers": {"bad name": {"command": "a"}}})
    sse = McpConfig.model_validate({"servers": {"x": {"url": "http://b", "transport": "sse"}}})
    assert sse.servers["x"].kind == "sse"


def test_config_show_masks_env_and_header_values_but_not_references() -> None:
    settings = Settings(mcp={"servers": {
        "gh": stdio(env={"TOKEN": "${GITHUB_TOKEN}", "LITERAL": "s3cret-value"}),
        "web": {"url": "http://127.0.0.1:1/mcp",
                "headers": {"Authorization": "Bearer s3cret-value"}}}})
    shown = settings.masked()["mcp"]["servers"]
    assert shown["gh"]["env"] == {"TOKEN": "${GITHUB_TOKEN}", "LITERAL": "********"}
    assert shown["web"]["headers"] == {"Authorization": "********"}
    assert "s3cret-value" not in repr(settings.masked())


def test_references_are_expanded_from_the_environment() -> None:
    assert expand("Bearer ${T}", {"T": "abc"}) == "Bearer abc"
    with pytest.raises(KeyError):
        expand("${MISSING}", {})


def test_group_entries_select_one_server_or_all_of_them() -> None:
    async def nothing(context: ToolContext, args: Any) -> str:
        return ""

    tools = {name: Tool(name, "", {"type": "object"}, nothing)
             for name in ("a__x", "b__y", "read_file")}
    groups = {"a__x": "mcp:a", "b__y": "mcp:b", "read_file": "plugins.file_tools"}
    one = ToolPolicy(profile="minimal", allow=("group:mcp:a",))
    assert set(one.filter(tools, groups)) == {"a__x"}
    every = ToolPolicy(deny=("group:mcp",))
    assert set(every.filter(tools, groups)) == {"read_file"}


# ---- through runs


async def test_stdio_server_tools_are_listed_and_called_through_a_run(make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__add", {"a": 2, "b": 3}, "five"),
         call("toolbox__echo_upper", {"text": "quiet"}, "loud")],
        # Lazy, the default, and not listed yet: one process lists the tools and ends,
        # the first call starts another (the other stdio tests start one: eager or cached).
        # `python toolbox.py` itself, as configured outside the tests: the real cold start
        # (the other tests fork it, tests/mcp_forks.py).
        mcp={"servers": {"toolbox": {"command": sys.executable, "args": [TOOLBOX]}}})
    app = chat.app
    await eventually(lambda: "toolbox__add" in offered(app), "tools listed")
    assert {"toolbox__add", "toolbox__echo_upper", "toolbox__crash"} <= offered(app)
    spec = app.engine.plugins.tools["toolbox__add"].spec()
    assert spec.input_schema["required"] == ["a", "b"]
    assert app.engine.plugins.tool_groups["toolbox__add"] == "mcp:toolbox"
    assert await chat.ask("add 2 and 3") == ["five"]
    assert chat.tool_results("toolbox__add") == ["5"]
    assert await chat.ask("shout") == ["loud"]
    assert chat.tool_results("toolbox__echo_upper") == ["QUIET"]
    offered_to_model = {t.name for t in chat.requests[-1].tools}
    assert "toolbox__add" in offered_to_model


async def test_http_server_tools_are_listed_and_called_through_a_run(
        toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make(
        [call("web__add", {"a": 40, "b": 2}, "42")],
        mcp={"servers": {"web": {"url": f"{toolbox_http}/mcp",
                                 "headers": {"X-Test": "${HOME}"}}}})
    await eventually(lambda: "web__add" in offered(chat.app), "HTTP tools listed")
    assert await chat.ask("add") == ["42"]
    assert chat.tool_results("web__add") == ["42"]


async def test_an_sse_server_works_for_older_servers(toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make(
        [call("old__add", {"a": 20, "b": 1}, "21")],
        mcp={"servers": {"old": {"url": f"{toolbox_http}/sse", "transport": "sse"}}})
    await eventually(lambda: "old__add" in offered(chat.app), "SSE tools listed")
    assert await chat.ask("add") == ["21"]
    assert chat.tool_results("old__add") == ["21"]


async def test_a_call_longer_than_the_timeout_fails_as_a_timeout(
        toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__slow", {"seconds": 30}), call("toolbox__add", {"a": 1, "b": 2})],
        mcp={"servers": {"toolbox": {"url": f"{toolbox_http}/mcp", "timeout": 0.5,
                                     "startup": "eager"}}})
    app = chat.app
    await eventually(lambda: "toolbox__slow" in offered(app), "tools listed")
    await chat.ask("slow")
    [slow] = chat.tool_results("toolbox__slow")
    assert "TIMEOUT" in slow and "0.5s" in slow
    await chat.ask("add")  # the server is still there for the next call
    assert chat.tool_results("toolbox__add") == ["3"]


@pytest.mark.slow
async def test_an_http_server_that_went_away_is_reconnected_when_it_is_back(
        make: Any) -> None:
    port = free_port()
    process = serve_http(port)
    try:
        chat: ChatChannel = await make(
            [call("web__add", {"a": 1, "b": 1})], loop=True,
            mcp={"servers": {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                     "startup": "eager", "connect_timeout": 5}}})
        app = chat.app
        connection = manager(app).servers["web"].shared
        assert connection is not None
        await eventually(lambda: connection.ready, "connected")
        await chat.ask("add")
        assert chat.tool_results("web__add") == ["2"]
        process.kill()
        process.wait(10)
        await chat.ask("add")  # an HTTP server's loss is seen by the next request
        assert "web" in chat.tool_results("web__add")[-1]  # refused or lost, never "2"
        assert chat.tool_results("web__add")[-1] != "2"
        process = serve_http(port)
        await eventually(lambda: connection.ready, "reconnected")
        await chat.ask("add")
        assert chat.tool_results("web__add")[-1] == "2"
    finally:
        end(process)


async def test_a_tool_error_goes_through_the_error_channel(
        toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make([call("toolbox__fail", {"reason": "disk on fire"})],
                                   mcp={"servers": {"toolbox": {"url": f"{toolbox_http}/mcp"}}})
    await eventually(lambda: "toolbox__fail" in offered(chat.app), "tools listed")
    await chat.ask("fail please")
    [result] = chat.tool_results("toolbox__fail")
    assert "Tool 'toolbox__fail' failed" in result
    error_id = re.search(r"\[Error ID: ([^\]]+)\]", result)
    assert error_id is not None
    errors = chat.app.services.errors
    assert errors is not None
    stored = await errors.get(error_id.group(1))
    assert stored is not None
    assert "disk on fire" in str(stored.raw_error)


async def test_a_crashed_server_is_restarted_and_the_lost_call_not_repeated(
        make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__pid"), call("toolbox__crash"), call("toolbox__pid")],
        mcp={"servers": {"toolbox": stdio(startup="eager")}})
    app = chat.app
    await eventually(lambda: "toolbox__pid" in offered(app), "tools listed")
    await chat.ask("pid")
    first = int(chat.tool_results("toolbox__pid")[0])
    await chat.ask("crash")
    [lost] = chat.tool_results("toolbox__crash")
    assert "stopped while handling this call" in lost
    assert "MCP_CONNECTION_LOST" in lost
    connection = manager(app).servers["toolbox"].shared
    assert connection is not None
    await eventually(lambda: connection.restarts >= 1 and connection.ready, "restarted")
    await chat.ask("pid again")
    second = int(chat.tool_results("toolbox__pid")[-1])
    assert second != first
    assert gone(first)


async def test_calls_fail_fast_while_a_server_waits_to_restart(make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__crash"), *[call("toolbox__add", {"a": 1, "b": 1})] * 6],
        mcp={"servers": {"toolbox": stdio(startup="eager")}})
    app = chat.app
    await eventually(lambda: "toolbox__add" in offered(app), "tools listed")
    connection = manager(app).servers["toolbox"].shared
    assert connection is not None
    await eventually(lambda: connection.ready, "started")
    connection.policy = type(connection.policy)(base_delay=30.0, max_delay=30.0, jitter=0.0)
    await chat.ask("crash")
    await chat.ask("add")
    [down] = chat.tool_results("toolbox__add")
    assert "crashed" in down
    assert "next start in" in down
    assert "UNAVAILABLE" in down
    assert app.engine.tool_metrics.get("toolbox__add").calls == 1  # never retried
    for _ in range(5):
        await chat.ask("add")
    # Five refusals in a row open the tool's breaker, which then answers by itself.
    assert "failed repeatedly and is paused" in chat.tool_results("toolbox__add")[-1]
    assert app.engine.breakers.get("toolbox__add").state == "open"


def test_a_crashed_server_is_restarted_within_two_seconds_backing_off_to_a_minute() -> None:
    from plugins.mcp.connection import RESTART

    assert all(RESTART.delay(1) <= 0.6 for _ in range(100))
    assert RESTART.backoff(2) == 1.0
    assert RESTART.backoff(50) == 60.0


async def test_list_changed_is_picked_up_without_a_restart(make: Any) -> None:
    chat: ChatChannel = await make([call("toolbox__grow"), call("toolbox__hello")],
                                   mcp={"servers": {"toolbox": stdio(startup="eager")}})
    app = chat.app
    await eventually(lambda: "toolbox__grow" in offered(app), "tools listed")
    assert "toolbox__hello" not in offered(app)
    await chat.ask("grow")
    await eventually(lambda: "toolbox__hello" in offered(app), "the new tool offered")
    await chat.ask("hello")
    assert chat.tool_results("toolbox__hello") == ["hello!"]


async def test_list_changed_notifications_of_handshake_era_servers_are_read_too() -> None:
    """2025-era servers send notifications/tools/list_changed on the session itself."""
    listings: list[set[str]] = []
    changed = asyncio.Event()

    def on_tools(_connection: Connection, tools: list[Any]) -> None:
        listings.append({t.name for t in tools})
        if "hello" in listings[-1]:
            changed.set()

    connection = Connection("toolbox", McpServerConfig(**stdio()), on_tools=on_tools)
    connection.mode = "legacy"
    try:
        await connection.wait_ready(60)
        assert connection.protocol_version < "2026"
        await connection.call("grow", {}, 30)
        await asyncio.wait_for(changed.wait(), 30)
    finally:
        await connection.stop()
    assert "hello" not in listings[0]


async def test_results_with_images_and_large_text(toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__picture"), call("toolbox__big", {"size": 40_000})],
        mcp={"servers": {"toolbox": {"url": f"{toolbox_http}/mcp"}}})
    app = chat.app
    await eventually(lambda: "toolbox__picture" in offered(app), "tools listed")
    await chat.ask("picture")
    [picture] = chat.tool_results("toolbox__picture")
    saved = re.search(r"saved as (mcp/toolbox/\S+\.png)", picture)
    assert saved is not None, picture
    assert "here is a picture" in picture
    workspaces = list(app.settings.workspaces_dir.rglob(saved.group(1).split("/")[-1]))
    assert workspaces and workspaces[0].read_bytes().startswith(b"\x89PNG")
    # The model sees the picture itself: the tool's message carries it as an image part.
    shown = next(m for r in chat.requests for m in r.messages if m.role == "tool" and m.parts)
    [part] = shown.parts
    assert (part.kind, part.mime_type, part.path) == ("image", "image/png", saved.group(1))
    assert part.file.read_bytes().startswith(b"\x89PNG")
    await chat.ask("big")
    [big] = chat.tool_results("toolbox__big")
    assert "lorem ipsum" in big
    tool_messages = [m for m in chat.requests[-1].messages if m.role == "tool"]
    assert "call get_tool_result" in tool_messages[-1].content


@pytest.mark.slow
async def test_per_user_servers_run_in_each_workspace(
        make: Any, toolbox_tools: list[mcp_types.Tool], tmp_path: Path) -> None:
    servers = {"files": stdio(per_user=True)}
    data = seed_tool_cache(tmp_path / "data", toolbox_tools, servers)
    chat: ChatChannel = await make([call("files__where")], loop=True, data_dir=data,
                                   mcp={"servers": servers})
    app = chat.app
    assert "files__where" in offered(app)  # from the cache: no instance started to list
    await chat.ask("where am I", sender="alice")
    await chat.ask("where am I", sender="bob")
    alice, bob = chat.tool_results("files__where")
    assert alice != bob
    assert Path(alice).name == "alice" and Path(bob).name == "bob"
    assert len(manager(app).servers["files"].users) == 2


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (reaped, or a zombie); it may be reaped meanwhile."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
async def test_unused_lazy_and_per_user_servers_are_ended_and_start_again(
        make: Any, toolbox_tools: list[mcp_types.Tool], tmp_path: Path) -> None:
    listed = {"lazy": stdio(idle_timeout=0.3), "mine": stdio(per_user=True, idle_timeout=0.3)}
    data = seed_tool_cache(tmp_path / "data", toolbox_tools, listed)
    chat: ChatChannel = await make(
        [call("lazy__pid"), call("mine__pid"), call("eager__pid")], loop=True, data_dir=data,
        mcp={"servers": {**listed, "eager": stdio(startup="eager", idle_timeout=0.3)}})
    app = chat.app
    assert {"lazy__pid", "mine__pid"} <= offered(app)  # from the cache, nothing started
    await eventually(lambda: "eager__pid" in offered(app), "tools listed")
    for _ in range(3):
        await chat.ask("pid")
    lazy, mine, eager = (int(r) for r in chat.tool_results())
    servers = manager(app).servers
    # Ended, and Roost has seen it (a forked server ends before its launcher).
    await eventually(lambda: gone(lazy) and gone(mine) and not servers["mine"].users
                     and servers["lazy"].status()["state"] == "idle", "the idle servers ended")
    assert not gone(eager)  # eager servers stay
    assert {"lazy__pid", "mine__pid"} <= offered(app)  # still offered
    await chat.ask("pid")
    assert int(chat.tool_results("lazy__pid")[-1]) not in (lazy, mine, eager)


async def test_roosts_own_secrets_never_reach_a_server(make: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-not-for-servers")
    chat: ChatChannel = await make([call("toolbox__getenv", {"name": "ANTHROPIC_API_KEY"})],
                                   mcp={"servers": {"toolbox": stdio(startup="eager")}})
    await eventually(lambda: "toolbox__getenv" in offered(chat.app), "tools listed")
    await chat.ask("what is your key")
    assert chat.tool_results("toolbox__getenv") == ["(unset)"]


async def test_env_references_reach_the_server(make: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("ROOST_TEST_MARK", "from-the-environment")
    chat: ChatChannel = await make(
        [call("toolbox__mark")],
        mcp={"servers": {"toolbox": stdio(env={"TOOLBOX_MARK": "${ROOST_TEST_MARK}"},
                                          startup="eager")}})
    await eventually(lambda: "toolbox__mark" in offered(chat.app), "tools listed")
    await chat.ask("mark")
    assert chat.tool_results("toolbox__mark") == ["from-the-environment"]


async def test_a_server_that_never_starts_is_reported_and_blocks_nothing(
        toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__add", {"a": 1, "b": 2}, "three")],
        mcp={"servers": {"broken": mcp_forks.stdio(SERVERS / "broken.py"),
                         "toolbox": {"url": f"{toolbox_http}/mcp"}}})
    app = chat.app
    await eventually(lambda: "toolbox__add" in offered(app), "the good server listed")
    assert await chat.ask("add") == ["three"]
    await eventually(lambda: manager(app).servers["broken"].list_error != "", "failure seen")
    status = mcp_plugin.format_status(manager(app).status())
    assert "broken (stdio, lazy): failed, 0 tools" in status
    assert "missing configuration" in status
    [shown] = await chat.ask("/status")
    assert "plugins.mcp: MCP servers that could not be started: broken:" in shown


async def test_the_mcp_command_is_for_admins(toolbox_http: str, make: Any) -> None:
    chat: ChatChannel = await make([], admins=["console:boss"],
                                   mcp={"servers": {"toolbox": {"url": f"{toolbox_http}/mcp"}}})
    await eventually(lambda: "toolbox__add" in offered(chat.app), "tools listed")
    refused = await chat.ask("/mcp", sender="someone")
    assert "toolbox" not in " ".join(refused)
    [shown] = await chat.ask("/mcp", sender="boss")
    assert "- toolbox (http, lazy): " in shown and "tools" in shown


async def test_an_admin_can_restart_a_server(make: Any) -> None:
    chat: ChatChannel = await make([call("toolbox__pid")], loop=True, admins=["console:boss"],
                                   mcp={"servers": {"toolbox": stdio(startup="eager")}})
    await eventually(lambda: "toolbox__pid" in offered(chat.app), "tools listed")
    await chat.ask("pid", sender="boss")
    first = int(chat.tool_results("toolbox__pid")[0])
    [said] = await chat.ask("/mcp restart toolbox", sender="boss")
    assert "ended; it starts again now" in said
    assert gone(first)
    await chat.ask("pid", sender="boss")
    assert int(chat.tool_results("toolbox__pid")[-1]) != first
    [unknown] = await chat.ask("/mcp restart nope", sender="boss")
    assert "No MCP server named 'nope'" in unknown


async def test_a_lazy_server_with_a_cached_list_starts_on_first_call(
        make: Any, tmp_path: Path) -> None:
    data = tmp_path / "shared-data"
    first: ChatChannel = await make([], data_dir=data, mcp={"servers": {"toolbox": stdio()}})
    await eventually(lambda: "toolbox__add" in offered(first.app), "tools listed")
    await first.app.close()
    before = children()
    second: ChatChannel = await make([call("toolbox__add", {"a": 1, "b": 1}, "two")],
                                     data_dir=data, mcp={"servers": {"toolbox": stdio()}})
    assert "toolbox__add" in offered(second.app)  # from the cache, at once
    assert manager(second.app).servers["toolbox"].status()["state"] == "idle"
    assert children() == before  # nothing started yet
    assert await second.ask("add") == ["two"]
    assert manager(second.app).servers["toolbox"].status()["state"] == "running"


@pytest.mark.slow
async def test_no_server_process_is_left_after_shutdown(
        toolbox_http: str, toolbox_tools: list[mcp_types.Tool], make: Any,
        tmp_path: Path) -> None:
    before = children()  # the shared HTTP server among them: it outlives this Roost
    listed = {"lazy": stdio()}
    data = seed_tool_cache(tmp_path / "data", toolbox_tools, listed)
    chat: ChatChannel = await make(
        [call("eager__pid"), call("lazy__pid"), call("mine__pid")], loop=True, data_dir=data,
        # "mine" is not listed yet: an instance in a scratch directory lists it and must
        # be gone as well (the one lazy listing of a per-user server in these tests).
        mcp={"servers": {**listed, "mine": stdio(per_user=True),
                         "eager": stdio(startup="eager"),
                         "web": {"url": f"{toolbox_http}/mcp"},
                         "stubborn": stdio(startup="eager", env={"TOOLBOX_STUBBORN": "1"})}})
    app = chat.app
    await eventually(lambda: {"eager__pid", "lazy__pid", "mine__pid", "web__pid",
                              "stubborn__pid"} <= offered(app), "every server listed")
    stubborn = manager(app).servers["stubborn"].shared
    assert stubborn is not None
    await eventually(lambda: stubborn.ready, "the stubborn server running")
    await chat.ask("pid")
    await chat.ask("pid")
    await chat.ask("pid")
    pids = [int(r) for r in chat.tool_results()]
    assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
    await app.close()
    assert children() == before
    assert all(gone(p) for p in pids)


async def test_disabling_the_plugin_ends_its_servers(make: Any) -> None:
    chat: ChatChannel = await make([call("toolbox__pid")], loop=True,
                                   mcp={"servers": {"toolbox": stdio(startup="eager")}})
    app = chat.app
    await eventually(lambda: "toolbox__pid" in offered(app), "tools listed")
    await chat.ask("pid")
    pid = int(chat.tool_results("toolbox__pid")[0])
    await app.set_plugin_enabled("plugins.mcp", False)
    assert "toolbox__pid" not in offered(app)
    await eventually(lambda: gone(pid), "server ended")
    await app.set_plugin_enabled("plugins.mcp", True)
    assert "toolbox__pid" in offered(app)
    await chat.ask("pid")
    assert int(chat.tool_results("toolbox__pid")[-1]) != pid


def test_no_mcp_servers_means_no_tools_and_no_command() -> None:
    settings = Settings()
    assert mcp_plugin.roost_tools(settings, object()) is None  # type: ignore[arg-type]
    assert mcp_plugin.roost_commands(settings) is None
    assert os.environ.get("ROOST_MCP") is None


# ---- roost mcp list / test


def _roost_toml(tmp_path: Path, servers: str) -> Path:
    path = tmp_path / "roost.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n{servers}', encoding="utf-8")
    return path


def test_roost_mcp_list_and_test_report_each_server(toolbox_http: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from bot.app.cli import cli

    config = _roost_toml(tmp_path, toml_server("toolbox", stdio())
                         + toml_server("broken", mcp_forks.stdio(SERVERS / "broken.py"))
                         + toml_server("web", {"url": f"{toolbox_http}/mcp"}))
    runner = CliRunner()
    listed = runner.invoke(cli, ["--config", str(config), "mcp", "list"])
    assert listed.exit_code == 1, listed.output
    assert "toolbox (stdio, lazy): ok, 14 tools" in listed.output
    assert "toolbox__echo_upper" in listed.output
    assert "web (http, lazy): ok, 14 tools" in listed.output
    assert "broken (stdio, lazy): FAILED" in listed.output
    assert "missing configuration" in listed.output
    tested = runner.invoke(cli, ["--config", str(config), "mcp", "test", "web"])
    assert tested.exit_code == 0, tested.output
    assert "web__add  (MCP name: add)" in tested.output
    assert "- a: integer" in tested.output
    unknown = runner.invoke(cli, ["--config", str(config), "mcp", "test", "nope"])
    assert unknown.exit_code == 2
    assert "configured: broken, toolbox, web" in unknown.output


async def test_a_start_during_a_stop_starts_again_once_the_stop_is_over() -> None:
    connection = Connection("toolbox", McpServerConfig(**stdio()))
    await connection.wait_ready(60)
    first = (await connection.call("pid", {}, 30)).structured_content
    stopping = asyncio.create_task(connection.stop())
    await asyncio.sleep(0)  # the stop has begun
    connection.start()
    await stopping
    try:
        await connection.wait_ready(60)
        second = (await connection.call("pid", {}, 30)).structured_content
        assert second != first
    finally:
        await connection.stop()
    assert connection.state == "stopped"


# ---- roost run


@pytest.mark.e2e
def test_roost_run_leaves_no_mcp_server_behind(tmp_path: Path) -> None:
    """`roost run` with eager servers (one ignoring SIGTERM) and a lazy unlisted one: they
    start in the background, and SIGTERM ends Roost and every one of them."""
    import signal

    _roost_toml(tmp_path, toml_server("eager", stdio(startup="eager"))
                + toml_server("lazy", stdio())
                + toml_server("stubborn", stdio(env={"TOOLBOX_STUBBORN": "1"}, startup="eager")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_PROVIDER="scripted", ROOST_CONSOLE="1", PYTHONUNBUFFERED="1")
    proc = popen(["run"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while "roost ready" not in (line := proc.stderr.readline()):
            assert line and time.monotonic() < deadline, "roost run never became ready"
        roost = psutil.Process(proc.pid)

        def servers() -> list[psutil.Process]:
            found = []
            for p in roost.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):  # ended (a zombie) meanwhile
                    if TOOLBOX in " ".join(p.cmdline()):
                        found.append(p)
            return found

        # The eager ones stay; the lazy one lists and ends. Each is a launcher (a child
        # of Roost's) and the server it forked (tests/mcp_forks.py).
        while len(servers()) < 2 or len(mcp_forks.live()) < 2:
            assert time.monotonic() < deadline, "no MCP server was started"
            time.sleep(0.05)
        started = servers()
        forked = set(mcp_forks.live())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not [p for p in started if p.is_running()
                    and p.status() != psutil.STATUS_ZOMBIE]
        assert forked.isdisjoint(mcp_forks.live())
    finally:
        if proc.poll() is None:
            proc.kill()


def test_roost_without_mcp_servers_never_imports_the_sdk() -> None:
    """Half a second of imports is paid only by those who configure a server."""
    code = ("import sys\n"
            "from bot.pluginhost.manager import get_plugin_manager\n"
            "import plugins.mcp\n"
            "from bot.config.settings import Settings\n"
            "get_plugin_manager(load_entry_points=False)\n"
            "assert plugins.mcp.roost_tools(Settings(), object()) is None\n"
            "print('mcp' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "False"
