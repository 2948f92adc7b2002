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
from pathlib import Path
from typing import Any

from tests.forker import LAUNCHER, Forking
from tests.roost_forks import OnDemand, startup_vars

__all__ = ["LAUNCHER", "SERVERS", "close", "live", "stdio"]

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "mcp_servers"
"""The MCP servers' scripts."""


def _forking() -> Forking:
    # Python set up as for a server Roost starts: its environment has no PYTHON*, LANG or
    # LC_* variable unless configured (the SDK passes on HOME, PATH...).
    env = {k: v for k, v in os.environ.items()
           if k not in startup_vars(os.environ) and k != "PYTHONUNBUFFERED"
           and not k.startswith("ROOST_")}
    return Forking("tests.mcp_servers.forker", env=env)


_forker = OnDemand(_forking)


def stdio(script: str | Path, *args: str, **extra: Any) -> dict[str, Any]:
    """An ``mcp.servers`` entry running ``python SCRIPT ARG...`` (a server of
    tests/mcp_servers) as a fork; ``extra`` adds to the entry (``env``, ``startup``...)."""
    command, *launcher = _forker.get().launcher()
    return {"command": command, "args": [*launcher, str(script), *args], **extra}


def live() -> list[int]:
    """The pids of the forked servers still running (none if the forking process is not
    running), once the forking process has dealt with every launcher that ended before."""
    forker = _forker.running()
    return forker.live() if forker is not None else []


def close() -> None:
    """End the forking process (at the end of the tests): its children's CPU is counted
    then."""
    _forker.close()
