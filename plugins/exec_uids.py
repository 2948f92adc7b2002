"""The uids exec's sandboxes run as when Roost is root: one per running sandbox, host-wide.

``RLIMIT_NPROC`` counts every process of a real uid on the machine, so sandboxes sharing
a uid would share one process budget and one sandbox's fork bomb would stop the others.
Each sandbox therefore claims a uid of its own from a pool (``uid`` to ``uid + uids - 1``
of the exec table) by holding an exclusive ``flock`` on the file named after it in
:data:`LOCK_DIR`, a directory only root may write, for the sandbox's whole life. Every
Roost process on the host (replicas, test workers) claims through the same files, and the
kernel drops a lock when its holder dies, however it dies: no slot leaks. A uid whose lock
is free but which still runs processes (the last sandbox of a process killed a moment ago,
or an account that should not be in the pool) is passed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

RESERVED_UIDS: frozenset[int] = frozenset({65535, 2**32 - 1})
"""Uids the pool never hands out: (uid_t) -1 to 16-bit programs and to the kernel."""

LOCK_DIR = Path("/run/roost-exec-uids")
"""Where the pool's lock files live (created 0700, must be root's and writable by it alone)."""
_FIRST_PAUSE = 0.02
_LONGEST_PAUSE = 0.25


class UidsBusy(Exception):
    """Every uid of the pool stayed in use for the whole wait."""


class UidPoolBroken(Exception):
    """The lock directory cannot be made or is not safely root's."""


@dataclass(frozen=True, slots=True)
class UidPool:
    """The uids ``first`` .. ``first + count - 1``, claimed exclusively across processes."""

    first: int
    count: int
    wait: float
    """Seconds :meth:`claim` waits for a free uid before it raises :class:`UidsBusy`."""
    directory: Path = LOCK_DIR

    def describe(self) -> str:
        """The pool in words, for messages."""
        if self.count == 1:
            return f"the sandbox uid {self.first}"
        return f"all {self.count} sandbox uids ({self.first}-{self.first + self.count - 1})"

    def try_claim(self) -> Claim | None:
        """A free uid, claimed until :meth:`Claim.release`; ``None`` when all are in use."""
        dir_fd = _open_lock_dir(self.directory)
        try:
            for uid in range(self.first, self.first + self.count):
                if uid in RESERVED_UIDS:
                    continue
                try:
                    fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600, dir_fd=dir_fd)
                except OSError as exc:
                    raise UidPoolBroken(f"cannot open the lock of sandbox uid {uid} in "
                                        f"{self.directory}: {exc.strerror or exc}") from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                except BaseException:
                    os.close(fd)
                    raise
                live, dead = census(uid)
                if live:  # still dying, or not the pool's alone: never shared
                    os.close(fd)
                    continue
                return Claim(uid, fd, dead)
        finally:
            os.close(dir_fd)
        return None

    @contextlib.asynccontextmanager
    async def claim(self, within: float | None = None) -> AsyncIterator[Claim]:
        """A uid of the pool for the body's duration, waiting up to ``wait`` seconds (or
        ``within``, if shorter) for one, cancellably; :class:`UidsBusy` when none came free."""
        loop = asyncio.get_running_loop()
        wait = self.wait if within is None else max(0.0, min(self.wait, within))
        deadline = loop.time() + wait
        pause = _FIRST_PAUSE
        while (claim := await _claim_once(self)) is None:
            left = deadline - loop.time()
            if left <= 0:
                raise UidsBusy(f"{self.describe()} stayed in use for {wait:.3g}s (each "
                               "runs one command on this host)")
            # Other processes release by closing a file: nothing to wait on but time.
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)
        try:
            yield claim
        finally:
            claim.release()


async def _claim_once(pool: UidPool) -> Claim | None:
    """:meth:`UidPool.try_claim` off the event loop; a claim made after the caller was
    cancelled is released, never leaked."""
    attempt = asyncio.ensure_future(asyncio.to_thread(pool.try_claim))
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        attempt.add_done_callback(_release_unwanted)
        raise


def _release_unwanted(attempt: asyncio.Future[Claim | None]) -> None:
    if not attempt.cancelled() and attempt.exception() is None:
        claim = attempt.result()
        if claim is not None:
            claim.release()


class Claim:
    """One claimed uid: its lock's descriptor stays open until :meth:`release`."""

    def __init__(self, uid: int, fd: int, zombies: int) -> None:
        self.uid = uid
        self.zombies = zombies
        """Its ended processes not reaped yet (bwrap's pid 1 is its host init's to reap):
        RLIMIT_NPROC still counts them."""
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the uid back (closing the descriptor drops the lock); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _open_lock_dir(directory: Path) -> int:
    """A descriptor of ``directory``, made 0700 if missing; :class:`UidPoolBroken` unless
    it is a real directory of this (root) user that no one else may write."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UidPoolBroken(f"cannot open the sandbox uid lock directory {directory}: "
                            f"{exc.strerror or exc}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise UidPoolBroken(f"the sandbox uid lock directory {directory} must belong to "
                            f"uid {os.geteuid()} and be writable by it alone")
    return fd


def census(uid: int) -> tuple[int, int]:
    """Processes and threads whose real uid is ``uid`` (what RLIMIT_NPROC counts): those
    alive, and zombies."""
    live = dead = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            tasks = int(fields.get("Threads", "1"))
            if fields.get("State", "").strip().startswith("Z"):
                dead += tasks
            else:
                live += tasks
    return live, dead


def tasks_of(uid: int) -> int:
    """Processes and threads whose real uid is ``uid``, zombies included."""
    return sum(census(uid))
