"""The forking process behind tests/mcp_servers/launch.py, started by tests/mcp_forks.py:
``python -m tests.mcp_servers.forker LISTENER CONTROL`` (two socket fds).

It imports the MCP SDK and the servers of this directory once. Then, single-threaded and
with no event loop, it serves the launchers that connect to the Unix socket LISTENER:
for each, a child that takes the launcher's stdin, stdout, stderr, working directory,
environment and arguments, and runs the server's ``main()`` as ``python SCRIPT ARG...``
would, in a session of its own. The launcher gets the child's pid and a pidfd of it,
then its exit code once it is reaped; if the launcher goes away first, the child is
killed at once. A script it did not import, or an environment that sets Python up
otherwise than its own (:func:`tests.roost_forks.startup_vars`), is declined: the
launcher execs it. On the socket CONTROL, ``live`` is answered with the pids of the
children still running, once every launcher that went away before has been dealt with;
the end of CONTROL ends the children and this process.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import importlib
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

gc.disable()  # what is imported here lives as long as the process (frozen below)

from tests.roost_forks import startup_vars, std_streams  # noqa: E402

SERVERS = ("toolbox", "blobs", "broken")
"""The servers of this directory that children run."""
WARM = ("anyio._backends._asyncio",)
"""What a stdio server imports once it runs, imported here once for all children."""
PR_SET_PDEATHSIG = 1


def parse_environ(raw: bytes) -> dict[str, str]:
    """An environment block (``NAME=value`` entries, each ended by a NUL) as a dict."""
    env = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


with open("/proc/self/environ", "rb") as block:
    STARTED = parse_environ(block.read())
"""The environment this process was started with."""
ADDED = {k: v for k, v in os.environ.items() if k not in STARTED}
"""What Python's start-up added to it (``LC_CTYPE``, PEP 538): a child gets it too."""

Main = Callable[[], None]


@dataclass
class Child:
    """A running child: its pid, a pidfd of it, and the launcher it was started for."""

    pid: int
    pidfd: int
    launcher: socket.socket


class Forker:
    """The loop serving launchers (LISTENER) and the tests (CONTROL)."""

    def __init__(self, listener: socket.socket, control: socket.socket,
                 mains: dict[str, Main]) -> None:
        self.listener = listener
        self.control = control
        self.mains = mains
        self.waiting: dict[int, socket.socket] = {}
        """Launchers connected that have not sent their request yet, by fd."""
        self.children: dict[int, Child] = {}
        """By the fd of their launcher's socket."""
        self.pid = os.getpid()
        self.prctl = ctypes.CDLL(None, use_errno=True).prctl

    def serve(self) -> None:
        """Serve until CONTROL ends; then kill the children left."""
        while True:
            pidfds = {child.pidfd: child for child in self.children.values()}
            ready = set(select.select(
                [self.listener.fileno(), self.control.fileno(), *self.waiting, *self.children,
                 *pidfds], [], [])[0])
            for pidfd in ready & pidfds.keys():  # ended: its launcher gets its exit code
                self.reap(pidfds[pidfd], tell=True)
            for fd in ready & self.children.keys():
                child = self.children[fd]
                with contextlib.suppress(OSError):
                    if child.launcher.recv(16):
                        continue  # nothing more is asked of a launcher: ignored
                self.kill(child)  # the launcher is gone: so is its child
            for fd in ready & self.waiting.keys():
                self.start(self.waiting.pop(fd))
            if self.listener.fileno() in ready:
                launcher, _ = self.listener.accept()
                self.waiting[launcher.fileno()] = launcher
            if self.control.fileno() in ready:
                if not self.control.recv(16):
                    break
                self.control.send(b"live:" + b" ".join(b"%d" % c.pid
                                                      for c in self.children.values()))
        for child in list(self.children.values()):
            self.kill(child)
        for launcher in self.waiting.values():
            launcher.close()

    def reap(self, child: Child, *, tell: bool) -> None:
        """Wait for ``child``'s end; tell its launcher the exit code if ``tell``."""
        _, status = os.waitpid(child.pid, 0)
        del self.children[child.launcher.fileno()]
        if tell:
            with contextlib.suppress(OSError):  # the launcher is gone meanwhile
                child.launcher.send(b"%d" % os.waitstatus_to_exitcode(status))
        child.launcher.close()
        os.close(child.pidfd)

    def kill(self, child: Child) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        self.reap(child, tell=False)

    def start(self, launcher: socket.socket) -> None:
        """Take ``launcher``'s request and fork its child, or decline it."""
        try:
            data, ancdata, flags, _ = launcher.recvmsg(1 << 20, socket.CMSG_SPACE(4 * 4))
        except OSError:
            data, ancdata, flags = b"", [], 0
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        request = self.request(launcher, data, fds, flags)
        if request is None:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                launcher.send(b"no")
            launcher.close()
            return
        main, args, env = request
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.child(fds, main, args, env)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[launcher.fileno()] = Child(pid, pidfd, launcher)
        with contextlib.suppress(OSError):  # the launcher is gone: seen on the next turn
            launcher.sendmsg([b"%d" % pid], [
                (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])

    def request(self, launcher: socket.socket, data: bytes, fds: Sequence[int],
                flags: int) -> tuple[Main, list[str], dict[str, str]] | None:
        """The server's ``main``, the arguments and the environment ``data`` asks for, or
        ``None`` to decline."""
        if not data or len(fds) != 4 or flags & socket.MSG_CTRUNC:
            return None
        _, uid, _ = struct.unpack("3i", launcher.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            args, raw = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            return None
        if uid != os.getuid() or not isinstance(raw, bytes) or not isinstance(args, list) \
                or not args or not all(isinstance(a, str) for a in args) \
                or not os.path.isabs(args[0]):
            return None
        main = self.mains.get(os.path.realpath(args[0]))
        env = parse_environ(raw)
        if main is None or startup_vars(env) != startup_vars(STARTED):
            return None
        return main, args, {**ADDED, **env}

    def child(self, fds: Sequence[int], main: Main, args: list[str],
              env: dict[str, str]) -> NoReturn:
        """In the fork: become ``python SCRIPT ARG...`` on the launcher's fds and run
        ``main``; the interpreter then ends as that command's would."""
        for sock in [self.listener, self.control, *self.waiting.values(),
                     *(c.launcher for c in self.children.values())]:
            sock.detach()  # closed below, by number
        os.setsid()
        self.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this process's end ends it
        if os.getppid() != self.pid:
            os._exit(1)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.fchdir(fds[3])
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        std_streams(sys.stdout.encoding, sys.stdout.errors, not env.get("PYTHONUNBUFFERED"))
        sys.argv = args
        sys.path[0] = os.path.dirname(args[0])
        main()
        sys.exit(0)


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
    Forker(socket.socket(fileno=listener), socket.socket(fileno=control), mains).serve()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
