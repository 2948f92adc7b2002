"""``roost`` commands in tests, each in a fork of one process that imported Roost once.

A command run so is a ``roost`` process of its own in all but the imports: its own
working directory, environment, stdin, stdout, stderr and exit code, as
``subprocess.run([sys.executable, "-m", "bot", ...])`` gives. Importing Roost was most
of the CPU of each such process (tests/test_cli_secrets.py forks the same way). An
environment that changes how Python itself starts (a ``PYTHON*`` variable the forking
process does not share, :func:`tests.roost_forks.startup_vars`) gets a real new process
instead.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.roost_forks import startup_vars

__all__ = ["CHILD", "close", "run_roost"]

CHILD = r"""
import os, sys, traceback
from bot.app.cli import main


def child(job):
    # In a fork whose stdin is set: run `roost *job["args"]` in job["cwd"] with job["env"],
    # its output to the files job["out"] and job["err"], the modules job["blocked"] (if any)
    # not importable; then exit with its code.
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    for fd, path in ((1, job["out"]), (2, job["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    for name in job.get("blocked", ()):
        if any(m == name or m.startswith(name + ".") for m in sys.modules):
            print(f"cli_forks: {name} is imported already, it cannot be blocked", file=sys.stderr)
            os._exit(70)
        sys.modules[name] = None  # as if not installed: importing it raises ImportError
    # A fresh reader on the command's stdin (the jobs came through this one's buffer).
    sys.stdin = open(0, encoding=sys.stdin.encoding, errors=sys.stdin.errors,
                     closefd=False)
    sys.argv = ["roost", *job["args"]]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
"""
"""Python source of ``child(job)``, which runs one ``roost`` command in a fork of a process
that imported the command line (tests/test_cli_secrets.py's driver uses it too)."""

_DRIVER = CHILD + r"""
import importlib, json
from bot.pluginhost.manager import BUILTIN_PLUGINS

for name in ("bot.app.roost", "bot.app.offers", *BUILTIN_PLUGINS):
    importlib.import_module(name)

for line in sys.stdin:
    job = json.loads(line)
    data = job["input"]
    if data is not None:
        read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        if data is None:  # stdin: /dev/null
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        else:  # stdin: a pipe that holds data, then ends
            os.close(write)
            os.dup2(read, 0)
            os.close(read)
        child(job)
    os.write(1, b"%d\n" % pid)
    if data is not None:
        os.close(read)
        try:
            with open(write, "w", encoding="utf-8") as pipe:
                pipe.write(data)
        except OSError:  # the command ended without reading it all
            pass
    _, status = os.waitpid(pid, 0)
    os.write(1, b"%d\n" % os.waitstatus_to_exitcode(status))
"""


class _Forker:
    """The forking process (started on first use, ended when this process exits)."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [python, "-c", _DRIVER], env=self.env, cwd=tempfile.gettempdir(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.lock = threading.Lock()
        self._read = b""
        atexit.register(self.close)

    def python_differs(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` sets up Python differently from the forking process (whose
        output is unbuffered: written to files and read at the end, that changes nothing)."""
        return startup_vars(self.env) != startup_vars(env)

    def _line(self, deadline: float | None) -> str:
        # The pipe is read by hand: a buffered reader may take both of a job's lines (a
        # command that ends at once) in one read, and select() would then wait for a
        # second line that is already read.
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._read:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the forking process ended")
            self._read += chunk
        line, _, self._read = self._read.partition(b"\n")
        return line.decode()

    def run(self, args: list[str], cwd: Path, env: Mapping[str, str], input: str | None,
            timeout: float, blocked: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as scratch, self.lock:
            files = {name: Path(scratch, name) for name in ("out", "err")}
            for path in files.values():
                path.touch()
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({
                "args": args, "cwd": str(cwd), "env": dict(env), "input": input,
                "blocked": list(blocked),
                **{name: str(path) for name, path in files.items()}}) + "\n")
            self.proc.stdin.flush()
            pid = int(self._line(None))
            try:
                code = int(self._line(time.monotonic() + timeout))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
                raise subprocess.TimeoutExpired(["roost", *args], timeout) from None
            return subprocess.CompletedProcess(
                [self.python, "-m", "bot", *args], code,
                files["out"].read_text(), files["err"].read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait()


_forkers: dict[str, _Forker] = {}
"""The forking process of each Python (the test environment's, or another's)."""
_started = threading.Lock()


def run_roost(args: list[str], *, cwd: Path, env: Mapping[str, str], input: str | None = None,
              timeout: float = 120, python: str = sys.executable, blocked: Sequence[str] = (),
              ) -> subprocess.CompletedProcess[str]:
    """``python -m bot *args`` in ``cwd`` with exactly ``env``; its output as text, like
    ``subprocess.run(..., capture_output=True, text=True)``. Its stdin is a pipe that
    holds ``input`` and then ends, or ``/dev/null`` when ``input`` is ``None``. The modules
    named in ``blocked`` cannot be imported (as if not installed)."""
    with _started:
        forker = _forkers.get(python)
        if forker is None or forker.proc.poll() is not None:
            # Python set up as for this process: a command whose environment sets it up
            # otherwise (PYTHONPATH, say) is exec'd, not every later one.
            forker = _forkers[python] = _Forker(python, {
                **{k: v for k, v in os.environ.items() if not k.startswith("ROOST_")},
                "PYTHONUNBUFFERED": "1"})
    if forker.python_differs(env):
        command = ["-m", "bot", *args] if not blocked else ["-c", (
            f"import sys; sys.modules.update(dict.fromkeys({list(blocked)!r})); "
            f"sys.argv = ['roost', *{args!r}]; from bot.app.cli import main; main()")]
        return subprocess.run([python, *command], cwd=cwd, env=dict(env),
                              input=input, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL if input is None else None)
    return forker.run(args, cwd, env, input, timeout, blocked)


def close(python: str | None = None) -> None:
    """End the forking process of ``python``, or all of them (the suite's end): their
    forks' CPU is counted then."""
    with _started:
        for name in [python] if python is not None else list(_forkers):
            forker = _forkers.pop(name, None)
            if forker is not None:
                forker.close()
