"""The ``exec`` tool against the real bubblewrap: what a command can see, write,
reach and use, and that it never runs without the sandbox.

These tests need ``bwrap`` (``.ci/run`` installs bubblewrap when it is missing) and
a kernel that lets it create namespaces; they do not skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.agents.tool_policy import OPT_IN, ToolPolicy
from bot.app.http import HealthServer
from bot.config.agents import PROFILES
from bot.config.settings import Settings
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import ChatChannel, build_app, without_summary
from plugins import exec_tool
from plugins.exec_canary import ENV_MARKER, Canaries, Canary, CanaryResult
from plugins.exec_sandbox import Probe, Sandbox
from plugins.exec_strip import strip_special_bits
from plugins.exec_tool import ExecPlugin, build_tool, roost_tools
from tests.roost_processes import until_logged

SECRET = "sk-roost-test-0123456789abcdef"

# exec asks before it runs by default (approvals, tests/test_approvals.py); these tests run
# the sandbox itself, so their agent lets exec run unasked.
EXEC_AGENT = {"default": {"tools": {"allow": ["exec"], "approve": []}}}


@pytest.fixture
def root() -> Iterator[Path]:
    """A directory every user can traverse: when the tests run as root the sandbox runs as
    the exec table's ``uid``, which must reach the workspace (pytest's own tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="roost-exec-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workspace(root: Path) -> Path:
    path = root / "workspace"
    path.mkdir()
    (path / "notes.txt").write_text("hello from the host\n")
    return path


def make_tool(root: Path, **table: Any) -> Tool:
    return roost_tools(Settings(data_dir=root / "data", plugins={"plugins.exec_tool": table}))


def context(workspace: Path, agent: str = "default", seconds: float = 60.0) -> ToolContext:
    return ToolContext("u1", "console", "c1", f"{agent}:console:direct:u1", "run-1", workspace,
                       time.monotonic() + seconds)


async def run(tool: Tool, workspace: Path, command: str, **args: Any) -> str:
    result = await tool.execute(context(workspace, **args.pop("ctx", {})),
                                {"command": command, **args})
    assert isinstance(result, str)
    return result


def status_and_output(result: str) -> tuple[str, str]:
    status, _, output = result.partition("\n")
    return status, output


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


async def test_a_command_sees_only_the_workspace(root: Path, workspace: Path) -> None:
    tool = make_tool(root)
    result = await run(tool, workspace, "pwd; echo $HOME; cat notes.txt; ls /; "
                       "echo written inside > made.txt; ls /home /root " + str(root))
    status, output = status_and_output(result)
    lines = output.splitlines()
    assert lines[:3] == ["/workspace", "/workspace", "hello from the host"]
    top = set(lines[3:lines.index("workspace") + 1])
    assert {"usr", "workspace", "tmp", "proc", "dev", "etc"} <= top
    assert not top & {"home", "root", "work", "var", "opt", "srv", "mnt", "data"}
    assert "No such file or directory" in output  # /home, /root, the host path: absent
    assert status.startswith("[exit code 2")
    assert (workspace / "made.txt").read_text() == "written inside\n"


async def test_writing_outside_the_workspace_fails(root: Path, workspace: Path) -> None:
    name = f"roost-exec-escape-{os.getpid()}"
    tool = make_tool(root)
    result = await run(tool, workspace, "for p in /usr /etc /bin / /proc/sys/kernel; do "
                       f"touch $p/{name} 2>&1 || echo refused $p; done; "
                       f"echo temp > /tmp/{name} && cat /tmp/{name}")
    _, output = status_and_output(result)
    for place in ("/usr", "/etc", "/bin", "/", "/proc/sys/kernel"):
        assert f"refused {place}\n" in output
    assert "Read-only file system" in output
    assert output.endswith("temp\n")  # a private /tmp, gone with the sandbox
    for host in (Path("/usr"), Path("/etc"), Path("/tmp")):
        assert not (host / name).exists()


