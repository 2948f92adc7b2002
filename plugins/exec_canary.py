"""The sandbox's self-check: a canary command that proves the isolation is there.

Run in the same sandbox as ``exec`` (without the network an agent may be given), on
a throw-away workspace, the canary tries what a command must not manage:

* **network**: a TCP connection to a listener Roost opens on the host's
  127.0.0.1 (with bash's ``/dev/tcp`` or python3, whichever the sandbox has), and
  whether its network namespace is Roost's;
* **host file**: reading a marker file Roost writes outside the workspace (world
  readable, so only the sandbox can keep it out);
* **environment**: whether any of Roost's environment variables, including the
  per-process marker ``ROOST_EXEC_CANARY``, shows in ``env`` or any
  ``/proc/*/environ`` the sandbox can read;
* **user namespaces**: whether ``unshare -U`` succeeds (where bubblewrap can
  disable them; elsewhere the result says they are not disabled).

The host judges from what reached it (an accepted connection, the marker's random
content, Roost's variables) and never trusts the command's own verdict; a canary that
does not finish fails. ``exec`` refuses while the latest result is a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plugins.exec_sandbox import Probe, Sandbox, SandboxBusy, SandboxUnavailable

log = logging.getLogger("roost.plugins.exec_tool")

INTERVAL = 3600.0
"""Seconds between canaries (and the age past which a passed result is re-checked)."""
RETRY = 60.0
"""The age past which a failed result is re-checked (a canary that timed out on a busy
host should not keep exec refused for an hour)."""
TIMEOUT = 30.0
ENV_MARKER = "ROOST_EXEC_CANARY"
"""A variable Roost puts in its own environment (a random value) for the canary to miss."""
# Set on import, while plugins load and before threads run: setenv racing a getenv in
# another thread is unsafe in C.
os.environ.setdefault(ENV_MARKER, secrets.token_hex(16))
_QUIET = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "PATH", "HOME", "LANG"})
"""Variables whose values a sandbox may share with Roost by coincidence."""
_MIN_VALUE = 8
_OUTPUT_BYTES = 1_000_000
"""What the canary may print (a sandbox that leaks prints more), whatever exec's cap."""

_SCRIPT = """\
echo "@netns $(readlink /proc/self/ns/net)"
echo @file; cat {marker} 2>&1; echo
echo @env; env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\000' '\\n'; echo
echo @userns; unshare -U true 2>/dev/null && echo userns-created
echo @net
if command -v bash >/dev/null; then bash -c ': <>/dev/tcp/127.0.0.1/{port}' 2>/dev/null
elif command -v python3 >/dev/null; then
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", {port}), 5)' 2>/dev/null
fi
echo "@done {done}"
"""


@dataclass(frozen=True, slots=True)
class CanaryResult:
    """One canary's verdict: ``passed``, and ``detail`` saying what was (not) reachable."""

    passed: bool
    detail: str
    at: float
    """``time.monotonic()`` when it ended."""
    seconds: float


