"""Removing setuid, setgid (and, on files, sticky) bits from a workspace after ``exec``.

A command may ``chmod u+s`` a file it made; the sandbox mounts the workspace
``nosuid``, but the bit stays on the host's disk, where it would take effect for
anyone who runs the file outside. :func:`strip_special_bits` walks the workspace by
directory descriptor: every entry is opened once with ``O_PATH | O_NOFOLLOW``
relative to its directory's descriptor, links are never followed (nor changed),
directories are entered through the descriptor just opened, and the mode is changed
on that descriptor (``/proc/self/fd/N``, since ``fchmod`` refuses ``O_PATH``
descriptors). A sandbox swapping entries meanwhile can only make the walk skip
them; it cannot lead it outside. The walk is bounded in entries, depth and time.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger("roost.plugins.exec_tool")

MAX_ENTRIES = 200_000
MAX_SECONDS = 10.0
MAX_DEPTH = 128
"""Directories held open at once (two descriptors each) while walking down."""

SPECIAL = stat.S_ISUID | stat.S_ISGID
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _Entries(Protocol):
    """What ``os.scandir`` returns for a descriptor."""

    def __iter__(self) -> _Entries: ...
    def __next__(self) -> os.DirEntry[str]: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class Stripped:
    """What one walk did: entries seen, modes changed, whether it saw everything."""

    visited: int = 0
    changed: int = 0
    failed: int = 0
    """Entries whose mode could not be read or changed (gone meanwhile, no permission)."""
    cut: str = ""
    """Why the walk stopped early (``""`` when it covered the whole workspace)."""


def strip_special_bits(root: Path, *, max_entries: int = MAX_ENTRIES,
                       max_seconds: float = MAX_SECONDS, max_depth: int = MAX_DEPTH
                       ) -> Stripped:
    """Clear setuid and setgid on everything under ``root`` (itself included) and sticky on
    non-directories, never following a link; one log line if a bound stops the walk."""
    done = Stripped()
    deadline = time.monotonic() + max_seconds
    top = os.open(root, _DIR | os.O_NOFOLLOW)
    stack: list[tuple[int, _Entries]] = []
    try:
        _fix(top, done)
        stack.append((top, os.scandir(top)))
        while stack:
            fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(fd)
                stack.pop()
                continue
            done.visited += 1
            if done.visited > max_entries:
                done.cut = f"more than {max_entries} entries"
                break
            if time.monotonic() > deadline:
                done.cut = f"more than {max_seconds:g}s"
                break
            child = _enter(fd, entry.name, done)
            if child is None:
                continue
            if len(stack) >= max_depth:
                os.close(child)
                done.cut = f"directories nested deeper than {max_depth}"
                continue
            try:
                stack.append((child, os.scandir(child)))
            except OSError:
                os.close(child)
                done.failed += 1
    finally:
        for fd, entries in stack:
            entries.close()
            os.close(fd)
    if done.cut:
        log.warning("exec: stopped removing setuid/setgid bits in %s after %d entries (%s); "
                    "the next exec call walks it again", root, done.visited, done.cut)
    return done


def _enter(parent: int, name: str, done: Stripped) -> int | None:
    """Fix ``name`` in directory ``parent``; a readable descriptor of it when it is a
    directory to walk into, else ``None``.

    A look without opening (``fstatat``, no link followed) first: most entries need
    nothing more. An entry to change or enter is then opened without following links
    and used only if it is still the inode looked at.
    """
    try:
        seen = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        done.failed += 1
        return None
    is_dir = stat.S_ISDIR(seen.st_mode)
    if stat.S_ISLNK(seen.st_mode) or not (is_dir or stat.S_IMODE(seen.st_mode) & _drop(False)):
        return None
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:  # gone meanwhile
        done.failed += 1
        return None
    try:
        now = os.fstat(handle)
        if (now.st_ino, now.st_dev) != (seen.st_ino, seen.st_dev):
            done.failed += 1  # swapped meanwhile: the next walk sees what is there then
            return None
        if not _fix(handle, done):
            return None
        try:
            # The directory just checked, by its descriptor: a swap meanwhile changes nothing.
            return os.open(".", _DIR, dir_fd=handle)
        except OSError:
            done.failed += 1
            return None
    finally:
        os.close(handle)


def _drop(is_dir: bool) -> int:
    """The bits to clear: setuid and setgid, and sticky on anything but a directory."""
    return SPECIAL if is_dir else SPECIAL | stat.S_ISVTX


def _fix(fd: int, done: Stripped) -> bool:
    """Clear the bits on the file ``fd`` refers to; ``True`` when it is a directory."""
    try:
        st = os.fstat(fd)
    except OSError:
        done.failed += 1
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    is_dir = stat.S_ISDIR(st.st_mode)
    drop = _drop(is_dir)
    mode = stat.S_IMODE(st.st_mode)
    if mode & drop:
        try:
            # The inode fd refers to, not a path: /proc/self/fd/N is resolved by the kernel
            # to the open file itself (fchmod refuses O_PATH descriptors).
            os.chmod(f"/proc/self/fd/{fd}", mode & ~drop)
            done.changed += 1
        except OSError:
            done.failed += 1
    return is_dir
