"""A directory of skill folders, re-read when it changes, like the pattern library.

At most every ``check_interval`` seconds (or on :meth:`SkillLibrary.reload_if_changed`)
the directory is listed: each folder's name, its ``SKILL.md``'s ``mtime_ns`` and size,
and the state file's (:mod:`plugins.skills.state`). A change re-reads every
``SKILL.md`` and swaps the new list in with one assignment, so a reader sees the old
list or the new one, never a mix. Each ``SKILL.md`` is opened once below the
directory with no link followed anywhere (a folder or file swapped for a link is
refused), read from that descriptor up to :data:`MAX_SKILL_BYTES`, validated
(:func:`plugins.skills.format.parse_skill`) and scanned by the input guard: a skill
that fails any of these is listed with its problem and never offered.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from plugins.skills.format import SKILL_FILE, Skill, SkillError, digest, parse_skill
from plugins.skills.state import STATE_FILE, SkillState, read_state
from roost import Parts, open_beneath, open_root, read_fd

log = logging.getLogger("roost.plugins.skills")

MAX_SKILL_BYTES = 256 * 1024
"""The largest ``SKILL.md`` read; a larger one makes its skill broken."""
MAX_SKILLS = 500
"""Folders read from one directory; the rest are listed as skipped."""
DEFAULT_CHECK_INTERVAL = 2.0

Scan = Callable[[str], Sequence[str]]
"""The input guard: names of the patterns that match a text."""

Snapshot = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One folder of a skills directory: its skill, or why it cannot be used."""

    folder: str
    skill: Skill | None
    problem: str = ""
    disabled: bool = False
    directory: str = ""

    @property
    def usable(self) -> bool:
        """Valid, not flagged by the guard, and not disabled."""
        return self.skill is not None and not self.problem and not self.disabled


