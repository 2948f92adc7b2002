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
  network is shared only for agents listed in ``network_agents``; nested user
  namespaces disabled (``--disable-userns``) where bubblewrap supports it;
* no capabilities, ``--new-session`` (no terminal injection), ``--die-with-parent``;
* an environment of ``PATH``, ``HOME`` and ``LANG`` only: nothing of Roost's
  (tokens, keys, ``ROOST_*``) reaches the command, nor bwrap itself;
* limits set by ``prlimit`` before bwrap starts and inherited by every process
  in the sandbox: CPU seconds, address space, file size, open files, and
  processes (``RLIMIT_NPROC``: ``max_processes`` for the sandbox's own uid as root,
  else what Roost's user already runs plus ``max_processes``, so a fork bomb stops there);
* a wall-clock limit and an output cap enforced here: past either the whole
  sandbox is killed (SIGKILL to bwrap, whose ``--die-with-parent`` and PID
  namespace take every process with it). Cancelling the run (``/stop``) does the
  same.

The kernel does not apply ``RLIMIT_NPROC`` to root and counts it per uid machine-wide,
so when Roost runs as root each sandbox runs as a uid of its own, claimed from the pool
``uid`` .. ``uid + uids - 1`` for its lifetime (:mod:`plugins.exec_uids`), and the
workspace is handed to that uid (``chown``, by descriptor, never through a link) before
the command; Roost, as root, keeps full access.

Where ``bwrap`` or ``prlimit`` is missing or cannot create its namespaces (a
probe runs a real sandbox once per process), ``exec`` refuses with an error that
says so. It never runs a command outside the sandbox, nor in one whose canary
(:mod:`plugins.exec_canary`: at start where an agent may use ``exec``, then hourly)
did not pass; ``/readyz`` and ``/status`` show the canary's verdict. After each
command no file in the workspace keeps a setuid or setgid bit
(:mod:`plugins.exec_strip`).

The result is the exit status, then the output (stdout and stderr interleaved),
at most ``max_output_bytes``; the engine stores a long result and gives the
model a preview and a reference (``get_tool_result``). A command is never
retried: it may have changed files before it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plugins.exec_canary import Canaries, Canary
from plugins.exec_config import ExecConfig, exec_config
from plugins.exec_sandbox import (
    PROBE,
    SANDBOX_WORKSPACE,
    Limits,
    Mount,
    Outcome,
    Sandbox,
    SandboxBusy,
    SandboxUnavailable,
)
from plugins.exec_strip import Stripped, strip_special_bits
from plugins.skills import PLUGIN as SKILLS
from roost import (
    HealthReport,
    Runtime,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    ToolRetry,
    check_keys,
    hookimpl,
    str_arg,
    workspace_lock,
)

log = logging.getLogger("roost.plugins.exec_tool")

NAME = "exec"
OPT_IN = "opt_in"
"""The ``Tool.meta`` key the tool policy reads (``bot.agents.tool_policy.OPT_IN``)."""
HEALTH_PART = "exec sandbox"
"""The name the canary's verdict has in ``/readyz`` and ``/status``."""

MAX_COMMAND_CHARS = 100_000
_KILL_GRACE = 10.0
"""Seconds the executor's own timeout leaves beyond the longest wall-clock limit,
so the sandbox is stopped and reported here rather than cut off by the executor."""

# Exit statuses 128+N (the shell's and bwrap's report of a child killed by signal N).
_SIGNALS: dict[int, str] = {
    signal.SIGXCPU.value: "the CPU time limit ({cpu}s) was reached",
    signal.SIGXFSZ.value: "the file size limit ({fsize} MB) was reached",
    signal.SIGKILL.value: "it was killed (SIGKILL; the CPU time limit is {cpu}s)",
    signal.SIGSEGV.value: "it crashed (SIGSEGV; memory is limited to {mem} MB per process)",
}


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


def stripped_note(changed: int) -> str:
    """The line the model reads when setuid/setgid bits were taken off its files."""
    return (f"\n[setuid/setgid bits were removed from {changed} file(s): the workspace "
            "keeps none]")


def _strip(workspace: Path) -> Stripped:
    try:
        return strip_special_bits(workspace)
    except OSError as exc:  # the workspace itself is gone or unreadable: nothing to walk
        log.warning("exec: cannot walk %s to remove setuid/setgid bits: %s", workspace, exc)
        return Stripped()


MountSource = Callable[[ToolContext], list[Mount]]
"""The read-only folders a call's sandbox shows (descriptors the tool closes after it)."""


def _no_mounts(context: ToolContext) -> list[Mount]:
    return []


def build_tool(settings: Settings, sandbox: Sandbox, canary: Canary,
               mounts: MountSource = _no_mounts) -> Tool:
    """The ``exec`` tool running commands in ``sandbox`` while ``canary`` passes, with
    ``mounts(context)`` (the run's skills) shown read-only."""
    limits = sandbox.limits
    config = exec_config(settings)
    network_agents = frozenset(config.network_agents)
    max_timeout = config.max_timeout
    default_timeout = min(config.timeout, max_timeout)

    async def run_command(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("command",), optional=("timeout",))
        command = str_arg(args, "command")
        if not command.strip():
            raise ToolError("'command' is empty", code="INVALID_ARGUMENT")
        if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
            raise ToolError(f"'command' must be text of at most {MAX_COMMAND_CHARS} characters",
                            code="INVALID_ARGUMENT")
        asked = _timeout_arg(args, default_timeout, max_timeout)
        network = _agent_of(context.session_key) in network_agents
        try:
            await PROBE.check(sandbox)
            verdict = await canary.check()
            if not verdict.passed:
                raise ToolError(
                    f"exec is refused: the sandbox failed its self-check ({verdict.detail}). "
                    "Commands never run in a sandbox that has not proved its isolation; an "
                    "admin sees this in /status.", code="SANDBOX_UNSAFE")
            # Stop in time to report, before the executor's own deadline cancels the call
            # (counted after the canary, which a first call may have waited for).
            wall = max(0.1, min(asked, context.remaining() - 1.0))
            workspace = context.workspace.resolve()
            workspace.mkdir(parents=True, exist_ok=True)
            # Held for the run and the clean-up: no tool that lets a library open workspace
            # paths (sql) works there while the sandbox can create links in it.
            async with workspace_lock(workspace):
                shown = await asyncio.to_thread(mounts, context)
                try:
                    # A wait for a free uid (as root) must leave the command its wall.
                    outcome = await sandbox.run(
                        workspace, ["/bin/sh", "-c", command], network=network, wall=wall,
                        mounts=shown, uid_wait=context.remaining() - 1.0 - wall)
                finally:
                    for fd, _ in shown:
                        os.close(fd)
                    # Also after /stop or a timeout: the bits would stay on the host's disk.
                    stripped = await asyncio.shield(asyncio.to_thread(_strip, workspace))
        except SandboxUnavailable as exc:
            raise ToolError(f"exec is unavailable: {exc}. Commands never run outside the "
                            "sandbox.", code="SANDBOX_UNAVAILABLE") from None
        except SandboxBusy as exc:
            raise ToolError(f"exec is busy: {exc}; try again shortly.",
                            code="SANDBOX_BUSY") from None
        log.info("exec in %s: exit %s, stopped %s, %d bytes, %.2fs, %d mode(s) stripped",
                 context.session_key, outcome.returncode, outcome.stopped,
                 len(outcome.output), outcome.seconds, stripped.changed)
        text = report(outcome, limits, wall)
        return text + stripped_note(stripped.changed) if stripped.changed else text

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
            f"{max_timeout:g}s), {limits.cpu_seconds}s CPU, {limits.memory_mb} "
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
                                           f"{max_timeout:g})."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        execute=run_command,
        timeout=max_timeout + _KILL_GRACE,
        # Never retried: a command may have changed files before it failed.
        retry=ToolRetry(max_attempts=1),
        permanent_codes=frozenset({"SANDBOX_UNAVAILABLE", "SANDBOX_UNSAFE",
                                   "INVALID_ARGUMENT"}),
        meta={OPT_IN: True},
    )


