"""The MCP test servers forked by tests/mcp_forks.py behave as processes of their own:
the launcher's streams, working directory and environment are the server's, no other
fd reaches it, signals and exit codes pass through the launcher, the launcher's death
ends the server, and without the forking process the launcher execs the server itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import mcp_forks
from tests.mcp_forks import LAUNCHER, SERVERS

TOOLBOX = SERVERS / "toolbox.py"


def launch(config: dict[str, Any], cwd: Path, **env: str) -> subprocess.Popen[bytes]:
    """The ``command`` + ``args`` of ``config`` as a process with piped streams."""
    return subprocess.Popen([config["command"], *config["args"]], cwd=cwd,
                            env={"PATH": os.environ["PATH"], **env}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def ask(proc: subprocess.Popen[bytes], *tools: str) -> list[Any]:
    """Initialize an MCP session on ``proc``'s stdio and call ``tools`` (no arguments);
    their structured results."""
    assert proc.stdin is not None and proc.stdout is not None
    messages: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *({"jsonrpc": "2.0", "id": n, "method": "tools/call",
           "params": {"name": name, "arguments": {}}} for n, name in enumerate(tools, 1))]
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    proc.stdin.flush()
    answers: dict[int, Any] = {}
    while len(answers) <= len(tools):
        line = proc.stdout.readline()
        assert line, "the server ended"
        answer = json.loads(line)
        answers[answer["id"]] = answer["result"]
    return [answers[n]["structuredContent"]["result"] for n in range(1, len(tools) + 1)]


def fds(pid: int) -> dict[int, str]:
    """What each fd of process ``pid`` is (a path, ``pipe:[inode]``, ``socket:[inode]``...)."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return found


def test_a_forked_server_runs_on_the_launchers_streams_cwd_and_env_and_nothing_else(
        tmp_path: Path) -> None:
    config = mcp_forks.stdio(TOOLBOX)
    first = launch(config, tmp_path, TOOLBOX_MARK="first")
    second = launch(config, tmp_path / "..", TOOLBOX_MARK="second")
    try:
        [first_pid] = ask(first, "pid")
        pid, where, mark = ask(second, "pid", "where", "mark")
        assert {pid, first_pid} <= set(mcp_forks.live()) and pid != first_pid
        assert (where, mark) == (str(tmp_path.parent), "second")
        assert pid not in (second.pid, os.getpid())
        forker = psutil.Process(pid).ppid()
        theirs = fds(pid)
        # It talks on the launcher's pipes (the SDK moves them off fds 0 and 1), and the
        # launcher keeps no copy of them.
        assert second.stdin is not None and second.stdout is not None
        pipes = {f"pipe:[{os.fstat(end.fileno()).st_ino}]" for end in (second.stdin, second.stdout)}
        assert pipes <= set(theirs.values())
        assert [fds(second.pid)[fd] for fd in (0, 1, 2)] == ["/dev/null"] * 3
        # No fd of the forking process, nor any of the other server's (its pipes).
        assert not set(theirs.values()) & set(fds(forker).values()) - {"/dev/null"}
        assert first.stdin is not None and first.stdout is not None
        assert not set(theirs.values()) & {f"pipe:[{os.fstat(end.fileno()).st_ino}]"
                                           for end in (first.stdin, first.stdout)}
        # The end of its stdin ends it, and the launcher with its exit code.
        second.stdin.close()
        assert second.wait(60) == 0
        assert pid not in mcp_forks.live()
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


# SIGINT is forwarded too, but the SDK's stdio server does not end on it (nor does it
# when started as `python toolbox.py`).
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signals_reach_the_server_and_its_death_is_the_launchers(
        sig: signal.Signals, tmp_path: Path) -> None:
    proc = launch(mcp_forks.stdio(TOOLBOX), tmp_path)
    try:
        [pid] = ask(proc, "pid")
        proc.send_signal(sig)
        assert proc.wait(60) == -sig
        assert pid not in mcp_forks.live()
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_launchers_server_is_killed_at_once(tmp_path: Path) -> None:
    """A server ignoring SIGTERM and its stdin's end: killing the launcher ends it."""
    proc = launch(mcp_forks.stdio(TOOLBOX), tmp_path, TOOLBOX_STUBBORN="1")
    [pid] = ask(proc, "pid")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert pid not in mcp_forks.live()
    assert not psutil.pid_exists(pid)


def test_the_servers_exit_code_and_stderr_are_the_launchers(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, *mcp_forks.stdio(SERVERS / "broken.py")["args"]],
                         cwd=tmp_path, capture_output=True, check=False)
    assert (out.returncode, out.stderr) == (2, b"broken: missing configuration\n")


@pytest.mark.parametrize("case", ["no forking process", "declined"])
def test_without_the_forking_process_the_launcher_execs_the_server(
        case: str, tmp_path: Path) -> None:
    """No forking process at the address, or an environment that sets Python up
    otherwise (``PYTHONPATH``): the launcher becomes ``python toolbox.py`` itself."""
    if case == "declined":
        config, env = mcp_forks.stdio(TOOLBOX), {"PYTHONPATH": str(tmp_path)}
    else:
        config = {"command": sys.executable,
                  "args": ["-S", "-I", str(LAUNCHER), str(tmp_path / "none"), str(TOOLBOX)]}
        env = {}
    proc = launch(config, tmp_path, **env)
    try:
        assert ask(proc, "pid") == [proc.pid]
        assert psutil.Process(proc.pid).cmdline() == [sys.executable, str(TOOLBOX)]
        assert proc.pid not in mcp_forks.live()
    finally:
        proc.kill()
        proc.wait()
