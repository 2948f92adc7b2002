"""MCP benchmark: what configured MCP servers cost per turn, and what one call costs.

Run with ``.venv/bin/python bench/bench_mcp.py`` (about 40 s on 2 cores; ``--rounds``
prints each round's p50s, to see how much the machine's load moves them).

1. Per-turn overhead with 3 MCP servers configured (12 tools each, lazy, their
   tool lists already cached from an earlier start, so no process runs until a
   tool is called): the p50 of a whole text-only turn (scripted model, console
   chat) with and without them, and the part that offering their 36 tools adds
   to every turn (the agent's policy filter, cached per plugin state, plus the
   tool specs handed to the model), measured alone. A control turn offers 36
   ordinary plugin tools instead: more tools make every turn's prompt (one line
   per tool) and its token estimate longer, whoever offers them.
2. MCP call overhead over stdio: p50/p99 of ``tools/call`` on the test toolbox
   server (``add``) through Roost's connection, and through the Roost tool
   (what the executor runs: the connection plus the result rendering).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table, quiet_logging, targets_line, verdict
from bot.testing.app import build_app
from plugins.mcp import manager_of
from plugins.mcp.connection import Connection
from plugins.mcp.manager import McpServer
from roost import Tool, ToolContext, hookimpl

TOOLBOX = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "toolbox.py"
TURNS = 100
ROUNDS = 11
WARMUP = 30
OFFER_ROUNDS = 20_000
CALLS = 1_000
TARGET_OFFER_MS = 1.0


def servers(n: int) -> dict[str, Any]:
    return {"servers": {f"s{i}": {"command": sys.executable, "args": [str(TOOLBOX)]}
                        for i in range(n)}}


class PlainTools:
    """A plugin offering 36 ordinary tools with MCP-like schemas: the control that tells the
    cost of offering more tools (prompt lines, token estimates) from MCP's own."""

    @staticmethod
    @hookimpl
    def roost_tools() -> list[Tool]:
        async def run(context: ToolContext, args: Any) -> str:
            return ""

        schema = {"type": "object", "properties": {"a": {"type": "integer", "title": "A"},
                                                    "b": {"type": "integer", "title": "B"}},
                  "required": ["a", "b"]}
        return [Tool(f"plain__tool_{i}", f"Plain tool {i}: adds two integers.", schema, run)
                for i in range(36)]


async def turn_p50s(variants: dict[str, tuple[Path, int, tuple[object, ...]]]
                    ) -> dict[str, tuple[float, int, int]]:
    """Per variant: p50 ms of a text-only turn, tools offered, server processes started.

    The variants take turns, ``ROUNDS`` rounds of ``TURNS`` turns each, and the median of
    the rounds' p50s is kept: on a shared machine the load changes between rounds.
    """
    chats = {}
    for name, (data, n_servers, plugins) in variants.items():
        chats[name] = await build_app([{"reply": "ok"}], *plugins, data_dir=data, loop=True,
                                      mcp=servers(n_servers), dm_policy="open")
    try:
        for chat in chats.values():
            for _ in range(WARMUP):
                await chat.ask("hello")
        rounds: dict[str, list[float]] = {name: [] for name in chats}
        for _ in range(ROUNDS):
            for name, chat in chats.items():
                times = []
                for _ in range(TURNS):
                    began = time.perf_counter()
                    await chat.ask("hello")
                    times.append((time.perf_counter() - began) * 1000)
                rounds[name].append(percentile(times, 50))
                if "--rounds" in sys.argv:
                    print(name, round(percentile(times, 50), 2), file=sys.stderr)
        out = {}
        for name, chat in chats.items():
            assert chat.app is not None
            manager = manager_of(chat.app.services)
            started = 0 if manager is None else sum(
                1 for s in manager.servers.values() if s.shared is not None)
            agent = await chat.app.router.get("default")
            plugins = chat.app.engine.plugins
            offered = len(agent.tools(plugins.tools, plugins.tool_groups))
            out[name] = (statistics.median(rounds[name]), offered, started)
        return out
    finally:
        for chat in chats.values():
            assert chat.app is not None
            await chat.app.close()


async def offer_cost(data: Path) -> tuple[float, float]:
    """ms per turn spent offering tools (filter + specs), without and with 3 servers."""
    out = []
    for n in (0, 3):
        chat = await build_app([], data_dir=data, mcp=servers(n))
        app = chat.app
        assert app is not None
        try:
            agent = await app.router.get("default")
            plugins = app.engine.plugins
            began = time.perf_counter()
            for _ in range(OFFER_ROUNDS):
                tools = agent.tools(plugins.tools, plugins.tool_groups)
                tuple(t.spec() for t in tools.values())
            out.append((time.perf_counter() - began) * 1000 / OFFER_ROUNDS)
        finally:
            await app.close()
    return out[0], out[1]


