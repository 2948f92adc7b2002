"""MCP at its edges, with the SDK servers of tests/mcp_servers as stdio processes:
files a tool returns are each saved in a new file, and the first message after a start
sees the tools of a server never listed before.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.agents.router import workspace_for
from bot.testing.app import ChatChannel, app_factory
from plugins.mcp.files import save_new
from tests import mcp_forks
from tests.roost_forks import spawn
from tests.test_mcp import SERVERS, eventually, manager, offered, stdio, toml_server


def blobs_server() -> dict[str, Any]:
    """The blobs server on stdio (forked, tests/mcp_forks.py), started eagerly."""
    return mcp_forks.stdio(SERVERS / "blobs.py", startup="eager")


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    async with app_factory(tmp_path) as factory:
        yield factory


def blobs(*texts: str) -> dict[str, Any]:
    """A scripted turn calling ``blobs__blob`` once per text, all in one batch."""
    calls = [{"name": "blobs__blob", "arguments": {"text": t}} for t in texts]
    return {"steps": [{"tool_calls": calls}, {"reply": "saved"}]}


def saved_paths(results: list[str]) -> list[str]:
    paths = []
    for result in results:
        found = re.search(r"saved as (\S+)\]", result)
        assert found is not None, result
        paths.append(found.group(1))
    return paths


async def test_files_returned_in_the_same_second_are_new_files_with_their_own_content(
        make: Any) -> None:
    chat: ChatChannel = await make([blobs("first", "second"), blobs("third")],
                                   mcp={"servers": {"blobs": blobs_server()}})
    app = chat.app
    await eventually(lambda: "blobs__blob" in offered(app), "tools listed")
    workspace = workspace_for(app.settings.workspaces_dir, "console", "user")
    folder = workspace / "mcp" / "blobs"
    folder.mkdir(parents=True)
    # Files from earlier results under every name the next two minutes would give a
    # first block: without exclusive creation, the results below overwrite one of them.
    earlier = [folder / (time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + s))
                         + "-0.bin") for s in range(-1, 120)]
    for path in earlier:
        path.write_bytes(b"an earlier result")
    await chat.ask("two blobs at once")
    await chat.ask("one more")
    paths = saved_paths(chat.tool_results("blobs__blob"))
    assert len(set(paths)) == 3
    # Each result's file holds its own content (results come in the order calls ended).
    assert sorted((workspace / path).read_bytes() for path in paths) == [
        b"first", b"second", b"third"]
    assert all(path.read_bytes() == b"an earlier result" for path in earlier)


async def test_a_link_in_the_workspace_is_never_followed_to_save_a_file(
        make: Any, tmp_path: Path) -> None:
    chat: ChatChannel = await make([blobs("payload")],
                                   mcp={"servers": {"blobs": blobs_server()}})
    app = chat.app
    await eventually(lambda: "blobs__blob" in offered(app), "tools listed")
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = workspace_for(app.settings.workspaces_dir, "console", "user")
    (workspace / "mcp").mkdir(parents=True)
    (workspace / "mcp" / "blobs").symlink_to(outside)
    await chat.ask("save it")
    [result] = chat.tool_results("blobs__blob")
    assert "could not be saved" in result
    assert list(outside.iterdir()) == []


def test_a_file_planted_under_the_next_name_is_kept_and_the_name_skipped(
        tmp_path: Path) -> None:
    folder = tmp_path / "mcp" / "srv"
    folder.mkdir(parents=True)
    (folder / "stamp-0.png").symlink_to(tmp_path / "target")
    (folder / "stamp-0-1.png").write_bytes(b"kept")
    assert save_new(tmp_path, "srv", "stamp-0", ".png", b"new") == "mcp/srv/stamp-0-2.png"
    assert not (tmp_path / "target").exists()
    assert (folder / "stamp-0-1.png").read_bytes() == b"kept"
    assert (folder / "stamp-0-2.png").read_bytes() == b"new"
    assert save_new(tmp_path, "..", "x", ".bin", b"y") == "mcp/_../x.bin"
    assert save_new(tmp_path, "a/../b", "x", ".bin", b"y") == "mcp/a_.._b/x.bin"


async def test_the_first_message_waits_for_new_servers_tools_at_most_their_start_timeout(
        make: Any) -> None:
    # Never listed (no cache), so listed in the background at start: a lazy server, one
    # that never answers (the wait for it ends at its connect_timeout) and one that fails.
    silent = {"command": sys.executable, "args": ["-c", "import sys; sys.stdin.read()"],
              "connect_timeout": 1.0}
    broken = mcp_forks.stdio(SERVERS / "broken.py")
    chat: ChatChannel = await make([{"steps": [
        {"tool_calls": [{"name": "toolbox__add", "arguments": {"a": 2, "b": 3}}]},
        {"reply": "five"}]}],
        mcp={"servers": {"toolbox": stdio(), "silent": silent, "broken": broken}})
    assert "toolbox__add" not in offered(chat.app)  # still being listed
    await chat.say("add 2 and 3")
    await chat.settle(60)  # a listing, then a start for the call: seconds on a busy machine
    assert chat.replies == ["five"]
    assert "toolbox__add" in {t.name for t in chat.requests[0].tools}
    assert chat.tool_results("toolbox__add") == ["5"]
    assert not manager(chat.app).servers["silent"].listed


@pytest.mark.e2e
async def test_roost_runs_first_message_sees_a_new_servers_tools(tmp_path: Path) -> None:
    """Through ``roost run``: a message sent the moment it is ready is answered with the
    tools of a lazy server it has never listed."""
    import asyncio
    import os

    from bot.testing.anthropic import FakeAnthropic

    (tmp_path / "roost.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n' + toml_server("toolbox", stdio()),
        encoding="utf-8")
    async with FakeAnthropic() as fake:
        fake.reply_text("hello")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ROOST_", "ANTHROPIC_", "TELEGRAM_", "DISCORD_", "SLACK_"))}
        env.update(ROOST_PROVIDER="anthropic", ANTHROPIC_API_KEY="x",
                   ANTHROPIC_BASE_URL=fake.base_url, ROOST_CONSOLE="1", PYTHONUNBUFFERED="1")
        proc = await spawn(["run"], cwd=tmp_path, env=env, stdin=asyncio.subprocess.PIPE)
        assert proc.stdin is not None and proc.stderr is not None
        log: asyncio.Task[bytes] | None = None
        try:
            async with asyncio.timeout(120):
                while b"roost ready" not in (line := await proc.stderr.readline()):
                    assert line, "roost run ended before it was ready"
            # The rest of its log is read meanwhile: a full pipe would block its logging.
            log = asyncio.create_task(proc.stderr.read())
            proc.stdin.write(b"what can you do?\n")
            await proc.stdin.drain()
            await eventually(lambda: bool(fake.requests), "the model asked", limit=120)
            tools = {t["name"] for t in fake.requests[0].body.get("tools", [])}
            assert "toolbox__add" in tools
        finally:
            if proc.returncode is None:
                proc.terminate()
            async with asyncio.timeout(60):
                await proc.wait()
                if log is not None:
                    await log
