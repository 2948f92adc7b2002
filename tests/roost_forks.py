"""Long-running ``roost`` processes in tests, each a fork of one process that imported Roost.

:func:`spawn` starts ``python -m bot *args`` as a real process of its own: its own pid
(SIGTERM, SIGINT and SIGKILL act on it as on an exec'd one), working directory,
environment, stdin, stdout, stderr and exit code. Only the imports are not paid again:
it is forked from a forking process that imported Roost once, single-threaded and with
no event loop. The forking process reaps it and writes its exit code to a pipe the
test reads; signals go through a pidfd, which cannot reach another process once the
pid is reused. An environment that changes how Python itself starts (``PYTHON*``,
``LANG``, ``LC_*`` differing from the forking process's) gets an exec'd process instead.
What differs from exec'd: ``/proc/<pid>/cmdline`` and ``environ`` show the forking
process's, the hash seed is the forking process's, and modules the forking process
imported are imported already (so tests of what ``roost run`` imports exec it).
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import inspect
import io
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

__all__ = ["ForkedPopen", "ForkedProcess", "OnDemand", "close", "popen", "spawn",
           "startup_vars", "std_streams"]


def std_streams(encoding: str, errors: str, buffered: bool) -> None:
    """Make ``sys.stdin``, ``stdout`` and ``stderr`` anew, as Python's start-up makes them
    for fds 0, 1 and 2: for a fork whose fds 0-2 were replaced."""
    streams = []
    for fd, mode in ((0, "r"), (1, "w"), (2, "w")):
        tty = os.isatty(fd)
        raw = mode == "w" and not buffered
        buf = open(fd, mode + "b", buffering=0 if raw else -1, closefd=False)  # noqa: SIM115
        stream = io.TextIOWrapper(
            buf, encoding, "backslashreplace" if fd == 2 else errors, "\n",
            line_buffering=buffered and (tty or fd == 2), write_through=not buffered)
        setattr(stream, "mode", mode)  # noqa: B010  (as Python's own std streams have it)
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


_DRIVER = inspect.getsource(std_streams) + r"""
import array, importlib, io, json, os, resource, runpy, select, signal, socket, sys, time, types

for name in ("bot.app.cli", "bot.app.roost", "bot.app.offers", "channels.telegram"):
    importlib.import_module(name)
from bot.pluginhost.manager import BUILTIN_PLUGINS
for name in BUILTIN_PLUGINS:
    importlib.import_module(name)



def child(sock, job, fds):
    # In the fork: become `python -m bot *job["args"]` and run it; never returns to the
    # loop (the command's exit, or an exception, ends the interpreter as usual).
    sock.detach()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    for limit, (soft, hard) in job["rlimits"].items():
        resource.setrlimit(int(limit), (soft, hard))
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    time.tzset()
    importlib.invalidate_caches()
    std_streams(sys.stdout.encoding, sys.stdout.errors, not os.environ.get("PYTHONUNBUFFERED"))
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *job["args"]]
    sys.modules["__main__"] = types.ModuleType("__main__")  # not this loop's globals
    runpy._run_module_as_main("bot")
    sys.exit(0)


sock = socket.socket(fileno=int(sys.argv[1]))
children = {}  # pidfd: (pid, the pipe its exit code goes to)
while True:
    ready, _, _ = select.select([sock, *children], [], [])
    for pidfd in [fd for fd in ready if fd is not sock]:
        pid, status = children.pop(pidfd)
        _, code = os.waitpid(pid, 0)
        try:
            os.write(status, b"%d\n" % os.waitstatus_to_exitcode(code))
        except OSError:  # nobody reads it any more
            pass
        os.close(status)
        os.close(pidfd)
    if sock not in ready:
        continue
    data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4 * 4))
    if not data:  # the tests are over: end what is left and go
        for pidfd, (pid, status) in children.items():
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitpid(pid, 0)
        break
    fds = array.array("i")
    for level, kind, payload in ancdata:
        fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    job = json.loads(data)
    for name in job["warm"]:
        try:
            importlib.import_module(name)
        except Exception:  # the command itself will say why
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(sock, job, list(fds))
    for fd in fds[:3]:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    children[pidfd] = (pid, fds[3])
    sock.sendmsg([b"%d" % pid], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])
