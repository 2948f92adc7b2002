"""``roost run`` as a separate process in tests: start it, read its log until a line."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from tests.roost_forks import ForkedProcess, spawn

RoostProcess = asyncio.subprocess.Process | ForkedProcess
"""A started ``roost run``: exec'd or forked, used alike."""

WARM = {"DISCORD_BOT_TOKEN": "channels.discord", "SLACK_BOT_TOKEN": "channels.slack",
        "MATRIX_HOMESERVER": "plugins.matrix.channel",
        "WHATSAPP_ACCESS_TOKEN": "plugins.whatsapp.channel"}
"""The channel module a ``roost run`` imports when a variable is set (the forking
process imports it once for all)."""


async def start_roost(cwd: Path, env: Mapping[str, str], *, fork: bool = True,
                      ) -> RoostProcess:
    """``python -m bot run`` in ``cwd`` (created if missing) with ``env``; its log on a pipe.

    A fork of a process that imported Roost (:mod:`tests.roost_forks`) unless ``fork``
    is false: then exec'd, for the tests that keep Roost's real start covered."""
    await asyncio.to_thread(cwd.mkdir, exist_ok=True)
    if fork:
        return await spawn(["run"], cwd=cwd, env=env,
                           warm=[module for name, module in WARM.items() if name in env])
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", cwd=cwd, env=dict(env),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)


async def forked_run(env: Mapping[str, str], log: IO[bytes]) -> ForkedProcess:
    """A forked ``roost run`` with ``env`` in this process's directory, its output to
    ``log`` (a :class:`bot.testing.chaos.ChaosRun`'s ``spawn``)."""
    proc = await spawn(["run"], cwd=Path.cwd(), env=env, stdout=log, stderr=log,
                       warm=[module for name, module in WARM.items() if name in env])
    assert isinstance(proc, ForkedProcess), "ChaosRun's environment keeps Python's"
    return proc


async def until_logged(proc: RoostProcess, text: bytes) -> list[bytes]:
    """Read ``proc``'s log up to the first line containing ``text``; the lines read, that
    one last. Fails with the log's tail if the process exits first."""
    assert proc.stderr is not None
    lines: list[bytes] = []
    async with asyncio.timeout(60):  # a hang guard, not a measurement
        while True:
            line = await proc.stderr.readline()
            assert line, b"".join(lines).decode()[-3000:]
            lines.append(line)
            if text in line:
                return lines