async def test_etc_shadow_and_the_host_accounts_are_not_there(
        root: Path, workspace: Path) -> None:
    tool = make_tool(root)
    result = await run(tool, workspace, "cat /etc/shadow; ls /etc /etc/ssl; cat /etc/passwd; "
                       "whoami")
    status, output = status_and_output(result)
    assert "/etc/shadow: No such file or directory" in output
    assert not {"shadow", "gshadow", "sudoers", "sudoers.d", "ssh", "private"} & set(
        output.split())
    assert "certs" in output.split()
    # The sandbox's own one-line account, not the host's list of users.
    passwd = [line for line in output.splitlines() if line.count(":") == 6]
    assert len(passwd) == 1 and passwd[0].startswith("sandbox:x:")
    assert passwd[0].endswith(":Roost sandbox:/workspace:/bin/sh")
    assert output.endswith("sandbox\n")
    assert "root:" not in output
    assert status.startswith("[exit code 0")  # whoami ran; cat's failure is in the output


async def test_files_the_host_wrote_are_writable_and_links_out_are_left_alone(
        root: Path, workspace: Path) -> None:
    # As root, Roost hands the workspace to the sandbox's uid before each command; a link
    # in it to a file outside must not make root give that file away.
    outside = root / "outside.txt"
    outside.write_text("host file\n")
    (workspace / "link").symlink_to(outside)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "host.txt").write_text("by the host\n")
    owner = outside.stat().st_uid, outside.stat().st_gid
    result = await run(make_tool(root), workspace,
                       "echo more >> sub/host.txt && echo more >> notes.txt && cat link")
    status, output = status_and_output(result)
    assert status.startswith("[exit code 1"), result  # the link leads nowhere in the sandbox
    assert "link: No such file or directory" in output
    assert (workspace / "sub" / "host.txt").read_text() == "by the host\nmore\n"
    assert (outside.stat().st_uid, outside.stat().st_gid) == owner
    assert outside.read_text() == "host file\n"


CONNECT = ("python3 -c \"import socket,sys\n"
           "try:\n socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\n"
           "except OSError as e:\n print('refused:', e); sys.exit(3)\"")


SIGNAL = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port})).close()\""


@contextlib.asynccontextmanager
async def listener() -> AsyncIterator[tuple[int, asyncio.Event]]:
    connected = asyncio.Event()

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], connected
    finally:
        server.close()
        await server.wait_closed()


async def test_the_network_is_unreachable_unless_the_agent_may_use_it(
        root: Path, workspace: Path) -> None:
    async with listener() as (port, connected):
        result = await run(make_tool(root), workspace, CONNECT.format(port=port))
        status, output = status_and_output(result)
        assert status.startswith("[exit code 3")
        assert output.startswith("refused:")
        assert not connected.is_set()

        # The same command for an agent listed in the exec table's network_agents gets through,
        # so the refusal above is the sandbox's doing.
        tool = make_tool(root, network_agents="research")
        result = await run(tool, workspace, CONNECT.format(port=port),
                           ctx={"agent": "research"})
        assert status_and_output(result) == (status_and_output(result)[0], "connected\n")
        await asyncio.wait_for(connected.wait(), 10)
        other = await run(tool, workspace, CONNECT.format(port=port), ctx={"agent": "default"})
        assert status_and_output(other)[1].startswith("refused:")


async def test_a_fork_bomb_stops_at_the_process_limit(root: Path, workspace: Path) -> None:
    tool = make_tool(root, max_processes=16)
    counting = ("python3 -c \"import os,time\nn=0\nwhile n < 5000:\n"
                " try: pid = os.fork()\n"
                " except OSError as e: print('fork failed after', n, e.strerror); break\n"
                " if pid == 0: time.sleep(20); os._exit(0)\n n += 1\"")
    result = await run(tool, workspace, counting, timeout=20)
    status, output = status_and_output(result)
    words = output.split()
    assert words[:3] == ["fork", "failed", "after"], output
    # RLIMIT_NPROC counts every process of the sandbox's user: its 16, bwrap, sh and
    # python among them (as root the uid is the sandbox's alone; else Roost's user's).
    assert int(words[3]) <= 16, output
    assert "Resource temporarily unavailable" in output
    # Its sleeping children went with the sandbox when python exited.
    assert status.startswith("[exit code 0"), status

    marker = f"bomb{os.getpid()}"
    # exec: the shell waits without forking, which the bomb may leave it unable to do.
    result = await run(tool, workspace, f"{marker}() {{ {marker} | {marker} & }}; {marker}; "
                       "exec sleep 30", timeout=2)
    status, output = status_and_output(result)
    # Either the shell reached `exec sleep` and was killed at the timeout, or the bomb had
    # spent the limit before the shell's own next fork, which ends dash with status 2:
    # both are the limit holding. What must never happen is a bomb left running.
    assert (status.startswith("[killed: still running after 2s")
            or status.startswith("[exit code 2")), (status, output[:500])
    assert "Cannot fork" in output, output[:2000]
    assert processes_with(marker) == []


