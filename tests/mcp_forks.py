"""The MCP servers of tests/mcp_servers started as forks of one process that imported the SDK.

:func:`stdio` is an ``mcp.servers`` entry whose command is a launcher
(tests/fork_launch.py, built-in modules only: milliseconds) that hands its stdin,
stdout, stderr, working directory, environment and arguments to this process's forking
process (tests/mcp_servers/forker.py, started on first use). That forks a child that
runs the server's ``main()`` on those very fds; the launcher forwards SIGTERM, SIGINT and
SIGHUP to it and exits as it did, and its death kills the child. Importing the SDK was
nearly all of each start's CPU. What differs from ``python SCRIPT``: the server's parent
is the forking process and its ``/proc/<pid>/cmdline`` is that process's; its hash seed
is the forking process's. If the forking process is not there (or the environment sets
Python up otherwise), the launcher execs ``python SCRIPT`` itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.roost_forks import OnDemand, startup_vars

__all__ = ["LAUNCHER", "SERVERS", "close", "live", "stdio"]

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "mcp_servers"
"""The MCP servers' scripts."""
LAUNCHER = ROOT / "tests" / "fork_launch.py"


class _Forker:
    """The forking process, listening at ``address``."""

    def __init__(self) -> None:
        self.home = tempfile.mkdtemp(prefix="roost-mcp-forks-")  # this user's alone
        self.address = os.path.join(self.home, "socket")
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with listener, theirs:
            listener.bind(self.address)
            listener.listen(64)
            # Python set up as for a server Roost starts: its environment has no PYTHON*,
            # LANG or LC_* variable unless configured (the SDK passes on HOME, PATH...).
            env = {k: v for k, v in os.environ.items()
                   if k not in startup_vars(os.environ) and k != "PYTHONUNBUFFERED"
                   and not k.startswith("ROOST_")}
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.mcp_servers.forker", str(listener.fileno()),
                 str(theirs.fileno())], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, pass_fds=[listener.fileno(), theirs.fileno()])
        self.lock = threading.Lock()

    def live(self) -> list[int]:
        with self.lock:
            self.control.send(b"live")
            answer = self.control.recv(1 << 16)
        if not answer.startswith(b"live:"):
            raise RuntimeError("the MCP servers' forking process ended")
        return [int(pid) for pid in answer[5:].split()]

    def close(self) -> None:
        """End the forking process (it kills its children left) and wait for it, so its
        children's CPU counts as this process's."""
        self.control.close()
        self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


_forker = OnDemand(_Forker)


def stdio(script: str | Path, *args: str, **extra: Any) -> dict[str, Any]:
    """An ``mcp.servers`` entry running ``python SCRIPT ARG...`` (a server of
    tests/mcp_servers) as a fork; ``extra`` adds to the entry (``env``, ``startup``...)."""
    return {"command": sys.executable,
            "args": ["-S", "-I", str(LAUNCHER), _forker.get().address, str(script), *args],
            **extra}


def live() -> list[int]:
    """The pids of the forked servers still running (none if the forking process is not
    running), once the forking process has dealt with every launcher that ended before."""
    forker = _forker.running()
    return forker.live() if forker is not None else []


def close() -> None:
    """End the forking process (at the end of the tests): its children's CPU is counted
    then."""
    _forker.close()
