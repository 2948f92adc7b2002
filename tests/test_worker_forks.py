"""The xdist workers forked by tests/worker_forks.py behave as the processes execnet would
have started: its bootstrap runs on the launcher's streams, working directory and
environment, with what was imported ahead already there; the launcher's death ends the
worker; and a forking process left with a second thread declines, so the launcher execs
the worker itself."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import execnet
import psutil
import pytest
from execnet.gateway_io import popen_bootstrapline

from tests.forker import Forking
from tests.worker_forks import forking, python, worker

PROBE = """
import os, sys
channel.send({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv,
              "cwd": os.getcwd(), "mark": os.environ.get("ROOST_FORK_MARK"),
              "ahead": sorted(m for m in ("json", "threaded") if m in sys.modules),
              "main": sys.modules["__main__"].__dict__.get("Forking") is None})
"""


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (reaped, or a zombie)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def command_has(process: psutil.Process, word: str) -> bool:
    """Whether ``word`` is an argument of ``process`` (not when it ended meanwhile)."""
    try:
        return word in process.cmdline()
    except psutil.NoSuchProcess:  # a zombie too
        return False


def wait_until_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def forks() -> Iterator[Forking]:
    started = forking(["json"])
    yield started
    started.close()


def probe(gateway: execnet.Gateway) -> dict[str, Any]:
    answer: dict[str, Any] = gateway.remote_exec(PROBE).receive(timeout=30)
    return answer


def test_only_execnets_bootstrap_runs_as_a_worker() -> None:
    program = worker(["-u", "-c", popen_bootstrapline])
    assert program is not None and program.unbuffered and program.write_bytecode
    assert program.argv == ["-c"] and program.path0 == ""
    no_bytecode = worker(["-u", "-B", "-c", popen_bootstrapline])
    assert no_bytecode is not None and not no_bytecode.write_bytecode
    assert worker(["-c", "print(1)"]) is None
    assert worker(["-X", "dev", "-c", popen_bootstrapline]) is None
    assert worker(["script.py"]) is None


def test_a_worker_runs_as_a_fork_on_the_launchers_streams_directory_and_environment(
        forks: Forking, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROOST_FORK_MARK", "launcher's")
    gateway = execnet.makegateway(f"popen//python={python(forks)}")
    try:
        seen = probe(gateway)
        assert seen["ppid"] == forks.proc.pid  # a fork of the forking process
        assert seen["argv"] == ["-c"] and seen["cwd"] == str(tmp_path)
        assert seen["mark"] == "launcher's" and seen["ahead"] == ["json"]
        assert seen["main"]  # a __main__ of its own, not the forking process's
        assert forks.live() == [seen["pid"]]
    finally:
        gateway.exit()
    assert wait_until_gone(seen["pid"])
    assert forks.live() == []


def test_killing_the_launcher_ends_its_worker(forks: Forking) -> None:
    gateway = execnet.makegateway(f"popen//python={python(forks)}")
    seen = probe(gateway)
    [launcher] = [p for p in psutil.Process().children() if command_has(p, forks.address)]
    assert launcher.pid != seen["pid"] and not gone(seen["pid"])
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    assert wait_until_gone(seen["pid"])
    assert forks.live() == []


def test_a_forking_process_left_with_a_thread_declines_and_the_worker_execs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the forking process's and the launcher's
    log = tmp_path / "forking.log"
    with log.open("wb") as stderr:
        forks = forking(["threaded"], stderr=stderr.fileno())
    try:
        gateway = execnet.makegateway(f"popen//python={python(forks)}")
        try:
            seen = probe(gateway)
        finally:
            gateway.exit()
        assert seen["ppid"] == os.getpid()  # the launcher became the worker
        assert seen["argv"] == ["-c"] and seen["ahead"] == []
        assert forks.live() == []
    finally:
        forks.close()
    assert "threads after the imports; the xdist workers start as their own processes" \
        in log.read_text()


def test_the_suite_runs_on_forked_workers_when_run_by_xdist() -> None:
    """Under ``pytest -n`` (the README's command) this very process is such a fork."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        assert sys.argv[0] != "-c"  # not a worker at all: nothing forked it
        return
    with open("/proc/self/cmdline", "rb") as cmdline:
        assert b"tests.worker_forks" in cmdline.read()  # the forking process's command
    assert sys.argv == ["-c"]