async def call_latency(workspace: Path) -> tuple[list[float], list[float]]:
    """ms per ``add`` call: the connection alone, and the Roost tool around it."""
    from bot.config.mcp import McpServerConfig
    from plugins.mcp.adapter import build_tools
    from plugins.mcp.manager import McpManager

    config = McpServerConfig(command=sys.executable, args=[str(TOOLBOX)])
    connection = Connection("bench", config)
    await connection.wait_ready(30)
    raw = []
    try:
        for i in range(CALLS + 50):
            began = time.perf_counter()
            await connection.call("add", {"a": i, "b": 1}, 10)
            if i >= 50:
                raw.append((time.perf_counter() - began) * 1000)
    finally:
        await connection.stop()

    class _Settings:
        data_dir = workspace
        mcp = type("M", (), {"servers": {"bench": config}})()

    manager = McpManager(_Settings())  # type: ignore[arg-type]
    server: McpServer = manager.servers["bench"]
    server.tools = []
    server.listed = False
    tool_view = []
    try:
        server.shared = Connection("bench", config, on_tools=server._on_tools)
        await server.shared.wait_ready(30)
        [add] = [t for t in build_tools(manager) if t.name == "bench__add"]
        context = ToolContext("u", "console", "c", "k", "r", workspace, time.monotonic() + 3600)
        for i in range(CALLS + 50):
            began = time.perf_counter()
            await add.execute(context, {"a": i, "b": 1})
            if i >= 50:
                tool_view.append((time.perf_counter() - began) * 1000)
    finally:
        await manager.stop()
    return raw, tool_view


async def main() -> None:
    quiet_logging("roost.plugins.mcp")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="roost-bench-mcp-") as tmp:
        root = Path(tmp)
        # Fill the tool cache once (a first start lists the servers), as an earlier run would.
        first = await build_app([], data_dir=root / "with", mcp=servers(3))
        assert first.app is not None
        manager = manager_of(first.app.services)
        assert manager is not None
        deadline = time.monotonic() + 120
        while not all(s.listed for s in manager.servers.values()):
            if time.monotonic() > deadline:
                raise SystemExit("the MCP servers were never listed")
            await asyncio.sleep(0.05)
        await first.app.close()

        turns = await turn_p50s({"without": (root / "without", 0, ()),
                                 "with": (root / "with", 3, ()),
                                 "plain": (root / "plain", 0, (PlainTools(),))})
        without, offered_0, _ = turns["without"]
        with_servers, offered_3, started = turns["with"]
        plain, offered_plain, _ = turns["plain"]
        offer_0, offer_3 = await offer_cost(root / "with")
        raw, tool_view = await call_latency(root / "ws")

    added_offer = offer_3 - offer_0
    rows = [
        ["text turn p50, no MCP servers", f"{without:.2f} ms", f"{offered_0} tools offered", ""],
        ["text turn p50, 3 MCP servers", f"{with_servers:.2f} ms",
         f"{offered_3} tools offered, {started} servers started", ""],
        ["text turn p50, 36 plain plugin tools instead", f"{plain:.2f} ms",
         f"{offered_plain} tools offered", ""],
        ["added per turn (whole turn, p50 difference)", f"{with_servers - without:+.2f} ms",
         f"36 plain tools: {plain - without:+.2f} ms", ""],
        ["offering tools per turn, none / 3 servers",
         f"{offer_0 * 1000:.1f} / {offer_3 * 1000:.1f} us", "", ""],
        ["added per turn by offering 36 MCP tools", f"{added_offer * 1000:.1f} us",
         f"<= {TARGET_OFFER_MS:g} ms", verdict(added_offer <= TARGET_OFFER_MS)],
        ["servers started by text turns", str(started), "0", verdict(started == 0)],
        ["tools/call over stdio p50 / p99 (connection)",
         f"{percentile(raw, 50):.2f} / {percentile(raw, 99):.2f} ms", "", ""],
        ["Roost tool call over stdio p50 / p99 (adapter)",
         f"{percentile(tool_view, 50):.2f} / {percentile(tool_view, 99):.2f} ms", "", ""],
    ]
    print_table(["measure", "measured", "target", ""], rows)
    print(targets_line([r[3] for r in rows if r[3]], began))


if __name__ == "__main__":
    asyncio.run(main())
