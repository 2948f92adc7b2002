"""Bytecode for the project and its test modules, written once before pytest-xdist's workers
start.

On a fresh clone no ``__pycache__`` exists: the workers, started at the same moment, would
each compile Roost's modules and rewrite every test module's asserts (pytest's own cached
form of a test module), all the same work. :func:`precompile` does it once in the
controller, over a pool of one process per CPU; the workers then find every file compiled.
A file whose bytecode is already current is skipped, so a second run pays only the check.
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import fnmatch
import importlib.util
import marshal
import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, get_cache_dir, rewrite_asserts

SKIP_DIRS = frozenset({"__pycache__", "data", "site", "node_modules"})
"""Directories never compiled: bytecode caches, test data (example scripts no test imports),
the built documentation."""

_config: pytest.Config | None = None
"""The controller's configuration, which the forked pool processes inherit."""


def sources(root: Path, packages: Iterable[str]) -> list[Path]:
    """Every ``*.py`` file under the ``packages`` directories of ``root``."""
    found = []
    for package in packages:
        for dirpath, dirnames, filenames in os.walk(root / package):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
            found.extend(Path(dirpath, name) for name in filenames if name.endswith(".py"))
    return sorted(found)


def is_test_module(path: Path, patterns: Iterable[str]) -> bool:
    """Whether pytest rewrites the asserts of ``path`` (a conftest or a ``python_files`` match)."""
    return path.name == "conftest.py" or any(fnmatch.fnmatch(path.name, p) for p in patterns)


def rewritten_pyc(path: Path) -> Path:
    """Where pytest caches the assert-rewritten bytecode of the test module ``path``."""
    return get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)


def rewrite(path: Path) -> None:
    """Write pytest's assert-rewritten bytecode of ``path`` unless it is current: pytest's
    format (a hash-checked pyc, PEP 552), written to a temporary name and renamed into place
    as pytest does, so a worker reading it at the same time sees the old file or the new."""
    source = path.read_bytes()
    source_hash = importlib.util.source_hash(source)
    header = importlib.util.MAGIC_NUMBER + b"\x03\x00\x00\x00" + source_hash[:8]
    pyc = rewritten_pyc(path)
    try:
        with pyc.open("rb") as cached:
            if cached.read(len(header)) == header:
                return
    except OSError:
        pass
    tree = ast.parse(source, filename=str(path))
    rewrite_asserts(tree, source, str(path), _config)
    code = compile(tree, str(path), "exec", dont_inherit=True)
    pyc.parent.mkdir(exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    partial.write_bytes(header + marshal.dumps(code))
    os.replace(partial, pyc)


def compile_one(path: Path, test_patterns: tuple[str, ...]) -> None:
    """Bytecode for ``path``: rewritten for a test module, else the interpreter's own."""
    if is_test_module(path, test_patterns):
        rewrite(path)
    else:
        compileall.compile_file(path, quiet=2)


def precompile(config: pytest.Config, packages: Iterable[str], root: Path | None = None) -> None:
    """Compile every module under the ``packages`` of ``root`` (the rootdir) not compiled yet, test
    modules in pytest's rewritten form, over one process per CPU. A file that does not
    compile is skipped: importing it reports the error as it would have anyway."""
    global _config
    _config = config
    patterns = tuple(config.getini("python_files"))
    files = sources(root or config.rootpath, packages)
    with ProcessPoolExecutor(len(os.sched_getaffinity(0)),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(compile_quietly, files, [patterns] * len(files), chunksize=16))


def compile_quietly(path: Path, patterns: tuple[str, ...]) -> None:
    """:func:`compile_one`, leaving a file that cannot be read or compiled as it is."""
    with contextlib.suppress(OSError, SyntaxError, ValueError):
        compile_one(path, patterns)
