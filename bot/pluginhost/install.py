"""Installing and removing plugin packages with pip, in Roost's own environment."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import sys
from collections.abc import Awaitable, Callable

from bot.config.masking import mask_text
from bot.pluginhost.manager import ENTRY_POINT_GROUP

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?"
                     r"(==[A-Za-z0-9.*+!_-]+)?$")
"""A distribution name, optional extras and an optional exact version; nothing else
(no URLs, paths or pip options)."""


def valid_name(name: str) -> bool:
    """Whether ``name`` is a plain requirement pip may be given."""
    return bool(NAME_RE.match(name))


def pip_command(action: str, names: list[str]) -> list[str]:
    """``python -m pip install|uninstall`` for Roost's own interpreter."""
    extra = ["-y"] if action == "uninstall" else []
    return [sys.executable, "-m", "pip", action, *extra, *names]


def plugin_entry_points() -> dict[str, str]:
    """Every installed ``roost`` entry point: name → distribution."""
    return {ep.name: (ep.dist.name if ep.dist else "")
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def describe_change(before: dict[str, str], after: dict[str, str]) -> str:
    """Which plugins appeared and disappeared between two :func:`plugin_entry_points`."""
    added = sorted(f"{n} ({after[n]})" for n in set(after) - set(before))
    removed = sorted(f"{n} ({before[n]})" for n in set(before) - set(after))
    parts = []
    if added:
        parts.append("new plugins: " + ", ".join(added))
    if removed:
        parts.append("removed plugins: " + ", ".join(removed))
    return "; ".join(parts) or "no plugins added or removed"


async def run_streaming(command: list[str], on_line: Callable[[str], Awaitable[None]]
                        ) -> tuple[int, list[str]]:
    """Run ``command`` without blocking the event loop; each output line goes to ``on_line``.

    Returns the exit code and the output lines, credentials masked. Cancelling kills the
    process.
    """
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async for raw in proc.stdout:
            # pip prints its index URLs (a token in their query is not redacted by pip).
            line = mask_text(raw.decode(errors="replace").rstrip())
            if line:
                lines.append(line)
                await on_line(line)
        return await proc.wait(), lines
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
