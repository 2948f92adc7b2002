"""The forking process (tests/forker.py) behind the MCP servers tests/mcp_forks.py starts:
``python -m tests.mcp_servers.forker LISTENER CONTROL`` (two socket fds).

It imports the MCP SDK and the servers of this directory once; a launcher's
``SCRIPT ARG...`` (an absolute path to one of them) is run as ``python SCRIPT ARG...``
would run it. Any other script is declined: the launcher execs it.
"""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys
from collections.abc import Callable

gc.disable()  # what is imported here lives as long as the process (frozen below)

from tests.forker import Forker, Program  # noqa: E402

SERVERS = ("toolbox", "blobs", "broken")
"""The servers of this directory that children run."""
WARM = ("anyio._backends._asyncio",)
"""What a stdio server imports once it runs, imported here once for all children."""


def programs(mains: dict[str, Callable[[], None]]) -> Callable[[list[str]], Program | None]:
    """``SCRIPT ARG...`` as the program of one of ``mains`` (by the script's real path)."""

    def program(args: list[str]) -> Program | None:
        if not os.path.isabs(args[0]):
            return None
        main = mains.get(os.path.realpath(args[0]))
        return None if main is None else Program(main, args, os.path.dirname(args[0]))

    return program


def serve(listener: int, control: int) -> None:
    """Import the servers, then serve on the sockets ``listener`` and ``control``."""
    mains = {}
    for name in SERVERS:
        module = importlib.import_module(f"tests.mcp_servers.{name}")
        assert module.__file__ is not None
        mains[os.path.realpath(module.__file__)] = module.main
    for name in WARM:
        importlib.import_module(name)
    gc.freeze()  # never scanned again, nor copied into a child by the scan
    gc.enable()
    Forker(socket.socket(fileno=listener), socket.socket(fileno=control),
           programs(mains)).serve()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
