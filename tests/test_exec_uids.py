"""exec's sandbox uids when Roost runs as root: one per running sandbox, host-wide.

RLIMIT_NPROC counts a uid's processes machine-wide, so these tests prove that a sandbox's
uid is its own: another user's fork bomb does not stop its command, two processes never
hold one uid at once, a holder killed with SIGKILL leaves no slot behind, and the
workspace follows its uid. They drive the real bubblewrap and need root (as the CI runs),
the only case in which the sandbox changes uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.tools import Tool, ToolError
from plugins.exec_tool import CANARIES, ExecPlugin
from plugins.exec_uids import LOCK_DIR, UidPool, UidsBusy
from tests.test_exec_sandbox import (
    processes_with,
    root,  # noqa: F401  (the fixture)
    run,
    status_and_output,
)

# Ranges of their own, clear of the default pool (70000-70063) other tests' sandboxes use.
BOMB_UIDS = 70100
BUSY_UID = 70200
SWITCH_UIDS = 70300

HOLDER = """\
import sys
from pathlib import Path
from plugins.exec_uids import UidPool
claim = UidPool(int(sys.argv[1]), 1, 0.0, Path(sys.argv[2])).try_claim()
print(claim.uid if claim else "none", flush=True)
sys.stdin.read()
"""

CONTENDER = """\
import asyncio, os, sys
from pathlib import Path
from plugins.exec_uids import UidPool
held = Path(sys.argv[3])
async def main():
    pool = UidPool(int(sys.argv[1]), 2, 30.0, Path(sys.argv[2]))
    for _ in range(15):
        async with pool.claim() as uid:
            # O_EXCL: fails if another holder of this uid has its file there now.
            os.close(os.open(held / str(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            for _ in range(20):
                os.stat(held / str(uid))
            os.unlink(held / str(uid))
asyncio.run(main())
"""


@pytest.fixture(autouse=True)
def as_root() -> None:
    """Without root the sandbox runs as Roost's own user and no uid changes."""
    assert os.geteuid() == 0, "these tests need root, as the CI runs them"


@contextlib.contextmanager
def holding(uid: int, directory: Path = LOCK_DIR) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``uid`` of the pool in ``directory`` until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(uid), str(directory)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parent.parent)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(uid)
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_a_fork_bomb_in_one_sandbox_leaves_another_users_command_running(
        root: Path) -> None:  # noqa: F811
    tool = make_tool(root, max_processes=16, uid=BOMB_UIDS)
    build, bombed = root / "build", root / "bombed"
    build.mkdir()
    bombed.mkdir()
    os.mkfifo(build / "go")
    # One user's build starts, then waits (without forking) for the other's bomb to fill
    # its budget; then it forks forty times.
    command = ("id -u > uid; touch started; read x < go; i=0; while [ $i -lt 40 ]; do "
               "/bin/true || exit 9; i=$((i+1)); done; echo built")
    building = asyncio.create_task(run(tool, build, command, timeout=60,
                                       ctx={"agent": "default"}))
    await until(lambda: (build / "started").exists(), building)
    marker = f"bomb{os.getpid()}"
    # The other's bomb: forks until the limit refuses, says so, and keeps every child.
    bomb = asyncio.create_task(run(tool, bombed, (
        f"python3 -c \"import os,time # {marker}\nn=0\nwhile True:\n"
        " try: pid = os.fork()\n except OSError: break\n"
        " if pid == 0: time.sleep(120); os._exit(0)\n n += 1\n"
        "open('full', 'w').write(str(n))\ntime.sleep(120)\""), timeout=120))
    try:
        await until(lambda: (bombed / "full").exists(), bomb, building)
        await until(lambda: release(build / "go"), building)  # opened just after "started"
        status, output = status_and_output(await building)
        assert status.startswith("[exit code 0"), (status, output[:1000])
        assert output == "built\n"
    finally:
        bomb.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bomb
    assert processes_with(marker) == []
    assert int((build / "uid").read_text()) in range(BOMB_UIDS, BOMB_UIDS + 64)


def test_two_processes_never_hold_one_uid_at_once(tmp_path: Path) -> None:
    locks, held = tmp_path / "locks", tmp_path / "held"
    held.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, "71000", str(locks),
                               str(held)], stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parent.parent) for _ in range(3)]
    errors = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], errors
    assert sorted(os.listdir(locks)) == ["71000", "71001"]
    assert stat_mode(locks) == 0o700


async def until(check: Callable[[], bool], *running: asyncio.Task[str]) -> None:
    """Wait (polling, with a hang guard) until ``check()`` holds; fail at once with its
    result if a command of ``running`` ends first."""
    async with asyncio.timeout(30):
        # What is checked is a file a sandbox writes: no event reaches the host.
        while not check():
            for task in running:
                assert not task.done(), task.result()
            await asyncio.sleep(0.02)


def make_tool(place: Path, **table: Any) -> Tool:
    """The exec tool of ``table`` without skill folders (the skills plugin's state is
    global: another test's skills would be shown, from directories no sandbox can reach)."""
    settings = Settings(data_dir=place / "data", plugins={"plugins.exec_tool": table})
    return ExecPlugin(CANARIES).roost_tools(settings)