"""


def startup_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that shape how Python starts, which a fork cannot change
    (``PYTHONUNBUFFERED`` can: the fork makes its std streams anew)."""
    return {k: v for k, v in env.items()
            if (k.startswith(("PYTHON", "LC_")) or k in ("LANG", "LANGUAGE"))
            and k != "PYTHONUNBUFFERED"}


class _Forker:
    """The forking process (started on first use, ended when this process exits)."""

    def __init__(self) -> None:
        self.startup = startup_vars(os.environ)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _DRIVER, str(theirs.fileno())], cwd=tempfile.gettempdir(),
                env={k: v for k, v in os.environ.items() if not k.startswith("ROOST_")},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()])
        self.lock = threading.Lock()

    def start(self, job: dict[str, object], fds: Sequence[int]) -> tuple[int, int, int]:
        """Fork one child for ``job`` with ``fds`` as its stdin, stdout and stderr; its pid,
        a pidfd of it and the pipe its exit code will come on."""
        status, status_theirs = os.pipe()
        try:
            with self.lock:
                self.sock.sendmsg([json.dumps(job).encode()], [(
                    socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [*fds, status_theirs]))])
                data, ancdata, _, _ = self.sock.recvmsg(64, socket.CMSG_SPACE(4))
            if not data:
                raise RuntimeError("the forking process ended")
        except BaseException:
            os.close(status)
            raise
        finally:
            os.close(status_theirs)
        pidfds = array.array("i")
        for _, _, payload in ancdata:
            pidfds.frombytes(payload[:len(payload) - len(payload) % pidfds.itemsize])
        return int(data), pidfds[0], status

    def close(self) -> None:
        """End the forking process (it kills any child still running) and wait for it, so
        its children's CPU counts as this process's."""
        self.sock.close()
        self.proc.wait()


