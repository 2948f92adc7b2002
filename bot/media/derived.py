"""Copies of received files made for a model, kept in the workspace so each is made once.

Preparing a photo for a model (decode, scale, re-encode) is the costly part of
sending it, and a conversation sends its images again with every model call,
after restarts too. The prepared copy is therefore stored
next to the originals, in the workspace's hidden ``.cache/media/`` directory,
under a name made of the original's path (``inbox%2F2026-11-23%2Fphoto-1.jpg``)
and a digest of its path, size, modification time and inode (an edit, a
replace or a new file with the same name makes a new name) and of how it was
prepared (``variant``, e.g. the long edge). The original is never changed.

The files here are a cache: a missing, unreadable or damaged copy is made
again, and the caller checks a copy before it sends it (see
:func:`bot.media.images.model_ready`), since anything in a workspace may have
been changed by the file tools. Roost itself deletes no workspace file; the
originals go when a tool or a person removes or replaces them, so their copies
go by :func:`prune_derived` (whose name names the original it was made from)
and :func:`forget_derived` (the original of a part was found gone).

The intake also hands the bytes it has just stored to the provider
(:func:`hand_over`, :func:`take_over`), which would otherwise read the same
megabytes back from disk a moment later.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from stat import S_ISREG
from urllib.parse import quote, unquote

from bot.contracts.tools import ToolError
from workspaces.beneath import make_dirs, open_dir, read_fd, unlink_at, write_atomic
from workspaces.root import WorkspaceRoot

log = logging.getLogger("roost.media.derived")

CACHE_DIR = ".cache/media"
"""Where the prepared copies live, relative to the workspace."""
VERSION = 2
"""Part of every name: a change to how copies are made (quality, filter) bumps it, so
copies made the old way are no longer found (and :func:`prune_derived` removes them)."""
MAX_NAME = 240
"""Longest copy name (file systems allow 255 bytes); an original with a longer path
gets no copy on disk and is prepared again when its payload has left memory."""
PRUNE_EVERY = 600.0
"""Seconds between two sweeps of one workspace's copies by :func:`tidy`."""
TEMP_AGE = 3600.0
"""A half-written copy (``.name.uuid``) older than this was left by a crash."""
HAND_OVER_SECONDS = 60.0
"""How long handed-over bytes wait for the provider."""
HAND_OVER_FILES = 8
HAND_OVER_BYTES = 64 * 1024 * 1024
"""At most this many bytes wait (a model without vision never takes them)."""

_swept: dict[str, float] = {}
_handed: OrderedDict[tuple[str, int, int, int], tuple[float, bytes]] = OrderedDict()
_lock = threading.Lock()


def derived_name(path: str, stat: os.stat_result, variant: str) -> str | None:
    """The file name of the copy of workspace file ``path`` (as ``stat`` found it),
    ``None`` if ``path`` is too long to be part of a name."""
    key = f"{VERSION}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\0{variant}"
    name = f"{_encoded(path)}.{hashlib.sha256(key.encode()).hexdigest()[:24]}-{variant}"
    return name if len(name.encode()) <= MAX_NAME else None


def _encoded(path: str) -> str:
    # Reversible, one name per path: "/" and "%" become %2F and %25, nothing else changes.
    return quote(path, safe="")


def _cache_parts() -> tuple[str, ...]:
    return tuple(CACHE_DIR.split("/"))


def prune_derived(workspace: Path) -> int:
    """Remove the copies in ``workspace`` whose original is gone or changed; how many.

    A copy's name says which file it was made from and, through its digest, which
    version of it: a copy whose original no longer exists, or now has another size,
    time or inode, is never sent again. Copies made the old way (another
    :data:`VERSION`) and half-written ones left by a crash go too. The directory
    is opened below the workspace without following a link, and names are removed
    relative to it.
    """
    removed = 0
    try:
        with WorkspaceRoot(workspace, follow=False) as root:
            directory = open_dir(root.fd, _cache_parts())
    except (OSError, ToolError):
        return 0
    try:
        with os.scandir(directory) as it:
            entries = list(it)
        now = time.time()
        for entry in entries:
            if _stale(workspace, entry, now):
                with contextlib.suppress(OSError):
                    unlink_at(directory, entry.name)
                    removed += 1
    except OSError:
        pass
    finally:
        os.close(directory)
    return removed


