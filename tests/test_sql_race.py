"""The ``sql`` tool against a workspace whose files turn into links: SQLite opens its
database and journals by path, so links planted there must never be followed."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.tools import Tool, ToolContext, ToolError
from plugins import sql_tool
from plugins.exec_tool import roost_tools
from roost import workspace_lock

DB = sql_tool.DB_FILE
HOST_BYTES = b"\x00" * 4096 + b"a host file the sql tool must never write\n"


@pytest.fixture
def root() -> Iterator[Path]:
    """Traversable by every user (the sandbox may run as another uid)."""
    path = Path(tempfile.mkdtemp(prefix="roost-sql-race-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def workspace(root: Path, name: str = "ws") -> Path:
    path = root / name
    path.mkdir()
    return path


def context(ws: Path) -> ToolContext:
    return ToolContext("42", "telegram", "42", "telegram:42", "run-1", ws,
                       time.monotonic() + 60)


async def sql(tool: Tool, ws: Path, query: str) -> str:
    result = await tool.execute(context(ws), {"query": query})
    assert isinstance(result, str)
    return result


async def refused(tool: Tool, ws: Path, query: str) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await tool.execute(context(ws), {"query": query})
    return caught.value


@pytest.mark.parametrize("side", ["-journal", "-wal", "-shm"])
async def test_a_journal_link_to_a_host_file_is_refused_and_the_file_is_unchanged(
        root: Path, side: str) -> None:
    tool = sql_tool.make_sql_tool()
    ws = workspace(root)
    await sql(tool, ws, "CREATE TABLE t (x TEXT)")
    host = root / "host.bin"
    host.write_bytes(HOST_BYTES)
    (ws / (DB + side)).symlink_to(host)
    err = await refused(tool, ws, "INSERT INTO t VALUES ('x')")
    assert err.code == "UNSAFE_FILE"
    assert f"{DB}{side} in your workspace is a symbolic link" in str(err)
    assert host.read_bytes() == HOST_BYTES
    (ws / (DB + side)).unlink()
    assert (await sql(tool, ws, "INSERT INTO t VALUES ('x')")).startswith("OK: 1 row affected.")


async def test_no_journal_file_is_written_and_the_model_cannot_bring_one_back(
        root: Path) -> None:
    tool = sql_tool.make_sql_tool()
    ws = workspace(root)
    with sqlite3.connect(ws / DB) as conn:  # a WAL database, as exec could leave one
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x TEXT)")
    conn.close()
    await sql(tool, ws, "INSERT INTO t VALUES ('x')")
    assert (ws / DB).read_bytes()[18:20] == b"\x01\x01"  # rollback, not WAL, on disk
    assert sorted(os.listdir(ws)) == [DB]
    for pragma in ("PRAGMA journal_mode = WAL", "PRAGMA journal_mode = DELETE",
                   "PRAGMA locking_mode = EXCLUSIVE"):
        err = await refused(tool, ws, pragma)
        assert err.code == "NOT_ALLOWED", pragma
    assert (ws / DB).read_bytes()[18:20] == b"\x01\x01"


_FLIPPER = """
import os, sys
ws, outside, stop = sys.argv[1:4]
db, held = os.path.join(ws, "data.sqlite3"), os.path.join(ws, ".held")
while not os.path.exists(stop):
    try:
        os.rename(db, held); os.symlink(outside, db)
        os.unlink(db); os.rename(held, db)
    except OSError:
        pass
