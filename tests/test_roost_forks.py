"""A ``roost`` forked by tests/roost_forks.py is a process of its own, as an exec'd one."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from tests.roost_forks import spawn
from tests.roost_processes import until_logged
from tests.test_cli import clean_env


def _links(pid: int) -> set[str]:
    """What the descriptors of process ``pid`` refer to."""
    return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


async def test_forked_roost_runs_are_processes_of_their_own(tmp_path: Path) -> None:
    env = clean_env(ROOST_PROVIDER="scripted", ROOST_CONSOLE="1")
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(await spawn(["run"], cwd=tmp_path / name, env=env,
                                 stdin=asyncio.subprocess.PIPE))
    first, second = procs
    try:
        for proc in procs:
            await until_logged(proc, b"roost ready")
        forker = psutil.Process(first.pid).ppid()
        assert len({first.pid, second.pid, forker, os.getpid()}) == 4
        # Each in its own directory (the data dir is relative to it).
        assert (tmp_path / "a" / "data" / "roost.db").is_file()
        assert (tmp_path / "b" / "data" / "roost.db").is_file()
        # No descriptor of the forking process (its socket, the other child's exit-code
        # pipe, pidfds) is open in a child.
        held = _links(forker) - {os.devnull}
        assert held and not held & _links(first.pid) and not held & _links(second.pid)

        async with asyncio.timeout(30):  # a hang guard: a leaked pipe end would hang here
            first.kill()  # SIGKILL, as to an exec'd process; its code comes back as -9
            assert await first.wait() == -signal.SIGKILL
            first.kill()  # ended: nothing is sent (no other process can get it)
            assert second.returncode is None
            second.send_signal(signal.SIGTERM)
            assert await second.wait() == 0
    finally:
        for proc in procs:
            proc.kill()
        await asyncio.wait_for(asyncio.gather(*(proc.wait() for proc in procs)), 30)


async def test_a_forked_command_has_its_environment_directory_output_and_exit_code(
        tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text('log_format = "json"\n')
    shown = await spawn(["config", "show"], cwd=tmp_path, env=clean_env(ROOST_BOT_NAME="Forked"),
                        stdout=asyncio.subprocess.PIPE)
    out, err = await shown.communicate()
    assert shown.returncode == 0, err
    assert out is not None and 'bot_name = "Forked"' in out.decode()
    assert 'log_format = "json"' in out.decode()
    wrong = await spawn(["no-such-command"], cwd=tmp_path, env=clean_env())
    _, err = await wrong.communicate()
    assert wrong.returncode == 2
    assert err is not None and b"No such command" in err
