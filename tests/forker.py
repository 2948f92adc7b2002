"""A forking process behind tests/fork_launch.py: it imported what its programs need once,
and serves each launcher with a child that runs the program on the launcher's own fds.

A launcher sends its arguments, environment, stdin, stdout, stderr and working directory;
:meth:`Forker.serve` asks its ``programs`` which program those arguments start (or
``None`` to decline: the launcher then execs ``python ARG...`` itself, as it does when
nothing listens). The child runs it in a session of its own, as ``python ARG...`` would
run it on those fds; the launcher gets the child's pid and a pidfd of it, then its exit
code once it is reaped; if the launcher goes away first, the child is killed at once.
An environment that sets Python up otherwise than this process's own
(:func:`tests.roost_forks.startup_vars`) is declined. On the socket CONTROL, ``live`` is
answered with the pids of the children still running, once every launcher that went
away before has been dealt with; the end of CONTROL ends the children and this process.
It serves single-threaded and with no event loop, so that a fork is safe.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import marshal
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tests.roost_forks import startup_vars, std_streams

PR_SET_PDEATHSIG = 1
ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "tests" / "fork_launch.py"


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


@dataclass(frozen=True)
class Program:
    """What a child runs: ``main()`` with ``sys.argv`` and ``sys.path[0]`` as ``python``
    would set them, its std streams unbuffered (``-u``) or not, bytecode written or not
    (``-B``)."""

    main: Callable[[], None]
    argv: list[str]
    path0: str
    unbuffered: bool = False
    write_bytecode: bool = True


Programs = Callable[[list[str]], "Program | None"]
"""The program ``python ARG...`` runs, given ``ARG...``; ``None`` if this process cannot."""


@dataclass
class Child:
    """A running child: its pid, a pidfd of it, and the launcher it was started for."""

    pid: int
    pidfd: int
    launcher: socket.socket


class Forker:
    """The loop serving launchers (LISTENER) and the tests (CONTROL)."""

    def __init__(self, listener: socket.socket, control: socket.socket,
                 programs: Programs) -> None:
        self.listener = listener
        self.control = control
        self.programs = programs
        self.waiting: dict[int, socket.socket] = {}
        """Launchers connected that have not sent their request yet, by fd."""
        self.children: dict[int, Child] = {}
        """By the fd of their launcher's socket."""
        self.added = {k: v for k, v in os.environ.items() if STARTED.get(k) != v}
        """What Python's start-up (``LC_CTYPE``, PEP 538) and the imports since set in the
        environment: a child gets it too, as it would have had it importing them itself."""
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
        program, env = request
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.child(fds, program, env)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[launcher.fileno()] = Child(pid, pidfd, launcher)
        with contextlib.suppress(OSError):  # the launcher is gone: seen on the next turn
            launcher.sendmsg([b"%d" % pid], [
                (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])

    def request(self, launcher: socket.socket, data: bytes, fds: Sequence[int],
                flags: int) -> tuple[Program, dict[str, str]] | None:
        """The program and the environment ``data`` asks for, or ``None`` to decline."""
        if not data or len(fds) != 4 or flags & socket.MSG_CTRUNC:
            return None
        _, uid, _ = struct.unpack("3i", launcher.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            args, raw = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            return None
        if uid != os.getuid() or not isinstance(raw, bytes) or not isinstance(args, list) \
                or not args or not all(isinstance(a, str) for a in args):
            return None
        program = self.programs(args)
        env = parse_environ(raw)
        if program is None or startup_vars(env) != startup_vars(STARTED):
            return None
        return program, {**self.added, **env}

    def child(self, fds: Sequence[int], program: Program, env: dict[str, str]) -> NoReturn:
        """In the fork: become ``python ARG...`` on the launcher's fds and run the program;
        the interpreter then ends as that command's would."""
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
        random.seed()  # not the sequence every other child goes on with
        std_streams(sys.stdout.encoding, sys.stdout.errors,
                    not (program.unbuffered or env.get("PYTHONUNBUFFERED")))
        sys.dont_write_bytecode = not program.write_bytecode
        sys.argv = program.argv
        sys.path[0] = program.path0
        sys.modules["__main__"] = types.ModuleType("__main__")
        program.main()
        sys.exit(0)


class Forking:
    """A forking process, seen from the process that started it: ``python -m MODULE
    LISTENER CONTROL ARG...`` (a module serving :class:`Forker` on those two sockets),
    listening at ``address``, with ``env`` (default: this process's) and its stderr on
    ``stderr`` (default: this process's)."""

    def __init__(self, module: str, *args: str, env: Mapping[str, str] | None = None,
                 stderr: int | None = None) -> None:
        self.home = tempfile.mkdtemp(prefix="roost-forks-")  # this user's alone
        self.address = os.path.join(self.home, "socket")
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with listener, theirs:
            listener.bind(self.address)
            listener.listen(64)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, str(listener.fileno()), str(theirs.fileno()),
                 *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr,
                pass_fds=[listener.fileno(), theirs.fileno()])
        self.lock = threading.Lock()

    def launcher(self) -> list[str]:
        """The command that runs ``python ARG...`` as a fork (``ARG...`` appended)."""
        return [sys.executable, "-S", "-I", str(LAUNCHER), self.address]

    def live(self) -> list[int]:
        """The pids of its children still running, once it has dealt with every launcher
        that went away before."""
        with self.lock:
            self.control.send(b"live")
            answer = self.control.recv(1 << 16)
        if not answer.startswith(b"live:"):
            raise RuntimeError(f"the forking process {self.proc.args[2]} ended")
        return [int(pid) for pid in answer[5:].split()]

    def close(self) -> None:
        """End the forking process (it kills its children left) and wait for it, so its
        children's CPU counts as this process's."""
        self.control.close()
        self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)
