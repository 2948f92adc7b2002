"""The xdist workers of ``pytest -n`` start as forks of one process that imported, once,
what the test modules import.

Each worker's command (``python -u -c <execnet's bootstrap>``) gets a launcher in front
(tests/fork_launch.py): it hands the worker's stdin, stdout, stderr, working directory and
environment to the forking process ``python -m tests.worker_forks LISTENER CONTROL``
(tests/forker.py), which the controller starts in ``pytest_configure``, so that the
workers do not each import pytest's plugins, Roost and every SDK before they can collect
(bench/README.md, "Forked xdist workers"). A worker is still a process of its own (its
own pid, environment, working directory, streams; signals and its exit pass through the
launcher), but its parent is the forking process, its ``/proc`` cmdline that process's,
and all workers share one hash seed. The test modules themselves (and
``tests.conftest``) are not imported in advance: pytest imports them in each worker,
with their asserts rewritten. If the imports leave a second thread running, the forking
process declines every worker (a fork would copy a lock a thread holds) and says so on
stderr: the launchers then exec the workers as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import re
import shlex
import socket
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path

from tests.forker import Forker, Forking, Program

__all__ = ["close", "forking", "launcher", "python", "serve", "start"]

ROOT = Path(__file__).resolve().parent.parent
AHEAD = ("xdist.remote", "execnet", "_pytest.python", "_pytest.fixtures")
"""What every worker imports that no test module names."""


IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?[ \t]*([\w., \t]*)"
                    r"|import[ \t]+([\w., \t]+))", re.MULTILINE)
"""The first line of an import statement (a regex: parsing every test module took longer
than the imports it was for would save)."""


def imported_by_tests(root: Path = ROOT) -> list[str]:
    """The modules outside ``tests`` that the modules under ``root/tests`` import by name
    (``from X import y`` counts ``X``, and ``X.y`` in case that is a module)."""
    names: set[str] = set()
    for path in sorted((root / "tests").rglob("*.py")):
        for match in IMPORT.finditer(path.read_text(encoding="utf-8", errors="replace")):
            module, attributes, modules = match.groups()
            if module:
                names.add(module)
                names.update(f"{module}.{a.split()[0]}" for a in attributes.split(",")
                             if a.strip())
            else:
                names.update(m.split()[0] for m in modules.split(",") if m.strip())
    return sorted(n for n in names if n.split(".")[0] not in ("tests", "__future__"))


def import_ahead(names: list[str]) -> None:
    """Import pytest's plugins and ``names`` (those that exist and import cleanly)."""
    for plugin in entry_points(group="pytest11"):
        with contextlib.suppress(Exception):
            plugin.load()
    for name in [*AHEAD, *names]:
        parent, _, attribute = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], attribute):
            continue  # a name in a module, not a module
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def worker(args: list[str]) -> Program | None:
    """``-u [-B] -c <bootstrap>`` (an xdist worker, as execnet starts it) as a program."""
    from execnet.gateway_io import popen_bootstrapline

    *flags, dash_c, code = args if len(args) >= 2 else ["", "", ""]
    if dash_c != "-c" or code != popen_bootstrapline or not set(flags) <= {"-u", "-B"}:
        return None

    def main() -> None:
        exec(code, sys.modules["__main__"].__dict__)  # what -c runs

    return Program(main, ["-c"], "", unbuffered="-u" in flags, write_bytecode="-B" not in flags)


def threads() -> int:
    """How many threads this process runs."""
    return len(os.listdir("/proc/self/task"))


def serve(listener: int, control: int, modules: list[str]) -> None:
    """Import ahead (``modules``, or else pytest's plugins and what the tests import), then
    serve the workers' launchers on ``listener`` and ``control``."""
    gc.disable()  # while importing: what is imported here lives as long as the process
    if modules:
        for name in modules:
            importlib.import_module(name)
    else:
        import_ahead(imported_by_tests())
    programs = worker
    if threads() > 1:
        print(f"tests/worker_forks.py: {threads()} threads after the imports; the xdist "
              "workers start as their own processes", file=sys.stderr)
        programs = lambda args: None  # noqa: E731
    gc.freeze()  # never scanned again, nor copied into a child by the scan
    gc.enable()
    Forker(socket.socket(fileno=listener), socket.socket(fileno=control), programs).serve()


def forking(modules: Sequence[str] = (), stderr: int | None = None) -> Forking:
    """Start a forking process for workers (``modules`` to import ahead, else what the
    tests import); its stderr goes to ``stderr`` (default: this process's)."""
    return Forking("tests.worker_forks", *modules, stderr=stderr)


def python(forks: Forking) -> str:
    """The ``python`` of an execnet ``popen`` spec that starts the worker as a fork."""
    return shlex.join(forks.launcher())


_forking: Forking | None = None


def start() -> None:
    """Start the forking process (in the controller, before the workers)."""
    global _forking
    if _forking is None:
        _forking = forking()


def launcher() -> str | None:
    """The ``python`` of an execnet ``popen`` spec that starts the worker as a fork, or
    ``None`` if the forking process was not started."""
    return None if _forking is None else python(_forking)


def close() -> None:
    """End the forking process, after the workers ended."""
    global _forking
    if _forking is not None:
        _forking.close()
        _forking = None


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