async def test_an_infinite_loop_is_killed_at_the_timeout(root: Path, workspace: Path) -> None:
    marker = f"loop{os.getpid()}"
    result = await run(make_tool(root), workspace, f"echo {marker}; while :; do :; done",
                       timeout=1)
    status, output = status_and_output(result)
    assert status.startswith("[killed: still running after 1s (the wall-clock limit)")
    assert output == f"{marker}\n"
    assert processes_with(marker) == []


async def test_cpu_memory_and_file_size_are_limited(root: Path, workspace: Path) -> None:
    tool = make_tool(root, cpu_seconds=1, memory_mb=256, max_file_mb=1)
    status, _ = status_and_output(await run(tool, workspace, "while :; do :; done", timeout=60))
    assert status.startswith("[exit code 152: the CPU time limit (1s) was reached"), status

    _, output = status_and_output(await run(
        tool, workspace, "python3 -c 'bytearray(512 * 1024 * 1024)'"))
    assert output.rstrip().endswith("MemoryError")

    _, output = status_and_output(await run(
        tool, workspace, "head -c 5000000 /dev/zero > big.bin"))
    assert "File size limit exceeded" in output
    assert (workspace / "big.bin").stat().st_size == 1024 * 1024


async def test_a_100_mb_output_is_cut_at_the_cap(root: Path, workspace: Path) -> None:
    result = await run(make_tool(root, max_output_bytes=50_000), workspace,
                       "head -c 100000000 /dev/zero | tr '\\0' a; echo never")
    status, output = status_and_output(result)
    assert status.startswith("[killed: output passed 50000 bytes")
    assert output == "a" * 50_000