"""


async def test_a_database_swapped_for_a_link_to_another_database_is_never_read(
        root: Path) -> None:
    tool = sql_tool.make_sql_tool()
    ws = workspace(root)
    await sql(tool, ws, "CREATE TABLE mine (x TEXT)")
    outside = root / "outside.sqlite3"
    with sqlite3.connect(outside) as conn:
        conn.execute("CREATE TABLE secret (x TEXT)")
        conn.execute("INSERT INTO secret VALUES ('TOPSECRET')")
    conn.close()
    stop = root / "stop"
    flipper = await asyncio.create_subprocess_exec(sys.executable, "-c", _FLIPPER, str(ws),
                                                   str(outside), str(stop))
    outcomes: dict[str, int] = {}
    try:
        for _ in range(1000):
            try:
                text = await sql(tool, ws, "SELECT x FROM secret")
                key = "READ " + text
            except ToolError as exc:
                key = exc.code or "?"
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        stop.touch()
        await asyncio.wait_for(flipper.wait(), 30)
    assert not [k for k in outcomes if "TOPSECRET" in k], outcomes
    assert outcomes.get("UNSAFE_FILE", 0) > 0, outcomes  # the race was on


def exec_tool(root: Path) -> Tool:
    return roost_tools(Settings(data_dir=root / "data", plugins={"plugins.exec_tool": {}}))


async def wait_for_file(path: Path, task: asyncio.Task[Any]) -> None:
    for _ in range(3000):
        if await asyncio.to_thread(path.exists):
            return
        assert not task.done(), task.result()
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


# The command plants a journal link, then holds the workspace until told to go.
_HOLD = ("ln -s /etc/hostname data.sqlite3-journal && touch ready && "
         "while [ ! -e go ]; do sleep 0.02; done; rm data.sqlite3-journal ready go")


async def test_exec_and_sql_on_one_workspace_never_overlap(root: Path) -> None:
    sandboxed = exec_tool(root)
    tool = sql_tool.make_sql_tool()
    ws = workspace(root)
    held = asyncio.ensure_future(sandboxed.execute(context(ws), {"command": _HOLD}))
    await wait_for_file(ws / "ready", held)
    query = asyncio.ensure_future(sql(tool, ws, "CREATE TABLE t (x TEXT)"))
    done, _ = await asyncio.wait([query], timeout=1.0)  # long enough to see the link
    assert not done  # waiting for the sandbox, not looking at its link
    (ws / "go").touch()
    result = await held
    assert str(result).startswith("[exit code 0;"), result
    assert await query == "OK."
    assert not (ws / (DB + "-journal")).exists()


async def test_exec_and_sql_on_different_workspaces_run_together(root: Path) -> None:
    sandboxed = exec_tool(root)
    tool = sql_tool.make_sql_tool()
    busy, other = workspace(root, "a"), workspace(root, "b")
    held = asyncio.ensure_future(sandboxed.execute(context(busy), {"command": _HOLD}))
    await wait_for_file(busy / "ready", held)
    assert await asyncio.wait_for(sql(tool, other, "CREATE TABLE t (x TEXT)"), 30) == "OK."
    assert not held.done()
    (busy / "go").touch()
    assert str(await held).startswith("[exit code 0;")


def descriptors_of(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``'s file."""
    wanted = os.stat(path)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            status = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        count += (status.st_dev, status.st_ino) == (wanted.st_dev, wanted.st_ino)
    return count


_BLOCKER = """
import os, sqlite3, sys, time
db, ready, stop = sys.argv[1:4]
conn = sqlite3.connect(db, isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
open(ready, "w").close()
while not os.path.exists(stop):
    time.sleep(0.01)
conn.close()
"""


async def test_a_cancelled_call_keeps_the_workspace_until_sqlite_has_let_go(
        root: Path) -> None:
    tool = sql_tool.make_sql_tool(query_timeout=3.0)
    ws = workspace(root)
    await sql(tool, ws, "CREATE TABLE t (x TEXT)")
    stop = root / "stop"
    blocker = await asyncio.create_subprocess_exec(  # another process holds the database
        sys.executable, "-c", _BLOCKER, str(ws / DB), str(root / "ready"), str(stop))
    try:
        await wait_for_file(root / "ready", asyncio.ensure_future(blocker.wait()))
        call = asyncio.ensure_future(sql(tool, ws, "INSERT INTO t VALUES ('x')"))
        for _ in range(3000):  # the call waits in SQLite's busy handler
            if descriptors_of(ws / DB):
                break
            await asyncio.sleep(0.001)
        assert descriptors_of(ws / DB), "the call never opened the database"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert descriptors_of(ws / DB) == 0  # SQLite has let go of the workspace
        assert not workspace_lock(ws).locked()
    finally:
        stop.touch()
        await asyncio.wait_for(blocker.wait(), 30)
