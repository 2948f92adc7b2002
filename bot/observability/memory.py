"""Where a running process's memory is: tracemalloc snapshots on request.

Started with ``PYTHONTRACEMALLOC=25`` (Python then traces every allocation with
25 frames of its traceback, at a cost in speed and memory; ``=1`` keeps one
frame, which attributes most of it to pydantic and the import machinery),
``roost run`` writes a snapshot when it receives
``SIGUSR2``: ``<data dir>/memory/<UTC time>.tracemalloc``, and logs the
packages holding the most. :func:`by_package` reads such a file the same way
(``bench/bench_telegram.py`` uses it for the per-module memory table).
Without tracing the signal only logs how to turn it on.
"""

from __future__ import annotations

import logging
import time
import tracemalloc
from collections import Counter
from pathlib import Path

log = logging.getLogger("roost.observability.memory")

_SITE_MARKERS = ("site-packages/", "dist-packages/")


def package_of(filename: str) -> str:
    """The top-level package a traced file belongs to (``aiogram``, ``bot``, ``<stdlib>``...)."""
    path = filename.replace("\\", "/")
    for marker in _SITE_MARKERS:
        if marker in path:
            rest = path.split(marker, 1)[1]
            return rest.split("/", 1)[0].removesuffix(".py")
    for ours in ("/bot/", "/channels/", "/plugins/", "/workspaces/", "/roost/"):
        if ours in path:
            return ours.strip("/")
    if path.startswith("<"):
        return path  # <frozen importlib._bootstrap>, <string>...
    return "<stdlib>"


_MACHINERY = frozenset({"<stdlib>", "pydantic", "pydantic_core", "typing_extensions", "attr"})
"""Code that allocates on behalf of its caller (classes, models, imports): skipped when
a traceback says who called it."""


def by_package(snapshot: tracemalloc.Snapshot) -> Counter[str]:
    """Bytes held per top-level package in ``snapshot``.

    Each allocation counts for the innermost frame of its traceback outside the
    machinery (the standard library, the import system, pydantic): the package
    whose code or models it serves. With one frame traced that is the allocating file.
    """
    sizes: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        packages = [package_of(frame.filename) for frame in reversed(stat.traceback)]
        owner = next((p for p in packages if p not in _MACHINERY and not p.startswith("<")),
                     packages[0])
        sizes[owner] += stat.size
    return sizes


def dump_snapshot(data_dir: Path) -> Path | None:
    """Write a snapshot under ``data_dir/memory`` and log the largest packages.

    ``None`` (and a log line saying how to enable it) when tracemalloc is not tracing.
    """
    if not tracemalloc.is_tracing():
        log.warning("memory snapshot requested, but allocations are not traced: start "
                    "roost with PYTHONTRACEMALLOC=25 to use SIGUSR2 snapshots")
        return None
    snapshot = tracemalloc.take_snapshot()
    folder = data_dir / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / time.strftime("%Y%m%dT%H%M%SZ.tracemalloc", time.gmtime())
    snapshot.dump(str(path))
    top = ", ".join(f"{name} {size / 2**20:.1f} MiB"
                    for name, size in by_package(snapshot).most_common(8))
    log.info("memory snapshot %s: traced %.1f MiB; largest: %s", path,
             tracemalloc.get_traced_memory()[0] / 2**20, top)
    return path