def open_directory(root: Path, sub: Parts) -> int:
    """A descriptor of ``root`` (the operator's path) / ``sub`` (no link followed)."""
    fd = open_root(root)
    if not sub:
        return fd
    try:
        return open_beneath(fd, sub, os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(fd)


def open_skill(directory_fd: int, folder: str) -> int:
    """A descriptor of skill ``folder`` below ``directory_fd``; a link raises ``ELOOP``."""
    return open_beneath(directory_fd, (folder,), os.O_RDONLY | os.O_DIRECTORY)


def read_skill_md(skill_fd: int) -> str:
    """The text of the ``SKILL.md`` in ``skill_fd``'s folder (a regular file, no link)."""
    fd = open_beneath(skill_fd, (SKILL_FILE,), os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SkillError("SKILL.md is not a regular file")
        if info.st_size > MAX_SKILL_BYTES:
            raise SkillError(f"SKILL.md is too large ({info.st_size} bytes > {MAX_SKILL_BYTES})")
        data = read_fd(fd, MAX_SKILL_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SKILL_BYTES:
        raise SkillError(f"SKILL.md is too large (more than {MAX_SKILL_BYTES} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SkillError("SKILL.md is not UTF-8 text") from None


def guard_problem(text: str, skill: Skill, scan: Scan | None, trusted: str | None) -> str:
    """Why the guard refuses ``skill`` (its SKILL.md ``text``), or ''; a SKILL.md an admin
    enabled as it is now (``trusted``: its digest) passes."""
    if scan is None:
        return ""
    hits = list(dict.fromkeys(scan(f"{skill.description}\n{skill.body}")))
    if not hits or trusted == digest(text):
        return ""
    return "refused: its text trips the input guard (" + ", ".join(hits) + ")"


def load_entry(directory_fd: int, folder: str, scan: Scan | None,
               trusted: str | None = None) -> Entry:
    """Read, validate and scan the skill in ``folder`` (``trusted``: the digest of a
    SKILL.md an admin enabled despite the guard)."""
    try:
        skill_fd = open_skill(directory_fd, folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            return Entry(folder, None, "the folder is a link; skills must be real folders")
        return Entry(folder, None, f"cannot open: {exc.strerror}")
    try:
        text = read_skill_md(skill_fd)
        skill = parse_skill(text, folder)
    except SkillError as exc:
        return Entry(folder, None, str(exc))
    except OSError as exc:
        why = ("SKILL.md is a link; it must be a file" if exc.errno == errno.ELOOP
               else f"cannot read SKILL.md: {exc.strerror}")
        return Entry(folder, None, why)
    finally:
        os.close(skill_fd)
    return Entry(folder, skill, guard_problem(text, skill, scan, trusted))


@dataclass(frozen=True)
class _State:
    entries: tuple[Entry, ...]
    snapshot: Snapshot | None
    error: str
    state: SkillState


class SkillLibrary:
    """The skills of one directory (``root`` / ``sub``), reloaded when it changes.

    ``sub`` is followed without links (a user's ``skills/`` below their workspace);
    ``root`` is the operator's path. A missing directory holds no skills.
    """

    def __init__(self, root: Path, sub: Parts = (), *, scan: Scan | None = None,
                 check_interval: float = DEFAULT_CHECK_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.sub = sub
        self.scan = scan
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._state = _State((), None, "", SkillState())
        self.reload_count = 0

    @property
    def where(self) -> str:
        """The directory, as shown in listings."""
        return os.path.join(self.root, *self.sub)

    def entries(self) -> tuple[Entry, ...]:
        """Every folder, usable or not, by name (re-read first when due)."""
        if self._clock() >= self._next_check:
            self.reload_if_changed()
        return self._state.entries

    @property
    def state(self) -> SkillState:
        """The directory's state file as of the last load."""
        return self._state.state

    @property
    def error(self) -> str:
        """Why the directory could not be listed ('' when it could, or is absent)."""
        return self._state.error

    def open(self) -> int:
        """A descriptor of the directory (the caller closes it)."""
        return open_directory(self.root, self.sub)

    def _snapshot(self, fd: int) -> Snapshot:
        rows: list[tuple[str, int, int]] = []
        with os.scandir(fd) as it:
            for entry in it:
                if entry.name.startswith("."):
                    if entry.name == STATE_FILE:
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue  # replaced meanwhile: the next look sees the new one
                        rows.append((entry.name, st.st_mtime_ns, st.st_size))
                    continue
                try:
                    st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        rows.append((entry.name, -2, -2))  # listed, to be refused
                        continue
                    if not stat.S_ISDIR(st.st_mode):
                        continue  # a README or licence beside the skills
                    st = os.stat(f"{entry.name}/{SKILL_FILE}", dir_fd=fd,
                                 follow_symlinks=False)
                except OSError:
                    rows.append((entry.name, -1, -1))
                    continue
                rows.append((entry.name, st.st_mtime_ns, st.st_size))
        rows.sort()
        return tuple(rows)

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Re-read if the directory changed (or ``force``); True if a new list is live.

        Returns False without waiting when another thread is reloading.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._next_check = self._clock() + self.check_interval
            old = self._state
            try:
                fd = self.open()
            except FileNotFoundError:
                self._state = _State((), (), "", SkillState())
                return old.snapshot != ()
            except OSError as exc:
                msg = f"cannot open {self.where}: {exc.strerror}"
                if old.error != msg:
                    log.warning("skills: %s", msg)
                self._state = _State((), None, msg, SkillState())
                return True
            try:
                snap = self._snapshot(fd)
                if snap == old.snapshot and not force:
                    return False
                self._state = self._rebuild(fd, snap, old)
            except Exception:
                # Never fail a run over it: the previous list stays in service.
                log.exception("skills: re-reading %s failed; keeping the %d skills listed",
                              self.where, len(old.entries))
                return False
            finally:
                os.close(fd)
            self.reload_count += 1
            return True
        finally:
            self._lock.release()

    def _rebuild(self, fd: int, snap: Snapshot, old: _State) -> _State:
        state = read_state(fd)
        before = {e.folder: e.problem for e in old.entries}
        entries: list[Entry] = []
        for folder, _mtime, _size in snap:
            if folder.startswith("."):
                continue
            if len(entries) >= MAX_SKILLS:
                log.warning("skills: %s holds more than %d folders; the rest are skipped",
                            self.where, MAX_SKILLS)
                break
            entry = load_entry(fd, folder, self.scan, state.trusted.get(folder))
            entry = Entry(entry.folder, entry.skill, entry.problem,
                          folder in state.disabled, self.where)
            if entry.problem and before.get(folder) != entry.problem:
                log.warning("skills: skipping %s in %s: %s", folder, self.where, entry.problem)
            entries.append(entry)
        usable = sum(e.usable for e in entries)
        if [e.folder for e in old.entries] != [e.folder for e in entries] or \
                sum(e.usable for e in old.entries) != usable:
            log.info("skills: %d usable of %d in %s", usable, len(entries), self.where)
        return _State(tuple(entries), snap, "", state)


def close_quietly(fd: int) -> None:
    """Close ``fd``, ignoring an error (it may be closed already)."""
    with contextlib.suppress(OSError):
        os.close(fd)