def exec_enabled(app: Runtime) -> bool:
    """Whether the ``exec`` tool is registered and some agent's tool policy lets it run."""
    snapshot = app.snapshot
    if NAME not in snapshot.tools:
        return False
    return app.agents.permits_anywhere(NAME, snapshot.tools, snapshot.tool_groups)


class ExecPlugin:
    """The plugin: the tool, its canary at start and hourly, and the canary's health.

    ``loosen`` (extra bwrap arguments) exists for tests that prove the canary notices a
    weakened sandbox; no setting reaches it, and it is logged loudly when used.
    """

    def __init__(self, canaries: Canaries, *, loosen: tuple[str, ...] = (),
                 mounts: MountSource = _no_mounts) -> None:
        self.canaries = canaries
        self.loosen = loosen
        self.mounts = mounts
        if loosen:
            log.warning("exec sandbox WEAKENED with %s (tests only): its canary must fail",
                        " ".join(loosen))

    def sandbox(self, settings: Settings) -> Sandbox:
        """The sandbox ``settings`` describe (loosened when this plugin was made so)."""
        return dataclasses.replace(Sandbox.from_settings(settings), loosen=self.loosen)

    def canary(self, settings: Settings) -> Canary:
        """The canary of the sandbox ``settings`` describe."""
        return self.canaries.of(self.sandbox(settings))

    @hookimpl
    def roost_tools(self, settings: Settings) -> Tool:
        """The ``exec`` tool (opt-in: offered only where an agent's policy allows it)."""
        return build_tool(settings, self.sandbox(settings), self.canary(settings),
                          self.mounts)

    @hookimpl
    def roost_startup(self, app: Runtime) -> None:
        """Where an agent may use exec, run the canary now and every hour."""
        if exec_enabled(app):
            app.background(self.canary(app.settings).watch(), "the exec sandbox canary")

    @hookimpl
    def roost_health(self, app: Runtime) -> HealthReport | None:
        """The canary's latest verdict, where an agent may use exec."""
        if not exec_enabled(app):
            return None
        canary = self.canary(app.settings)
        if canary.due():  # e.g. exec's plugin was enabled after the start
            app.background(canary.refresh(), "the exec sandbox canary")
        last = canary.last
        if last is None:
            return HealthReport(HEALTH_PART, False, "canary not run yet; exec waits for it")
        if last.passed:
            return HealthReport(HEALTH_PART, True, f"canary {last.detail}")
        return HealthReport(HEALTH_PART, False,
                            f"canary FAILED: {last.detail}; exec refuses to run")


CANARIES = Canaries(PROBE)
"""One canary per sandbox configuration per process, shared by every app in it."""
PLUGIN = ExecPlugin(CANARIES, mounts=SKILLS.mounts)


@hookimpl
def roost_plugin_config_model() -> type[ExecConfig]:
    """The ``[plugins."plugins.exec_tool"]`` table."""
    return ExecConfig


@hookimpl
def roost_tools(settings: Settings) -> Tool:
    """The ``exec`` tool (opt-in: offered only where an agent's policy allows it)."""
    return PLUGIN.roost_tools(settings)


@hookimpl
def roost_startup(app: Runtime) -> None:
    """Where an agent may use exec, run the sandbox's canary now and every hour."""
    PLUGIN.roost_startup(app)


@hookimpl
def roost_health(app: Runtime) -> HealthReport | None:
    """The sandbox canary's latest verdict, where an agent may use exec."""
    return PLUGIN.roost_health(app)