class _Forked:
    """A forked child as this process sees it: ``pid``, ``returncode`` once its exit code
    has been read, and signals (sent through its pidfd)."""

    def __init__(self, pid: int, pidfd: int, status: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._status = os.fdopen(status, "rb", buffering=0)

    def _read_status(self) -> int:
        """Take the exit code from the pipe (which has it, or ended)."""
        line = self._status.read()
        self._status.close()
        os.close(self._pidfd)
        if not line:
            raise RuntimeError(f"lost the exit code of pid {self.pid}")
        self.returncode = int(line)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the process has ended (then it does nothing)."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # ended; its exit code is on its way
            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedProcess(_Forked):
    """What an ``asyncio.subprocess.Process`` offers the tests, for a forked child:
    ``pid``, ``returncode``, ``stdin`` writer and ``stdout``/``stderr`` readers (when
    piped), ``wait()``, ``communicate()``, ``send_signal()``, ``terminate()``, ``kill()``."""

    def __init__(self, pid: int, pidfd: int, status: int, stdin: asyncio.StreamWriter | None,
                 pipes: Mapping[str, tuple[asyncio.StreamReader, asyncio.Future[None]]]) -> None:
        super().__init__(pid, pidfd, status)
        self.stdin = stdin
        self.stdout = pipes["stdout"][0] if "stdout" in pipes else None
        self.stderr = pipes["stderr"][0] if "stderr" in pipes else None
        self._closed = [closed for _, closed in pipes.values()]
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        loop.add_reader(status, self._on_status)

    def _on_status(self) -> None:
        asyncio.get_running_loop().remove_reader(self._status.fileno())
        try:
            self._exited.set_result(self._read_status())
        except RuntimeError as exc:
            self._exited.set_exception(exc)

    async def wait(self) -> int:
        """Wait for the process to exit and its piped output to end; its exit code
        (``-N`` for signal N)."""
        code = await asyncio.shield(self._exited)
        await asyncio.gather(*self._closed)
        return code

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """Write ``input`` to stdin and close it (if piped), read stdout and stderr to their
        end, wait for the exit; the output read."""
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
                with contextlib.suppress(ConnectionError):
                    await self.stdin.drain()
            self.stdin.close()
        out, err = await asyncio.gather(*(asyncio.ensure_future(stream.read()) if stream else
                                          asyncio.sleep(0, None)
                                          for stream in (self.stdout, self.stderr)))
        await self.wait()
        return out, err


class ForkedPopen(_Forked):
    """What a ``subprocess.Popen`` offers the tests, for a forked child: ``pid``,
    ``returncode``, ``stdin``/``stdout``/``stderr`` files (when piped), ``poll()``,
    ``wait()``, ``send_signal()``, ``terminate()``, ``kill()``."""

    def __init__(self, args: list[str], pid: int, pidfd: int, status: int,
                 files: Mapping[str, IO[Any]]) -> None:
        super().__init__(pid, pidfd, status)
        self.args = args
        self.stdin = files.get("stdin")
        self.stdout = files.get("stdout")
        self.stderr = files.get("stderr")

    def poll(self) -> int | None:
        """The exit code if the process has ended, else ``None``."""
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait (at most ``timeout`` seconds) for the exit; its code."""
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode


class _PipeEnd(asyncio.StreamReaderProtocol):
    """A StreamReader's protocol that also says when its pipe is closed."""

    def __init__(self, reader: asyncio.StreamReader, closed: asyncio.Future[None]) -> None:
        super().__init__(reader)
        self.closed = closed

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.closed.done():
            self.closed.set_result(None)


async def _reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.Future[None]]:
    """A StreamReader on the pipe end ``fd`` and a future done when the pipe closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16, loop=loop)
    closed: asyncio.Future[None] = loop.create_future()
    await loop.connect_read_pipe(lambda: _PipeEnd(reader, closed),
                                 os.fdopen(fd, "rb", buffering=0))
    return reader, closed


async def _writer(fd: int) -> asyncio.StreamWriter:
    """A StreamWriter on the pipe end ``fd``."""
    loop = asyncio.get_running_loop()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop))
    transport, _ = await loop.connect_write_pipe(lambda: protocol,
                                                 os.fdopen(fd, "wb", buffering=0))
    return asyncio.StreamWriter(transport, protocol, None, loop)


class Forking(Protocol):
    """A forking process: ``proc`` and ``close()``, which ends it and waits for it."""

    proc: subprocess.Popen[bytes]

    def close(self) -> None: ...


F = TypeVar("F", bound=Forking)


class OnDemand(Generic[F]):
    """One forking process made by ``start``: started on first use, again if it ended,
    and ended by :meth:`close` (or when this process exits)."""

    def __init__(self, start: Callable[[], F]) -> None:
        self._start = start
        self._now: F | None = None
        self._lock = threading.Lock()

    def get(self) -> F:
        with self._lock:
            if self._now is None or self._now.proc.poll() is not None:
                self._now = self._start()
                atexit.register(self.close)
            return self._now

    def running(self) -> F | None:
        """The forking process if it runs (none is started)."""
        with self._lock:
            now = self._now
        return now if now is not None and now.proc.poll() is None else None

    def close(self) -> None:
        """End the forking process, if started: its children's CPU counts as this
        process's then."""
        with self._lock:
            if self._now is not None:
                self._now.close()
                self._now = None


_forker = OnDemand(_Forker)

Stream = int | IO[Any] | None
"""A child's stream as ``subprocess`` takes it: ``PIPE``, ``DEVNULL``, ``STDOUT`` (for
stderr), a file or fd, or ``None`` (this process's)."""


def _stdio(stdin: Stream, stdout: Stream, stderr: Stream) -> tuple[list[int], dict[str, int]]:
    """The fds the child gets as 0, 1 and 2, and this side's ends of the piped ones."""
    theirs: list[int] = []
    ours: dict[str, int] = {}
    try:
        for name, target in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
            fd = len(theirs)
            if target == subprocess.PIPE:
                read, written = os.pipe()
                theirs.append(read if fd == 0 else written)
                ours[name] = written if fd == 0 else read
            elif target == subprocess.STDOUT and fd == 2:
                theirs.append(os.dup(theirs[1]))
            elif target == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY))
            elif target is None:
                theirs.append(os.dup(fd))
            else:
                theirs.append(os.dup(target if isinstance(target, int) else target.fileno()))
    except BaseException:
        for end in [*theirs, *ours.values()]:
            os.close(end)
        raise
    return theirs, ours