def release(fifo: Path) -> bool:
    """Write a line to ``fifo`` if a reader has it open (never blocking)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return False
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
    return True


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


async def test_a_busy_pool_refuses_in_one_line_and_a_killed_holders_uid_comes_back(
        root: Path) -> None:  # noqa: F811
    workspace = root / "ws"
    workspace.mkdir()
    tool = make_tool(root, uid=BUSY_UID, uids=1, uid_wait=0.2)
    with holding(BUSY_UID) as holder:
        with pytest.raises(ToolError) as refused:
            await run(tool, workspace, "true")
        assert refused.value.code == "SANDBOX_BUSY"
        assert str(refused.value) == (
            f"exec is busy: the sandbox uid {BUSY_UID} stayed in use for 0.2s (each runs one "
            "command on this host); try again shortly.")
        with pytest.raises(UidsBusy):
            async with UidPool(BUSY_UID, 1, 0.0).claim():
                pass
        os.kill(holder.pid, signal.SIGKILL)  # no clean-up of its own: the kernel's
        holder.wait()
        # The probe, the canary (the pool's one uid) and the command all get it back.
        status, output = status_and_output(await run(tool, workspace, "id -u"))
    assert status.startswith("[exit code 0"), (status, output)
    assert output == f"{BUSY_UID}\n"


async def test_the_workspace_follows_the_uid_when_it_changes(root: Path) -> None:  # noqa: F811
    workspace = root / "ws"
    workspace.mkdir()
    tool = make_tool(root, uid=SWITCH_UIDS)
    first = status_and_output(await run(tool, workspace,
                                        "id -u; echo one > a; mkdir d; echo two > d/b"))
    old = int(first[1])
    with holding(old):  # another sandbox has that uid now: this run gets another one
        status, output = status_and_output(await run(
            tool, workspace, "id -u; echo more >> a; echo three > d/c; cat a d/b d/c"))
    new = int(output.splitlines()[0])
    assert status.startswith("[exit code 0"), (status, output)
    assert new != old and {old, new} <= set(range(SWITCH_UIDS, SWITCH_UIDS + 64))
    assert output.splitlines()[1:] == ["one", "more", "two", "three"]
    for path in (workspace, workspace / "a", workspace / "d", workspace / "d" / "b",
                 workspace / "d" / "c"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (new, new), path


async def test_a_wait_for_a_uid_leaves_the_command_its_wall_clock(root: Path) -> None:  # noqa: F811
    workspace = root / "ws"
    workspace.mkdir()
    tool = make_tool(root, uid=BUSY_UID + 2, uids=1, uid_wait=60)
    assert status_and_output(await run(tool, workspace, "true"))[0].startswith("[exit code 0")
    # 3 s left before the executor's deadline, 2 s of them the command's: no wait.
    with holding(BUSY_UID + 2), pytest.raises(ToolError) as refused:
        await run(tool, workspace, "true", timeout=2, ctx={"seconds": 3.0})
    assert refused.value.code == "SANDBOX_BUSY"
    assert f"uid {BUSY_UID + 2} stayed in use for 0s" in str(refused.value)


async def test_a_claim_cancelled_mid_attempt_gives_its_uid_back() -> None:
    # /stop while the pool is being looked at (in a thread): whatever that attempt claims
    # afterwards must be released, or the uid stays taken for the life of the process.
    pool = UidPool(BUSY_UID + 1, 1, 5.0)

    async def hold() -> None:
        async with pool.claim():
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)  # one step: it is awaiting its first attempt now
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    # The attempt is a task of its own, shielded from the cancellation: it ends, then
    # gives back what it claimed (on the loop's next turn, which until's pause is).
    await until(lambda: asyncio.all_tasks() == {asyncio.current_task()})
    await asyncio.sleep(0)
    assert released(pool)


def released(pool: UidPool) -> bool:
    """Whether this process can claim ``pool``'s uid now (and gives it back)."""
    claim = pool.try_claim()
    if claim is None:
        return False
    claim.release()
    return True


def test_the_reserved_uid_is_skipped_so_an_older_uid_65534_still_works(tmp_path: Path) -> None:
    from plugins.exec_config import ExecConfig

    assert ExecConfig(uid=65534, uids=3).uid == 65534  # accepted, as before the pool
    with pytest.raises(ValueError, match="uid_t"):
        ExecConfig(uid=65535, uids=1)
    # 65534 is nobody's, whose processes the host may run (and then the pool rightly
    # passes it over): the pool is asked in a PID namespace of its own, whose /proc shows
    # only the processes it starts, so 65534 is free there until it runs one as 65534.
    assert claimed_alone(65534, 3, tmp_path / "locks") == ["65534 65536", "65536"]


CLAIMED_ALONE = """\
import os, sys
from pathlib import Path
from plugins.exec_uids import UidPool
pool = UidPool(int(sys.argv[1]), int(sys.argv[2]), 0.0, Path(sys.argv[3]))
def claimed():
    claims = []
    while (claim := pool.try_claim()) is not None:
        claims.append(claim)
    for claim in claims:
        claim.release()
    return " ".join(str(claim.uid) for claim in claims)
print(claimed())
ready, go = os.pipe(), os.pipe()
if os.fork() == 0:
    os.setgid(pool.first)
    os.setuid(pool.first)
    os.write(ready[1], b"up")
    os.read(go[0], 1)  # never written: it ends with the namespace's pid 1
    os._exit(0)
os.read(ready[0], 2)
print(claimed())
"""


def claimed_alone(first: int, count: int, directory: Path) -> list[str]:
    """The uids a pool hands out one after another (then gives back) in a PID namespace
    of its own: free, then while a process of its own runs as ``first``."""
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                           CLAIMED_ALONE, str(first), str(count), str(directory)],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
