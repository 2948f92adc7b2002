"""``roost run`` as a separate process in tests: start it, read its log until a line."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def start_roost(cwd: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    """``python -m bot run`` in ``cwd`` (created if missing) with ``env``; its log on a pipe."""
    await asyncio.to_thread(cwd.mkdir, exist_ok=True)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", cwd=cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)


async def until_logged(proc: asyncio.subprocess.Process, text: bytes) -> list[bytes]:
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