def _stale(workspace: Path, entry: os.DirEntry[str], now: float) -> bool:
    name = entry.name
    if name.startswith("."):
        try:
            return now - entry.stat(follow_symlinks=False).st_mtime > TEMP_AGE
        except OSError:
            return False
    encoded, dot, tail = name.rpartition(".")
    _, dash, variant = tail.partition("-")
    if not dot or not dash:
        return True  # not a name this version makes
    original = unquote(encoded)
    try:
        with WorkspaceRoot(workspace) as root:
            fd, _ = root.open(original)
        try:
            stat = os.fstat(fd)
        finally:
            os.close(fd)
    except (OSError, ToolError):
        return True
    return derived_name(original, stat, variant) != name


def forget_derived(workspace: Path, path: str) -> None:
    """Remove every copy made from workspace file ``path`` (found gone)."""
    prefix = _encoded(path) + "."
    try:
        with WorkspaceRoot(workspace, follow=False) as root:
            directory = open_dir(root.fd, _cache_parts())
    except (OSError, ToolError):
        return
    try:
        with os.scandir(directory) as it:
            names = [e.name for e in it]
        for name in names:
            if name.startswith(prefix) and "." not in name[len(prefix):]:
                with contextlib.suppress(OSError):
                    unlink_at(directory, name)
    except OSError:
        pass
    finally:
        os.close(directory)


def tidy(workspace: Path) -> None:
    """:func:`prune_derived`, at most once per :data:`PRUNE_EVERY` seconds per workspace
    in this process (called whenever a copy is written)."""
    if _swept_now(workspace):
        prune_derived(workspace)


def _swept_now(workspace: Path) -> bool:
    """Note a sweep of ``workspace`` now; whether one is due (none in the last
    :data:`PRUNE_EVERY` seconds)."""
    key = str(workspace)
    now = time.monotonic()
    with _lock:
        last = _swept.get(key)
        if last is not None and now - last < PRUNE_EVERY:
            return False
        _swept[key] = now
        if len(_swept) > 10_000:
            _swept.clear()
    return True


def hand_over(path: Path, data: bytes) -> None:
    """Keep ``data``, just stored as ``path`` (resolved), for :func:`take_over`."""
    try:
        stat = path.stat()
    except OSError:
        return
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    now = time.monotonic()
    with _lock:
        _handed[key] = (now, data)
        _handed.move_to_end(key)
        _expire(now)
        while len(_handed) > HAND_OVER_FILES or (
                len(_handed) > 1 and sum(len(d) for _, d in _handed.values()) > HAND_OVER_BYTES):
            _handed.popitem(last=False)


def take_over(path: Path, stat: os.stat_result) -> bytes | None:
    """The bytes handed over for ``path`` as ``stat`` finds it now, once; ``None`` if
    none were (or the file changed since)."""
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    with _lock:
        _expire(time.monotonic())
        item = _handed.pop(key, None)
    return item[1] if item is not None else None


def forget_handed() -> None:
    """Drop every handed-over file (their memory is about to be trimmed)."""
    with _lock:
        _handed.clear()


def _expire(now: float) -> None:
    while _handed:
        when, _ = next(iter(_handed.values()))
        if now - when <= HAND_OVER_SECONDS:
            break
        _handed.popitem(last=False)


def read_derived(workspace: Path, name: str) -> bytes | None:
    """The copy called ``name`` in ``workspace``, or ``None`` (not made yet, unreadable,
    not a regular file, or reached through a link)."""
    try:
        with WorkspaceRoot(workspace, follow=False) as root:
            fd, _ = root.open((*_cache_parts(), name))
    except (OSError, ToolError):
        return None
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            return None
        return read_fd(fd, stat.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_derived(workspace: Path, name: str, data: bytes) -> bool:
    """Keep ``data`` as the copy called ``name``; ``False`` if it could not be written.

    Written aside and renamed into place relative to the directory's descriptor
    (made and opened below the workspace without following a link), so a reader
    finds the whole copy or none. A failure (read-only workspace, disk full, a
    link planted as the directory) is logged and otherwise ignored: the copy is
    made again next time.
    """
    try:
        with WorkspaceRoot(workspace, follow=False) as root:
            try:
                directory = open_dir(root.fd, _cache_parts())
            except FileNotFoundError:
                directory = make_dirs(root.fd, _cache_parts())
                # Nothing in it to sweep but what is written now: tidy() need not look.
                _swept_now(workspace)
        try:
            write_atomic(directory, name, data, 0o644)
        finally:
            os.close(directory)
        return True
    except (OSError, ToolError) as exc:
        log.info("could not keep a prepared copy in %s: %s", workspace, exc)
        return False
