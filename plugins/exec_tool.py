"""Built-in plugin: ``exec``, a shell command run in a bubblewrap sandbox.

Off by default: the tool is marked opt-in, so no tool profile offers it and an
agent gets it only with ``tools = { allow = ["exec"] }``. Each call runs
``/bin/sh -c COMMAND`` under ``bwrap`` with:

* the user's workspace bind-mounted read-write at ``/workspace`` (the working
  directory and ``HOME``), the only writable path besides a private tmpfs ``/tmp``;
* ``/usr`` (and the ``/bin``, ``/lib*`` links or directories) and a handful of
  ``/etc`` files the dynamic loader and tools need read-only, with an ``/etc/passwd``
  and ``/etc/group`` of the sandbox's user alone; nothing else of the host (no
  ``/etc/shadow``, ``/home``, ``/root``, data directory or other workspaces);
* new user, PID, IPC, UTS, cgroup and network namespaces (``--unshare-all``); the
  network is shared only for agents listed in ``exec_network_agents``;
* no capabilities, ``--new-session`` (no terminal injection), ``--die-with-parent``;
* an environment of ``PATH``, ``HOME`` and ``LANG`` only: nothing of Roost's
  (tokens, keys, ``ROOST_*``) reaches the command, nor bwrap itself;
* limits set by ``prlimit`` before bwrap starts and inherited by every process
  in the sandbox: CPU seconds, address space, file size, open files, and
  processes (``RLIMIT_NPROC``: what the sandbox's user already runs plus
  ``exec_max_processes``, so a fork bomb stops there);
* a wall-clock limit and an output cap enforced here: past either the whole
  sandbox is killed (SIGKILL to bwrap, whose ``--die-with-parent`` and PID
  namespace take every process with it). Cancelling the run (``/stop``) does the
  same.

The kernel does not apply ``RLIMIT_NPROC`` to root, so when Roost runs as root
the sandbox runs as ``exec_uid`` (default 65534) and the workspace is handed to
that uid (``chown``, by descriptor, never through a link) before each command;
Roost, as root, keeps full access.

Where ``bwrap`` or ``prlimit`` is missing or cannot create its namespaces (a
probe runs a real sandbox once per process), ``exec`` refuses with an error that
says so. It never runs a command outside the sandbox.

The result is the exit status, then the output (stdout and stderr interleaved),
at most ``exec_max_output_bytes``; the engine stores a long result and gives the
model a preview and a reference (``get_tool_result``). A command is never
retried: it may have changed files before it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roost import (
    Settings,
    Tool,
    ToolContext,
    ToolError,
    ToolRetry,
    check_keys,
    hookimpl,
    str_arg,
)

log = logging.getLogger("roost.plugins.exec_tool")

NAME = "exec"
OPT_IN = "opt_in"
"""The ``Tool.meta`` key the tool policy reads (``bot.agents.tool_policy.OPT_IN``)."""

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_COMMAND_CHARS = 100_000
_READ_CHUNK = 65_536
_PROBE_TIMEOUT = 15.0
_REAP_TIMEOUT = 5.0
_KILL_GRACE = 10.0
"""Seconds the executor's own timeout leaves beyond the longest wall-clock limit,
so the sandbox is stopped and reported here rather than cut off by the executor."""

# Links into /usr on merged-/usr systems (recreated as links), else directories (bound).
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the loader, locale and TLS need; no account databases, no secrets (of /etc/ssl only
# the public certificates and the configuration: /etc/ssl/private holds the host's keys).
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
              "/etc/localtime", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
              "/etc/ca-certificates")
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf",
                "/etc/gai.conf", "/etc/services", "/etc/protocols")

# Exit statuses 128+N (the shell's and bwrap's report of a child killed by signal N).
_SIGNALS: dict[int, str] = {
    signal.SIGXCPU.value: "the CPU time limit ({cpu}s) was reached",
    signal.SIGXFSZ.value: "the file size limit ({fsize} MB) was reached",
    signal.SIGKILL.value: "it was killed (SIGKILL; the CPU time limit is {cpu}s)",
    signal.SIGSEGV.value: "it crashed (SIGSEGV; memory is limited to {mem} MB per process)",
}


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
        """The ``exec_*`` limits of ``settings``."""
        return cls(settings.exec_cpu_seconds, settings.exec_memory_mb,
                   settings.exec_max_processes, settings.exec_max_file_mb,
                   settings.exec_max_output_bytes)


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


@dataclass(slots=True)
class Sandbox:
    """Builds and runs bwrap command lines for one configuration."""

    bwrap: str
    limits: Limits
    run_as: int | None
    """The uid (and gid) to run as when Roost is root; ``None`` runs as Roost's user."""

    def argv(self, workspace: Path, command: Sequence[str], *, network: bool,
             nproc: int, accounts: tuple[int, int] | None = None) -> list[str]:
        """prlimit, then bwrap with its mounts and namespaces, then ``command``.

        ``accounts`` are two readable descriptors holding the sandbox's own
        ``/etc/passwd`` and ``/etc/group`` (one user, one group: the host's stay out).
        """
        bwrap, prlimit = self.binaries()
        lim = self.limits
        mb = 1024 * 1024
        argv = [prlimit, f"--cpu={lim.cpu_seconds}:{lim.cpu_seconds + 1}",
                f"--as={lim.memory_mb * mb}", f"--fsize={lim.file_mb * mb}",
                f"--nproc={nproc}", "--nofile=1024", "--core=0", "--",
                bwrap, "--unshare-all"]
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
                 "--bind", str(workspace), SANDBOX_WORKSPACE,
                 # The root itself is bwrap's tmpfs: read-only, writes go nowhere.
                 "--remount-ro", "/",
                 "--chdir", SANDBOX_WORKSPACE, "--clearenv",
                 "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_WORKSPACE,
                 "--setenv", "LANG", "C.UTF-8", "--", *command]
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

    def nproc_limit(self) -> int:
        """RLIMIT_NPROC for the next sandbox: counted per user, so what the user runs now
        plus the sandbox's own allowance (bwrap's two processes included)."""
        uid = self.run_as if self.run_as is not None else os.getuid()
        return _tasks_of(uid) + self.limits.processes + 2

    async def run(self, workspace: Path, command: Sequence[str], *, network: bool,
                  wall: float) -> Outcome:
        """Run ``command`` in a sandbox on ``workspace``; kill it at ``wall`` seconds,
        at the output cap, or when cancelled."""
        self.binaries()  # first: a host without bwrap (macOS) may have no /proc either
        nproc = await asyncio.to_thread(self.nproc_limit)
        extra: dict[str, Any] = {}
        uid, gid = os.getuid(), os.getgid()
        if self.run_as is not None:
            uid = gid = self.run_as
            extra = {"user": uid, "group": gid, "extra_groups": []}
        accounts = (_data_fd(f"sandbox:x:{uid}:{gid}:Roost sandbox:{SANDBOX_WORKSPACE}:/bin/sh\n"),
                    _data_fd(f"sandbox:x:{gid}:\n"))
        started = time.monotonic()
        try:
            argv = self.argv(workspace, command, network=network, nproc=nproc,
                             accounts=accounts)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},
                start_new_session=True, close_fds=True, pass_fds=accounts, **extra)
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


