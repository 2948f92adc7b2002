"""The bubblewrap sandbox ``exec`` runs commands in: its command line, limits and probe.

Each sandbox is ``prlimit`` (CPU, address space, file size, open files, processes)
then ``bwrap`` with new user, PID, IPC, UTS, cgroup and network namespaces, nested
user namespaces disabled where bubblewrap supports it (``--disable-userns``, 0.8.0 and
later), no capabilities, a read-only root of ``/usr`` and a few ``/etc`` files, the
workspace bound read-write at ``/workspace`` (bwrap mounts binds ``nosuid`` and
``nodev``) and an environment of ``PATH``, ``HOME`` and ``LANG`` only. As root, each
sandbox runs as a uid it alone holds while it runs (:mod:`plugins.exec_uids`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.exec_config import exec_config
from plugins.exec_uids import UidPool, UidPoolBroken, UidsBusy, tasks_of
from roost import Settings

log = logging.getLogger("roost.plugins.exec_tool")

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_READ_CHUNK = 65_536
_PROBE_TIMEOUT = 15.0
_REAP_TIMEOUT = 5.0

# Links into /usr on merged-/usr systems (recreated as links), else directories (bound).
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the loader, locale and TLS need; no account databases, no secrets (of /etc/ssl only
# the public certificates and the configuration: /etc/ssl/private holds the host's keys).
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
              "/etc/localtime", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
              "/etc/ca-certificates")
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf",
                "/etc/gai.conf", "/etc/services", "/etc/protocols")

Mount = tuple[int, str]
"""A directory descriptor and the path the sandbox shows it at, read-only."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one sandbox may use."""

    cpu_seconds: int
    memory_mb: int
    processes: int
    file_mb: int
    output_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        """The limits of ``settings``' exec table."""
        c = exec_config(settings)
        return cls(c.cpu_seconds, c.memory_mb, c.max_processes, c.max_file_mb,
                   c.max_output_bytes)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a sandboxed command ended."""

    output: bytes
    returncode: int | None
    stopped: str | None
    """Why Roost killed it (``timeout``, ``output``), or ``None`` when it ended by itself."""
    seconds: float


class SandboxUnavailable(Exception):
    """bwrap or prlimit is missing, or cannot build a sandbox here."""


class SandboxBusy(Exception):
    """Every sandbox uid stayed in use for the pool's whole wait (Roost as root)."""


@functools.cache
def disables_userns(bwrap: str) -> bool:
    """Whether the bubblewrap at ``bwrap`` has ``--disable-userns`` and runs unprivileged
    (asked once per binary): a setuid bwrap keeps its ``--unshare-user-try`` ways."""
    try:
        if os.stat(bwrap).st_mode & stat.S_ISUID:
            return False
        done = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, check=False,
                              env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--disable-userns" in done.stdout + done.stderr