@contextlib.contextmanager
def _handing_over(theirs: Sequence[int], ours: Mapping[str, int]) -> Iterator[None]:
    """Close the child's ends of its streams once handed over, and this side's too if
    that failed."""
    try:
        yield
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)


def _forking(env: Mapping[str, str]) -> _Forker | None:
    """The forking process (started if need be), or ``None`` if ``env`` needs another
    Python start."""
    forker = _forker.get()
    return forker if forker.startup == startup_vars(env) else None


def _job(args: Sequence[str], cwd: Path, env: Mapping[str, str], warm: Sequence[str],
         rlimits: Mapping[int, tuple[int, int]]) -> dict[str, object]:
    return {"args": list(args), "cwd": str(cwd), "env": dict(env), "warm": list(warm),
            "rlimits": {str(k): list(v) for k, v in rlimits.items()}}


async def spawn(args: Sequence[str], *, cwd: Path, env: Mapping[str, str],
                stdin: Stream = subprocess.DEVNULL, stdout: Stream = subprocess.DEVNULL,
                stderr: Stream = subprocess.PIPE, warm: Sequence[str] = (),
                rlimits: Mapping[int, tuple[int, int]] | None = None,
                ) -> ForkedProcess | asyncio.subprocess.Process:
    """``python -m bot *args`` in ``cwd`` with exactly ``env``, its streams as
    ``asyncio.create_subprocess_exec`` takes them, and the resource limits ``rlimits``
    (``resource.RLIMIT_*``: (soft, hard); the others as the forking process has them).
    ``warm`` names modules the command will import that the forking process should
    import first (once, for all later children too)."""
    forker = _forking(env)
    rlimits = dict(rlimits or {})
    if forker is None:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", *args, cwd=cwd, env=dict(env),
            stdin=stdin, stdout=stdout, stderr=stderr,
            preexec_fn=lambda: [resource.setrlimit(k, v) for k, v in rlimits.items()])
    theirs, ours = _stdio(stdin, stdout, stderr)
    with _handing_over(theirs, ours):
        starting = asyncio.ensure_future(asyncio.to_thread(
            forker.start, _job(args, cwd, env, warm, rlimits), theirs))
        try:
            pid, pidfd, status = await asyncio.shield(starting)
        except asyncio.CancelledError:  # the fork goes ahead (it uses the fds): undo it
            with contextlib.suppress(Exception):
                _, pidfd, status = await starting
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                os.close(pidfd)
                os.close(status)
            raise
    writer = await _writer(ours.pop("stdin")) if "stdin" in ours else None
    pipes = {name: await _reader(fd) for name, fd in ours.items()}
    return ForkedProcess(pid, pidfd, status, writer, pipes)


def popen(args: Sequence[str], *, cwd: Path, env: Mapping[str, str],
          stdin: Stream = None, stdout: Stream = None, stderr: Stream = None,
          text: bool = False) -> ForkedPopen | subprocess.Popen[Any]:
    """``python -m bot *args`` in ``cwd`` with exactly ``env``, its streams (and ``text``)
    as ``subprocess.Popen`` takes them."""
    forker = _forking(env)
    if forker is None:
        return subprocess.Popen([sys.executable, "-m", "bot", *args], cwd=cwd, env=dict(env),
                                stdin=stdin, stdout=stdout, stderr=stderr, text=text)
    theirs, ours = _stdio(stdin, stdout, stderr)
    with _handing_over(theirs, ours):
        pid, pidfd, status = forker.start(_job(args, cwd, env, (), {}), theirs)
    files: dict[str, IO[Any]] = {}
    for name, fd in ours.items():
        raw = open(fd, "wb" if name == "stdin" else "rb")  # noqa: SIM115  (the caller's)
        files[name] = io.TextIOWrapper(raw, write_through=name == "stdin") if text else raw
    return ForkedPopen([sys.executable, "-m", "bot", *args], pid, pidfd, status, files)


def close() -> None:
    """End the forking process (at the end of the tests): its children's CPU is counted
    then."""
    _forker.close()