def _tasks_of(uid: int) -> int:
    """Processes and threads whose real uid is ``uid`` (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def _hand_over(workspace: Path, uid: int) -> None:
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
        self._results: dict[tuple[str, int | None], str] = {}

    async def check(self, sandbox: Sandbox) -> None:
        """Raise :class:`SandboxUnavailable` unless ``sandbox`` ran ``true`` successfully.

        A missing binary is looked for again on every call (installing bubblewrap
        needs no restart); whether namespaces can be built is asked once.
        """
        sandbox.binaries()
        key = (sandbox.bwrap, sandbox.run_as)
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
                if sandbox.run_as is not None:
                    await asyncio.to_thread(_hand_over, Path(tmp), sandbox.run_as)
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


def _timeout_arg(args: Mapping[str, Any], default: float, maximum: float) -> float:
    value = args.get("timeout")
    if value is None:
        return default
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ToolError("'timeout' must be a positive number of seconds",
                        code="INVALID_ARGUMENT")
    return min(float(value), maximum)


def _agent_of(session_key: str) -> str:
    # Session keys start with the agent's name: "<agent>:<channel>:...".
    return session_key.split(":", 1)[0]


def report(outcome: Outcome, limits: Limits, wall: float) -> str:
    """The text the model reads: how the command ended, then its output."""
    fmt = {"cpu": limits.cpu_seconds, "mem": limits.memory_mb, "fsize": limits.file_mb}
    if outcome.stopped == "timeout":
        status = f"killed: still running after {wall:g}s (the wall-clock limit)"
    elif outcome.stopped == "output":
        status = (f"killed: output passed {limits.output_bytes} bytes; the first "
                  f"{limits.output_bytes} are below")
    elif outcome.returncode is not None and outcome.returncode > 128 and \
            (why := _SIGNALS.get(outcome.returncode - 128)):
        status = f"exit code {outcome.returncode}: {why.format(**fmt)}"
    else:
        status = f"exit code {outcome.returncode}"
    text = outcome.output.decode("utf-8", "replace").replace("\x00", "\ufffd")
    head = f"[{status}; {outcome.seconds:.2f}s]"
    return f"{head}\n{text}" if text else f"{head}\n(no output)"


@hookimpl
def roost_tools(settings: Settings) -> Tool:
    """The ``exec`` tool (opt-in: offered only where an agent's policy allows it)."""
    limits = Limits.from_settings(settings)
    run_as = settings.exec_uid if os.geteuid() == 0 else None
    sandbox = Sandbox(settings.exec_bwrap, limits, run_as)
    network_agents = frozenset(settings.exec_network_agents)
    default_timeout = min(settings.exec_timeout, settings.exec_max_timeout)

    async def run_command(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("command",), optional=("timeout",))
        command = str_arg(args, "command")
        if not command.strip():
            raise ToolError("'command' is empty", code="INVALID_ARGUMENT")
        if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
            raise ToolError(f"'command' must be text of at most {MAX_COMMAND_CHARS} characters",
                            code="INVALID_ARGUMENT")
        wall = _timeout_arg(args, default_timeout, settings.exec_max_timeout)
        # Stop in time to report, before the executor's own deadline cancels the call.
        wall = max(0.1, min(wall, context.remaining() - 1.0))
        network = _agent_of(context.session_key) in network_agents
        try:
            await PROBE.check(sandbox)
            workspace = context.workspace.resolve()
            workspace.mkdir(parents=True, exist_ok=True)
            if run_as is not None:
                await asyncio.to_thread(_hand_over, workspace, run_as)
            outcome = await sandbox.run(workspace, ["/bin/sh", "-c", command],
                                        network=network, wall=wall)
        except SandboxUnavailable as exc:
            raise ToolError(f"exec is unavailable: {exc}. Commands never run outside the "
                            "sandbox.", code="SANDBOX_UNAVAILABLE") from None
        log.info("exec in %s: exit %s, stopped %s, %d bytes, %.2fs", context.session_key,
                 outcome.returncode, outcome.stopped, len(outcome.output), outcome.seconds)
        return report(outcome, limits, wall)

    return Tool(
        name=NAME,
        description=(
            "Run a shell command (/bin/sh -c) in an isolated sandbox and return its exit "
            "status and output (stdout and stderr together). The working directory is "
            f"{SANDBOX_WORKSPACE}, your workspace (the same files the file tools see) and the "
            "only place writes persist; /tmp is private and discarded; system programs are "
            "read-only. Each call is a fresh sandbox: no state, background process or "
            "environment carries over. No network unless enabled for this agent. "
            f"Limits: {default_timeout:g}s wall clock by default (timeout up to "
            f"{settings.exec_max_timeout:g}s), {limits.cpu_seconds}s CPU, {limits.memory_mb} "
            f"MB memory per process, {limits.processes} processes, {limits.output_bytes} "
            "bytes of output."),
        input_schema={
            "type": "object",
            "properties": {
                "command": {"type": "string",
                            "description": "The shell command, e.g. 'ls -la' or "
                                           "'python3 script.py > out.txt'."},
                "timeout": {"type": "number",
                            "description": f"Wall-clock seconds before the command is killed "
                                           f"(default {default_timeout:g}, at most "
                                           f"{settings.exec_max_timeout:g})."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        execute=run_command,
        timeout=settings.exec_max_timeout + _KILL_GRACE,
        # Never retried: a command may have changed files before it failed.
        retry=ToolRetry(max_attempts=1),
        permanent_codes=frozenset({"SANDBOX_UNAVAILABLE", "INVALID_ARGUMENT"}),
        meta={OPT_IN: True},
    )