@dataclass(frozen=True, slots=True)
class Sandbox:
    """Builds and runs bwrap command lines for one configuration."""

    bwrap: str
    limits: Limits
    uids: UidPool | None
    """When Roost is root, the pool each run claims a uid (and gid) of its own from;
    ``None`` runs as Roost's user."""
    loosen: tuple[str, ...] = ()
    """Extra bwrap arguments, last before the command: only tests set them, to prove the
    canary notices a weakened sandbox. No setting reaches this."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Sandbox:
        """The sandbox ``settings`` describe (as uids of the table's pool, ``uid`` and
        ``uids``, when Roost runs as root)."""
        c = exec_config(settings)
        pool = UidPool(c.uid, c.uids, c.uid_wait) if os.geteuid() == 0 else None
        return cls(c.bwrap, Limits.from_settings(settings), pool)

    def userns_disabled(self) -> bool:
        """Whether commands run with nested user namespaces disabled (bwrap 0.8.0 and later)."""
        bwrap = shutil.which(self.bwrap)
        return bwrap is not None and disables_userns(bwrap)

    def argv(self, workspace: Path, command: Sequence[str], *, network: bool,
             nproc: int, accounts: tuple[int, int] | None = None,
             mounts: Sequence[Mount] = ()) -> list[str]:
        """prlimit, then bwrap with its mounts and namespaces, then ``command``.

        ``accounts`` are two readable descriptors holding the sandbox's own
        ``/etc/passwd`` and ``/etc/group`` (one user, one group: the host's stay out).
        ``mounts`` are directory descriptors shown read-only at their paths (bound by
        descriptor: the directory opened is the one shown, whatever its path became).
        """
        bwrap, prlimit = self.binaries()
        lim = self.limits
        mb = 1024 * 1024
        argv = [prlimit, f"--cpu={lim.cpu_seconds}:{lim.cpu_seconds + 1}",
                f"--as={lim.memory_mb * mb}", f"--fsize={lim.file_mb * mb}",
                f"--nproc={nproc}", "--nofile=1024", "--core=0", "--",
                bwrap, "--unshare-all"]
        if disables_userns(bwrap):
            # No user namespaces inside: the kernel's namespace code stays out of reach, and
            # bwrap itself fails if it could not make it so.
            argv += ["--unshare-user", "--disable-userns", "--assert-userns-disabled"]
        if network:
            argv.append("--share-net")
        argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL",
                 "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in _ETC_FILES + (_ETC_NETWORK if network else ()):
            argv += ["--ro-bind-try", path, path]
        if accounts is not None:
            argv += ["--ro-bind-data", str(accounts[0]), "/etc/passwd",
                     "--ro-bind-data", str(accounts[1]), "/etc/group"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--bind", str(workspace), SANDBOX_WORKSPACE]
        for fd, where in mounts:
            argv += ["--ro-bind-fd", str(fd), where]
        # The root itself is bwrap's tmpfs: read-only, writes go nowhere.
        argv += ["--remount-ro", "/",
                 "--chdir", SANDBOX_WORKSPACE, "--clearenv",
                 "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_WORKSPACE,
                 "--setenv", "LANG", "C.UTF-8", *self.loosen, "--", *command]
        return argv

    def binaries(self) -> tuple[str, str]:
        """The paths of bwrap and prlimit; :class:`SandboxUnavailable` if one is missing."""
        bwrap = shutil.which(self.bwrap)
        if bwrap is None:
            raise SandboxUnavailable(
                f"bubblewrap ({self.bwrap!r}) is not installed; install the 'bubblewrap' "
                "package (apt-get install bubblewrap)")
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailable("prlimit (util-linux) is not installed")
        return bwrap, prlimit

    async def run(self, workspace: Path, command: Sequence[str], *, network: bool,
                  wall: float, mounts: Sequence[Mount] = (),
                  uid_wait: float | None = None) -> Outcome:
        """Run ``command`` in a sandbox on ``workspace`` (with ``mounts`` read-only); kill
        it at ``wall`` seconds, at the output cap, or when cancelled.

        As root, the run first claims a uid of the pool (waiting for one at most the pool's
        wait or ``uid_wait``, else :class:`SandboxBusy`), hands ``workspace`` to it and holds
        it until the sandbox is gone: its process limit is its own, whatever else runs.
        """
        bwrap, _ = self.binaries()  # first: a host without bwrap (macOS) may have no /proc
        await asyncio.to_thread(disables_userns, bwrap)  # asked once, off the event loop
        if self.uids is None:
            # Counted per user: what Roost's user runs now plus the sandbox's allowance.
            nproc = await asyncio.to_thread(tasks_of, os.getuid()) + self.limits.processes + 2
            return await self._run(workspace, command, None, nproc, network=network,
                                   wall=wall, mounts=mounts)
        try:
            async with self.uids.claim(uid_wait) as claim:
                await asyncio.to_thread(hand_over, workspace, claim.uid)
                # A claimed uid runs nothing else: the allowance (bwrap's two processes
                # included) is the whole budget, beside the zombies it may still count.
                nproc = claim.zombies + self.limits.processes + 2
                return await self._run(workspace, command, claim.uid, nproc,
                                       network=network, wall=wall, mounts=mounts)
        except UidsBusy as exc:
            raise SandboxBusy(str(exc)) from None
        except UidPoolBroken as exc:
            raise SandboxUnavailable(str(exc)) from None

    async def _run(self, workspace: Path, command: Sequence[str], run_as: int | None,
                   nproc: int, *, network: bool, wall: float,
                   mounts: Sequence[Mount]) -> Outcome:
        extra: dict[str, Any] = {}
        uid, gid = os.getuid(), os.getgid()
        if run_as is not None:
            uid = gid = run_as
            extra = {"user": uid, "group": gid, "extra_groups": []}
        accounts = (_data_fd(f"sandbox:x:{uid}:{gid}:Roost sandbox:{SANDBOX_WORKSPACE}:/bin/sh\n"),
                    _data_fd(f"sandbox:x:{gid}:\n"))
        started = time.monotonic()
        try:
            argv = self.argv(workspace, command, network=network, nproc=nproc,
                             accounts=accounts, mounts=mounts)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},
                start_new_session=True, close_fds=True,
                pass_fds=(*accounts, *(fd for fd, _ in mounts)), **extra)
        finally:
            for fd in accounts:
                os.close(fd)
        assert proc.stdout is not None
        chunks: list[bytes] = []
        room = self.limits.output_bytes
        stopped: str | None = None
        try:
            async with asyncio.timeout(wall):
                while data := await proc.stdout.read(_READ_CHUNK):
                    chunks.append(data[:room])
                    room -= len(data)
                    if room < 0:
                        stopped = "output"
                        break
                if stopped is None:
                    await proc.wait()
        except TimeoutError:
            stopped = "timeout"
        finally:
            # Also on cancellation (/stop): nothing of the sandbox outlives the call.
            if proc.returncode is None:
                _kill(proc)
            # Shielded: a second cancellation must not leave the process unreaped.
            await asyncio.shield(_reap(proc))
        return Outcome(b"".join(chunks), proc.returncode, stopped, time.monotonic() - started)


def _data_fd(text: str) -> int:
    """A pipe's read end holding ``text`` (small: it fits the pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, text.encode())
    finally:
        os.close(write)
    return read


async def _reap(proc: asyncio.subprocess.Process) -> None:
    # asyncio wakes wait() only once the pipe has seen EOF, and a pipe we stopped
    # reading at the cap is paused: drain it (its writers are dead) first.
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(_REAP_TIMEOUT):
            while await proc.stdout.read(_READ_CHUNK):
                pass
            await proc.wait()
    except TimeoutError:
        # Should not happen (the PID namespace dies with bwrap); never hang the run on it.
        log.error("exec: the sandbox (pid %d) still holds its output %gs after it was killed",
                  proc.pid, _REAP_TIMEOUT)


def _kill(proc: asyncio.subprocess.Process) -> None:
    # bwrap leads its own process group; --die-with-parent and the PID namespace
    # take the command and everything it started down with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def hand_over(workspace: Path, uid: int) -> None:
    """Root only: give the workspace to the sandbox's uid and check it can reach it."""
    for parent in reversed(workspace.parents):
        st = parent.stat()
        if not st.st_mode & stat.S_IXOTH and st.st_uid != uid:
            raise SandboxUnavailable(
                f"the sandbox user (uid {uid}) cannot reach the workspace: {parent} is not "
                "searchable by others (chmod o+x it, or run Roost as a non-root user)")
    st = os.lstat(workspace)
    if st.st_uid != uid or st.st_gid != uid:
        os.lchown(workspace, uid, uid)
    # By directory descriptor, never by path: another sandbox on this workspace may swap a
    # directory for a link to /etc meanwhile, and root must not follow it (fwalk checks
    # each directory it opens is the one it listed; chown is relative and no-follow).
    for _, dirs, files, fd in os.fwalk(workspace, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if st.st_uid != uid or st.st_gid != uid:
                    os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)


class Probe:
    """Whether a sandbox can be built here, found once by building one."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._results: dict[tuple[str, UidPool | None], str] = {}

    async def check(self, sandbox: Sandbox) -> None:
        """Raise :class:`SandboxUnavailable` unless ``sandbox`` ran ``true`` successfully
        (:class:`SandboxBusy`, and no answer kept, when it found no free uid).

        A missing binary is looked for again on every call (installing bubblewrap
        needs no restart); whether namespaces can be built is asked once.
        """
        sandbox.binaries()
        key = (sandbox.bwrap, sandbox.uids)
        async with self._lock:
            if key not in self._results:
                self._results[key] = await self._probe(sandbox)
                if self._results[key]:
                    log.warning("exec is unavailable: %s", self._results[key])
        if problem := self._results[key]:
            raise SandboxUnavailable(problem)

    async def _probe(self, sandbox: Sandbox) -> str:
        """``""`` when a sandbox ran, else what went wrong."""
        with tempfile.TemporaryDirectory(prefix="roost-exec-probe-") as tmp:
            try:
                outcome = await sandbox.run(Path(tmp), ["/bin/sh", "-c", "true"],
                                            network=False, wall=_PROBE_TIMEOUT)
            except SandboxUnavailable as exc:
                return str(exc)
            except OSError as exc:
                return f"bubblewrap could not be started: {exc}"
        if outcome.returncode == 0:
            return ""
        said = outcome.output.decode("utf-8", "replace").strip()[:500]
        how = "timed out" if outcome.stopped else f"exited with {outcome.returncode}"
        return (f"bubblewrap cannot create a sandbox here ({how}: {said or 'no output'}); "
                "it needs user namespaces (kernel.unprivileged_userns_clone, "
                "user.max_user_namespaces) or a container that allows them")


PROBE = Probe()
"""One probe per process: the answer does not change while Roost runs."""