class Canary:
    """The canary of one sandbox configuration: its latest result and the runs that make it."""

    def __init__(self, sandbox: Sandbox, probe: Probe, *, interval: float = INTERVAL,
                 retry: float = RETRY, timeout: float = TIMEOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sandbox = sandbox
        self.probe = probe
        self.interval = interval
        self.retry = retry
        self.timeout = timeout
        self.clock = clock
        self.last: CanaryResult | None = None
        self.runs = 0
        self._lock = asyncio.Lock()

    def _max_age(self, result: CanaryResult) -> float:
        return self.interval if result.passed else self.retry

    def due(self) -> bool:
        """Whether the next :meth:`check` would run a canary (none, or too old, and none
        running now)."""
        last = self.last
        stale = last is None or self.clock() - last.at >= self._max_age(last)
        return stale and not self._lock.locked()

    async def check(self) -> CanaryResult:
        """The latest result, running a canary first when there is none younger than
        ``interval`` (``retry`` after a failure); concurrent callers share one run.
        :class:`SandboxBusy` (and no result) when no sandbox uid came free for it."""
        async with self._lock:
            last = self.last
            if last is None or self.clock() - last.at >= self._max_age(last):
                last = self.last = await self.run()
            return last

    async def watch(self) -> None:
        """Check now and every ``interval`` seconds (``retry`` after a failure), until
        cancelled."""
        while True:
            last = await self.refresh()
            await asyncio.sleep(self.retry if last is None else self._max_age(last))

    async def refresh(self) -> CanaryResult | None:
        """:meth:`check` for background callers: when no sandbox uid came free, one
        warning and ``None`` (tried again after ``retry`` by :meth:`watch`)."""
        try:
            return await self.check()
        except SandboxBusy as exc:
            log.warning("exec sandbox canary postponed: %s", exc)
            return None

    async def run(self) -> CanaryResult:
        """Run one canary and log its verdict: a failure loudly, the same failure again
        (re-checked every ``retry`` seconds) once."""
        started = self.clock()
        self.runs += 1
        try:
            passed, detail = await self._attempt()
        except SandboxBusy:
            raise  # no verdict: the sandbox was not tried
        except Exception as exc:  # a canary that cannot run is a failed canary
            passed, detail = False, f"the canary could not run ({type(exc).__name__}: {exc})"
        result = CanaryResult(passed, detail, self.clock(), self.clock() - started)
        before = self.last
        if passed:
            log.info("exec sandbox canary: %s (%.2fs)", detail, result.seconds)
        elif before is None or before.passed or before.detail != detail:
            log.error("exec sandbox canary FAILED: %s; exec refuses every command until a "
                      "canary passes", detail)
        else:
            log.debug("exec sandbox canary still failing: %s", detail)
        return result

    async def _attempt(self) -> tuple[bool, str]:
        try:
            await self.probe.check(self.sandbox)
        except SandboxUnavailable as exc:
            return False, f"no sandbox: {exc}"
        token, done = secrets.token_hex(16), secrets.token_hex(8)
        with tempfile.TemporaryDirectory(prefix="roost-exec-canary-") as tmp, \
                socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            marker, workspace = await asyncio.to_thread(_prepare, Path(tmp), token)
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            listener.setblocking(False)
            script = _SCRIPT.format(marker=marker, port=listener.getsockname()[1], done=done)
            # The same sandbox; only Roost's own cap on what it reads is the canary's.
            limits = dataclasses.replace(self.sandbox.limits, output_bytes=_OUTPUT_BYTES)
            sandbox = dataclasses.replace(self.sandbox, limits=limits)
            outcome = await sandbox.run(workspace, ["/bin/sh", "-c", script], network=False,
                                        wall=self.timeout)
            reached = _accepted(listener)
        text = outcome.output.decode("utf-8", "replace")
        lines = set(text.splitlines())
        if f"@done {done}" not in lines or outcome.returncode != 0:
            said = " ".join(text.split())[:300]
            how = "timed out" if outcome.stopped else f"exited with {outcome.returncode}"
            return False, f"the canary did not finish ({how}: {said or 'no output'})"
        failures = []
        if reached or f"@netns {os.readlink('/proc/self/ns/net')}" in lines:
            failures.append("reached the host's network")
        if token in text:
            failures.append("read a host file outside the workspace")
        if seen := _roost_variables(lines):
            failures.append(f"saw Roost's environment ({', '.join(sorted(seen))})")
        disabled = self.sandbox.userns_disabled()
        if "userns-created" in lines and disabled:
            failures.append("created a nested user namespace")
        if failures:
            return False, "the sandbox " + "; ".join(failures)
        checked = "no network, no host file, no Roost environment"
        if disabled:
            return True, f"passed: {checked}, no nested user namespaces"
        if "userns-created" not in lines:
            return True, (f"passed: {checked}, no nested user namespaces (refused by the "
                          "kernel; bwrap does not disable them)")
        return True, (f"passed: {checked}; nested user namespaces are NOT disabled ("
                      f"{self.sandbox.bwrap} is setuid or has no --disable-userns; an "
                      "unprivileged bubblewrap 0.8.0 or later disables them)")


def _prepare(place: Path, token: str) -> tuple[Path, Path]:
    """The marker file (holding ``token``) and the workspace of a canary, in ``place`` (the
    run hands the workspace to its uid, as any exec's)."""
    place.chmod(0o755)  # reachable by the sandbox's user: only the sandbox hides it
    marker = place / "host-marker"
    marker.write_text(token + "\n")
    marker.chmod(0o644)
    workspace = place / "workspace"
    workspace.mkdir()
    return marker, workspace


def _accepted(listener: socket.socket) -> bool:
    """Whether anything connected: a finished handshake waits in the backlog."""
    try:
        peer, _ = listener.accept()
    except BlockingIOError:
        return False
    peer.close()
    return True


def _roost_variables(lines: set[str]) -> set[str]:
    """Names of Roost's environment variables whose ``NAME=value`` is among ``lines``."""
    return {name for name, value in os.environ.items()
            if name not in _QUIET and len(value) >= _MIN_VALUE and f"{name}={value}" in lines}


class Canaries:
    """One :class:`Canary` per sandbox configuration, for the tool and the health report."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._canaries: dict[Sandbox, Canary] = {}

    def of(self, sandbox: Sandbox) -> Canary:
        """The canary of ``sandbox``, made on first use."""
        canary = self._canaries.get(sandbox)
        if canary is None:
            canary = self._canaries[sandbox] = Canary(sandbox, self.probe)
        return canary