async def test_the_parent_environment_is_not_visible(
        root: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_TELEGRAM_BOT_TOKEN", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    result = await run(make_tool(root), workspace,
                       "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    _, output = status_and_output(result)
    assert SECRET not in output
    names = {line.split("=", 1)[0] for line in output.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD"}, names
    assert "HOME=/workspace" in output.splitlines()


async def test_no_bwrap_means_no_exec(root: Path, workspace: Path) -> None:
    tool = make_tool(root, bwrap=str(root / "no-such-bwrap"))
    with pytest.raises(ToolError) as caught:
        await run(tool, workspace, "touch ran.txt")
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "bubblewrap" in str(caught.value) and "never run outside" in str(caught.value)
    assert not (workspace / "ran.txt").exists()

    # Installing it is enough: a missing binary is looked for again on the next call.
    real = shutil.which("bwrap")
    assert real is not None
    (root / "no-such-bwrap").symlink_to(real)
    assert status_and_output(await run(tool, workspace, "touch ran.txt"))[0].startswith(
        "[exit code 0")
    assert (workspace / "ran.txt").exists()


async def test_a_bwrap_that_cannot_create_namespaces_means_no_exec(
        root: Path, workspace: Path) -> None:
    # What bwrap says in a container that forbids user namespaces.
    fake = root / "bwrap-without-namespaces"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    tool = make_tool(root, bwrap=str(fake))
    for _ in range(2):  # the probe's verdict is kept, and kept refusing
        with pytest.raises(ToolError) as caught:
            await run(tool, workspace, "touch ran.txt")
        assert caught.value.code == "SANDBOX_UNAVAILABLE"
        assert "No permissions to creating new namespace" in str(caught.value)
    assert not (workspace / "ran.txt").exists()


async def test_cancelling_the_call_kills_the_sandbox(root: Path, workspace: Path) -> None:
    marker = f"stopme{os.getpid()}"
    tool = make_tool(root, network_agents="default")
    async with listener() as (port, started):
        task = asyncio.create_task(run(tool, workspace, f"{SIGNAL.format(port=port)}; "
                                       f"sleep 60; echo {marker}", timeout=60))
        await asyncio.wait_for(started.wait(), 30)
        assert processes_with(marker)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert processes_with(marker) == []


@pytest.mark.parametrize("bad", [{"command": ""}, {"command": "ls", "timeout": -1},
                                 {"command": "ls", "timeout": "soon"}, {"cmd": "ls"}])
async def test_bad_arguments_are_refused(root: Path, workspace: Path,
                                         bad: Mapping[str, Any]) -> None:
    with pytest.raises(ToolError) as caught:
        await make_tool(root).execute(context(workspace), bad)
    assert caught.value.code == "INVALID_ARGUMENT"


def test_no_profile_offers_exec_and_allow_does() -> None:
    tool = make_tool(Path("/nonexistent"))
    assert tool.meta[OPT_IN] is True and tool.retry is not None and tool.retry.max_attempts == 1
    tools = {"read_file": Tool("read_file", "", {}, tool.execute), "exec": tool}
    groups = {"read_file": "plugins.file_tools", "exec": "plugins.exec_tool"}
    for profile in PROFILES:
        assert "exec" not in ToolPolicy(profile).filter(tools, groups)
        assert "exec" in ToolPolicy(profile, allow=("exec",)).filter(tools, groups)
    assert "exec" in ToolPolicy("minimal", allow=("group:exec_tool",)).filter(tools, groups)
    assert "exec" not in ToolPolicy(allow=("exec",), deny=("exec",)).filter(tools, groups)


async def test_exec_through_a_run_with_the_large_result_store(root: Path) -> None:
    call = {"name": "exec", "arguments": {
        "command": "echo built > out.txt; cat out.txt; head -c 100000000 /dev/zero | tr '\\0' b"}}
    chat = await build_app([{"steps": [{"tool_calls": [call]}, {"reply": "ran it"}]}],
                           data_dir=root / "data", dm_policy="open",
                           agents=EXEC_AGENT)
    try:
        assert await chat.ask("build it") == ["ran it"]
        offered = {spec.name for spec in chat.requests[0].tools}
        assert "exec" in offered
        # The model got the stored result's preview and reference, not 200 KB.
        tool_message = chat.requests[1].messages[-1]
        seen = without_summary(tool_message.content)
        assert seen.startswith("[killed: output passed 200000 bytes")
        assert "built\nbbbb" in seen and "get_tool_result" in seen
        assert len(seen) < 20_000
        made = list((root / "data").rglob("out.txt"))
        assert [p.read_text() for p in made] == ["built\n"]
        # The trace's tool span keeps the start of what the command printed.
        run = (await chat.app.store.runs("default:console:direct:user"))[0]
        span = next(s for s in await chat.app.store.spans(run.run_id) if s.kind == "tool")
        assert span.attributes["output_preview"].startswith("[killed: output passed")
        assert "built\nbbb" in span.attributes["output_preview"]
    finally:
        await chat.app.close()


async def test_stop_kills_the_sandbox_of_a_running_command(root: Path) -> None:
    marker = f"stopped{os.getpid()}"
    async with listener() as (port, started):
        # The command tells the test it runs by connecting to it (hence the network).
        call = {"name": "exec", "arguments": {
            "command": f"{SIGNAL.format(port=port)}; sleep 60; echo {marker}", "timeout": 120}}
        chat = await build_app([{"steps": [{"tool_calls": [call]}, {"reply": "never sent"}]}],
                               data_dir=root / "data", dm_policy="open",
                               plugins={"plugins.exec_tool": {"network_agents": ["default"]}},
                               agents=EXEC_AGENT)
        try:
            await chat.say("run it")
            await asyncio.wait_for(started.wait(), 30)
            assert processes_with(marker)
            await chat.say("/stop")
            await chat.settle()
            assert chat.replies == ["Stopped."]
            assert processes_with(marker) == []
            (run,) = await chat.app.store.runs("default:console:direct:user")
            assert run.status == "cancelled"
        finally:
            await chat.app.close()


async def test_an_agent_without_exec_is_not_offered_it_and_cannot_run_it(root: Path) -> None:
    call = {"name": "exec", "arguments": {"command": "touch ran.txt"}}
    chat = await build_app([{"steps": [{"tool_calls": [call]}, {"reply": "tried"}]}],
                           data_dir=root / "data", dm_policy="open")
    try:
        assert await chat.ask("hello") == ["tried"]
        offered = {spec.name for spec in chat.requests[0].tools}
        assert "exec" not in offered and "read_file" in offered
        # A model that names it anyway gets the unknown-tool error; nothing runs.
        tool_message = chat.requests[1].messages[-1]
        assert tool_message.is_error
        assert tool_message.content.startswith("Unknown tool 'exec'")
        assert list((root / "data").rglob("ran.txt")) == []
    finally:
        await chat.app.close()


def test_the_module_names_the_policy_key() -> None:
    assert exec_tool.OPT_IN == OPT_IN


# -- confinement: nested user namespaces, setuid files -----------------------------------


async def test_nested_user_namespaces_cannot_be_created_inside(
        root: Path, workspace: Path) -> None:
    result = await run(make_tool(root), workspace,
                       "unshare -r id; echo rc=$?; unshare -U true; echo rc=$?; "
                       "cat /proc/sys/user/max_user_namespaces")
    _, output = status_and_output(result)
    assert "uid=0" not in output  # never root in a namespace of its own
    assert output.count("rc=1\n") == 2, output
    assert "unshare failed" in output


SPECIAL = stat.S_ISUID | stat.S_ISGID


def special_bits(path: Path) -> int:
    return path.lstat().st_mode & (SPECIAL | stat.S_ISVTX)


async def test_no_setuid_or_setgid_bit_outlives_the_call(root: Path, workspace: Path) -> None:
    # A setuid file of the host's, reached through links the command leaves behind: the
    # clean-up must never follow them.
    outside = root / "outside"
    outside.mkdir()
    (outside / "host-suid").write_text("host\n")
    (outside / "host-suid").chmod(0o4755)
    result = await run(make_tool(root), workspace,
                       "mkdir -p deep/er/est sgid-dir && touch s g both deep/er/est/s t && "
                       "chmod 4755 s && chmod 2755 g && chmod 6755 both deep/er/est/s && "
                       "chmod 1644 t && chmod 2775 sgid-dir && mkdir sticky-dir && "
                       f"chmod 1777 sticky-dir && ln -s {outside} out && "
                       f"ln -s {outside}/host-suid out-file && ls -l s g both | cut -c1-10 && "
                       "grep ' /workspace ' /proc/self/mountinfo")
    status, output = status_and_output(result)
    assert status.startswith("[exit code 0"), result
    # Inside, the bits were set (the command saw them) ...
    assert output.splitlines()[:3] == ["-rwsr-sr-x", "-rwxr-sr-x", "-rwsr-xr-x"], result
    # (where they do nothing: the workspace is mounted nosuid)
    assert "nosuid" in output.splitlines()[3].split()[5].split(","), output
    # ... and none is left on the host's disk.
    for name in ("s", "g", "both", "deep/er/est/s", "sgid-dir"):
        assert special_bits(workspace / name) & SPECIAL == 0, name
    assert stat.S_IMODE((workspace / "s").stat().st_mode) == 0o755
    assert stat.S_IMODE((workspace / "sgid-dir").stat().st_mode) == 0o775
    assert special_bits(workspace / "t") == 0  # sticky means nothing on a file
    assert special_bits(workspace / "sticky-dir") == stat.S_ISVTX  # on a directory it stays
    assert stat.S_IMODE((outside / "host-suid").stat().st_mode) == 0o4755
    assert "setuid/setgid bits were removed from 6 file(s)" in output


def test_the_clean_up_walks_by_descriptor_and_never_follows_links(root: Path) -> None:
    top = root / "tree"
    (top / "a" / "b").mkdir(parents=True)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "suid").touch()
    (elsewhere / "suid").chmod(0o4755)
    elsewhere.chmod(0o2755)
    (top / "a" / "b" / "f").touch()
    (top / "a" / "b" / "f").chmod(0o6700)
    (top / "a" / "dirlink").symlink_to(elsewhere)
    (top / "a" / "b" / "filelink").symlink_to(elsewhere / "suid")
    os.mkfifo(top / "fifo", 0o2600)  # opened by O_PATH: never blocks
    top.chmod(0o2755)
    done = strip_special_bits(top)
    assert (done.changed, done.cut, done.failed) == (3, "", 0)
    assert done.visited == 6
    assert special_bits(top / "a" / "b" / "f") == 0 and special_bits(top) == 0
    assert special_bits(top / "fifo") == 0
    assert special_bits(elsewhere / "suid") == stat.S_ISUID
    assert special_bits(elsewhere) == stat.S_ISGID
    # The top itself may not be a link.
    (root / "toplink").symlink_to(top)
    with pytest.raises(OSError, match=r"Errno (40|20)\]"):  # ELOOP, ENOTDIR
        strip_special_bits(root / "toplink")


def test_the_clean_up_is_not_led_outside_by_a_directory_flipped_to_a_link(
        root: Path) -> None:
    # What a command still running in another sandbox on the same workspace can do while
    # the walk runs: swap a directory for a link to a host directory, and back.
    outside = root / "host-dir"
    outside.mkdir()
    (outside / "victim").touch()
    (outside / "victim").chmod(0o4755)
    top = root / "flipping"
    (top / "d").mkdir(parents=True)
    (top / "d" / "inner").touch()
    for i in range(50):  # time spent in d: a walk by path has a wider window to be swapped
        (top / "d" / f"f{i}").touch()
    # Another process, as a sandbox would be: truly concurrent with the walk.
    flip = (f"import os\ntop, out = {str(top)!r}, {str(outside)!r}\nwhile True:\n"
            " try:\n  os.rename(top + '/d', top + '/d.real'); os.symlink(out, top + '/d')\n"
            "  os.sched_yield(); os.unlink(top + '/d'); os.rename(top + '/d.real', top + '/d')\n"
            "  os.sched_yield()\n"
            " except OSError: pass\n")
    flipper = subprocess.Popen([sys.executable, "-c", flip])
    try:
        for _ in range(1000):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.chmod(top / "d.real" / "inner", 0o4755, follow_symlinks=False)
            strip_special_bits(top)
    finally:
        flipper.kill()
        flipper.wait()
    assert stat.S_IMODE((outside / "victim").stat().st_mode) == 0o4755


def test_a_workspace_too_large_to_walk_is_cut_with_one_log_line(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    top = root / "many"
    deep = top
    for depth in range(6):
        deep = deep / f"d{depth}"
    deep.mkdir(parents=True)
    for i in range(30):
        (top / f"f{i}").touch()
        (top / f"f{i}").chmod(0o4755)
    (deep / "suid").touch()
    (deep / "suid").chmod(0o4755)
    with caplog.at_level(logging.WARNING, logger="roost.plugins.exec_tool"):
        cut = strip_special_bits(top, max_entries=10)
        shallow = strip_special_bits(top, max_depth=3)
    # Ten entries seen (in directory order: files, and perhaps the first directory).
    assert (cut.cut, cut.visited) == ("more than 10 entries", 11) and 9 <= cut.changed <= 10
    assert shallow.cut == "directories nested deeper than 3"
    assert shallow.changed == 30 - cut.changed
    assert special_bits(deep / "suid") == stat.S_ISUID  # below the depth bound
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one line per walk cut short
    assert "after 11 entries (more than 10 entries)" in warnings[0]
    full = strip_special_bits(top)
    assert (full.cut, full.changed) == ("", 1)
    assert special_bits(deep / "suid") == 0


# -- the canary ----------------------------------------------------------------------------


def sandbox_of(root: Path, *loosen: str) -> Sandbox:
    # The smallest limits there are: the canary must pass within them.
    settings = Settings(data_dir=root / "data", plugins={"plugins.exec_tool": {
        "max_output_bytes": 1_000, "max_processes": 4, "memory_mb": 64, "cpu_seconds": 1}})
    return dataclasses.replace(Sandbox.from_settings(settings), loosen=loosen)


async def test_the_canary_passes_on_the_real_sandbox_and_reruns_after_its_interval(
        root: Path) -> None:
    now = [1000.0]
    canary = Canary(sandbox_of(root), Probe(), clock=lambda: now[0])
    first = await canary.check()
    assert first.passed, first.detail
    assert first.detail == ("passed: no network, no host file, no Roost environment, "
                            "no nested user namespaces")
    assert ENV_MARKER in os.environ  # the marker it looked for
    now[0] += 3599
    assert await canary.check() is first and canary.runs == 1
    now[0] += 1
    again = await canary.check()
    assert again is not first and again.passed and canary.runs == 2


async def test_a_bubblewrap_without_disable_userns_is_used_and_said_to_be_weaker(
        root: Path, workspace: Path) -> None:
    # bubblewrap before 0.8.0: the same sandbox otherwise, and no claim it does not make.
    old = root / "bwrap-0.7"
    old.write_text("#!/bin/sh\nif [ \"$1\" = --help ]; then echo 'usage: bwrap [OPTIONS...]'; "
                   f"exit 0; fi\nexec {shutil.which('bwrap')} \"$@\"\n")
    old.chmod(0o755)
    sandbox = Sandbox.from_settings(Settings(data_dir=root / "data",
                                                plugins={"plugins.exec_tool": {"bwrap": str(old)}}))
    assert not sandbox.userns_disabled()
    canary = Canary(sandbox, Probe())
    verdict = await canary.check()
    assert verdict.passed, verdict.detail
    assert verdict.detail.endswith("nested user namespaces are NOT disabled (" + str(old) +
                                   " is setuid or has no --disable-userns; an unprivileged "
                                   "bubblewrap 0.8.0 or later disables them)")
    tool = build_tool(Settings(data_dir=root / "data"), sandbox, canary)
    _, output = status_and_output(await run(tool, workspace, "unshare -r id -u"))
    assert output == "0\n"  # what the verdict warns of


class CountedCanary(Canary):
    """A canary that says when it has run three times."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.third = asyncio.Event()

    async def run(self) -> CanaryResult:
        result = await super().run()
        if self.runs >= 3:
            self.third.set()
        return result


async def test_the_canary_watch_runs_it_again_at_every_interval(root: Path) -> None:
    canary = CountedCanary(sandbox_of(root), Probe(), interval=0.01, retry=0.01)
    watch = asyncio.ensure_future(canary.watch())
    try:
        await asyncio.wait_for(canary.third.wait(), 60)  # a hang guard, not a measurement
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    assert canary.last is not None and canary.last.passed


WEAKENED = {
    "network": (("--share-net",), "reached the host's network"),
    "host file": (("--bind", tempfile.gettempdir(), "/tmp"),
                  "read a host file outside the workspace"),
    "environment": (("--setenv", ENV_MARKER, "set below"),
                    f"saw Roost's environment ({ENV_MARKER})"),
}


@pytest.mark.parametrize("weakness", sorted(WEAKENED))
async def test_a_weakened_sandbox_fails_its_canary_and_exec_refuses(
        root: Path, workspace: Path, weakness: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    marker = "m" * 32
    monkeypatch.setenv(ENV_MARKER, marker)
    loosen, said = WEAKENED[weakness]
    loosen = tuple(marker if arg == "set below" else arg for arg in loosen)
    sandbox = sandbox_of(root, *loosen)
    now = [1000.0]
    canary = Canary(sandbox, Probe(), clock=lambda: now[0])
    tool = build_tool(Settings(data_dir=root / "data"), sandbox, canary)
    with pytest.raises(ToolError) as caught:
        await run(tool, workspace, "touch ran.txt")
    assert caught.value.code == "SANDBOX_UNSAFE"
    assert f"failed its self-check (the sandbox {said})" in str(caught.value)
    assert not (workspace / "ran.txt").exists()
    assert canary.last is not None and not canary.last.passed
    # The verdict is kept a minute: the next call refuses without another canary; after
    # that a canary runs again (and fails again).
    with pytest.raises(ToolError):
        await run(tool, workspace, "touch ran.txt")
    assert canary.runs == 1
    now[0] += 60
    with pytest.raises(ToolError):
        await run(tool, workspace, "touch ran.txt")
    assert canary.runs == 2
    assert not (workspace / "ran.txt").exists()
    # Loud once, not once a minute.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"exec sandbox canary FAILED: the sandbox {said}; exec refuses every "
                      "command until a canary passes"]


async def app_with(plugin: ExecPlugin, root: Path, call: Mapping[str, Any] | None = None,
                   **settings: Any) -> ChatChannel:
    """An app whose exec plugin is ``plugin`` (in place of the built-in module)."""
    host = get_plugin_manager(load_entry_points=False)
    host.pm.unregister(name="plugins.exec_tool")
    turns = [{"steps": [{"tool_calls": [call]}, {"reply": "tried"}]}] if call else []
    return await build_app(turns, ("plugins.exec_tool", plugin), host=host,
                           data_dir=root / "data", **settings)


async def readyz(chat: ChatChannel) -> tuple[int, str]:
    server = HealthServer(chat.app, "127.0.0.1", 0, expected=[])
    await server.start()
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"{server.url}/readyz") as response:
            return response.status, await response.text()
    finally:
        await server.close()





async def test_readyz_and_status_show_a_passing_canary(root: Path) -> None:
    plugin = ExecPlugin(Canaries(Probe()))
    chat = await app_with(plugin, root, agents=EXEC_AGENT)
    try:
        canary = plugin.canary(chat.app.settings)
        await canary.check()  # the one started with the app
        assert canary.runs == 1 and canary.last is not None and canary.last.passed
        assert await readyz(chat) == (200, "ready\n")
        (status,) = await chat.ask("/status")
        assert ("exec sandbox: ok, canary passed: no network, no host file, no Roost "
                "environment, no nested user namespaces") in status.splitlines()
    finally:
        await chat.app.close()


async def test_a_failing_canary_makes_readyz_fail_status_say_so_and_exec_refuse(
        root: Path) -> None:
    plugin = ExecPlugin(Canaries(Probe()), loosen=("--share-net",))
    call = {"name": "exec", "arguments": {"command": "touch ran.txt"}}
    chat = await app_with(plugin, root, call, agents=EXEC_AGENT)
    try:
        await plugin.canary(chat.app.settings).check()
        line = ("exec sandbox: canary FAILED: the sandbox reached the host's network; exec "
                "refuses to run")
        assert await readyz(chat) == (503, line + "\n")
        (status,) = await chat.ask("/status")
        assert line.replace("sandbox: canary", "sandbox: NOT READY, canary") in status
        assert await chat.ask("run it") == ["tried"]
        tool_message = chat.requests[1].messages[-1]
        assert tool_message.is_error and "SANDBOX_UNSAFE" in tool_message.content
        assert list((root / "data").rglob("ran.txt")) == []
    finally:
        await chat.app.close()


async def test_exec_enabled_after_the_start_gets_its_canary_from_the_health_check(
        root: Path) -> None:
    plugin = ExecPlugin(Canaries(Probe()))
    host = get_plugin_manager(load_entry_points=False)
    host.pm.unregister(name="plugins.exec_tool")
    host.disabled.add("plugins.exec_tool")
    chat = await build_app([], ("plugins.exec_tool", plugin), host=host, data_dir=root / "data",
                           agents=EXEC_AGENT)
    try:
        canary = plugin.canary(chat.app.settings)
        assert await readyz(chat) == (200, "ready\n") and canary.runs == 0
        await chat.app.set_plugin_enabled("plugins.exec_tool", True)
        # The first health check finds no verdict, says so and starts a canary.
        assert await readyz(chat) == (
            503, "exec sandbox: canary not run yet; exec waits for it\n")
        await canary.check()
        assert canary.runs == 1
        assert await readyz(chat) == (200, "ready\n")
    finally:
        await chat.app.close()


async def test_without_an_agent_allowed_exec_there_is_no_canary(root: Path) -> None:
    plugin = ExecPlugin(Canaries(Probe()), loosen=("--share-net",))
    chat = await app_with(plugin, root)
    try:
        assert await readyz(chat) == (200, "ready\n")
        (status,) = await chat.ask("/status")
        assert "exec sandbox" not in status
        assert plugin.canary(chat.app.settings).runs == 0
    finally:
        await chat.app.close()


@pytest.mark.e2e
async def test_roost_run_checks_its_sandbox_at_start_and_readyz_says_so(root: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (root / "roost.toml").write_text('[agents.default]\ntools = { allow = ["exec"] }\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(PYTHONUNBUFFERED="1", ROOST_PROVIDER="scripted", ROOST_CONSOLE="1",
               ROOST_HTTP_PORT=str(port), ROOST_LOG_LEVEL="INFO")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", cwd=root, env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        lines = await until_logged(proc, b"exec sandbox canary")
        assert (b"exec sandbox canary: passed: no network, no host file, no Roost environment, "
                b"no nested user namespaces") in lines[-1]
        if not any(b"roost ready" in line for line in lines):  # the server is up by then
            await until_logged(proc, b"roost ready")
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{port}/readyz") as response:
            assert (response.status, await response.text()) == (200, "ready\n")
    finally:
        proc.terminate()
        await proc.wait()
