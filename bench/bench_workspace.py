"""Workspace access benchmark: what opening once without following links costs per call.

Run with ``.venv/bin/python bench/bench_workspace.py`` (about 10 s).

In one process, on a small shared VM's file system (page cache warm):

- ``read_file`` (the tool's ``execute``, its thread hop included) of a 1 KB file at the
  workspace root and three directories down;
- ``read_cached`` of USER.md when the cache holds it (the prompt build's case);

each through the code before confinement by descriptor (the previous commit's
``plugins/file_tools.py`` and ``workspaces/cache.py``, loaded from git), through
openat2(2) and through the forced ``O_NOFOLLOW`` walk. Medians of 5 rounds of
2,000 calls (the three taking turns in each round), in microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.config.settings import Settings
from bot.contracts.tools import ToolContext
from plugins import file_tools
from workspaces import beneath, cache

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = (("before", "before"), ("after, openat2", "after"),
            ("after, O_NOFOLLOW walk", "after"))
ROUNDS = 5
CALLS = 2000


def previous(module: str, rev: str) -> types.ModuleType:
    """``module`` (a path in the repository) as it was at ``rev``, loaded under a new name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{module}"],
                            capture_output=True, text=True, check=True).stdout
    loaded = types.ModuleType(f"before_{Path(module).stem}")
    exec(compile(source, f"{rev}:{module}", "exec"), loaded.__dict__)
    return loaded


def base_rev() -> str:
    """The commit before the one that added workspaces/beneath.py."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H",
                            "--", "workspaces/beneath.py"], capture_output=True, text=True,
                           check=True).stdout.split()
    return f"{added[-1]}^"


async def interleaved(variants: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Microseconds per call of each variant: the median of :data:`ROUNDS` rounds, the
    variants taking turns within each round so that the machine's drift hits all alike."""
    rounds: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(ROUNDS):
        for label, call in variants.items():
            kernel = not label.endswith("walk")
            beneath.use_openat2(kernel)
            start = time.perf_counter()
            for _ in range(CALLS):
                result = call()
                if isinstance(result, Awaitable):
                    await result
            rounds[label].append((time.perf_counter() - start) / CALLS * 1e6)
    beneath.use_openat2(True)
    return {label: statistics.median(values) for label, values in rounds.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=None, help="git revision of the 'before' code")
    args = parser.parse_args()
    rev = args.before or base_rev()
    old_tools = previous("plugins/file_tools.py", rev)
    old_cache = previous("workspaces/cache.py", rev)

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        (ws / "a" / "b" / "c").mkdir(parents=True)
        text = "note line\n" * 100
        (ws / "notes.md").write_text(text)
        (ws / "a" / "b" / "c" / "notes.md").write_text(text)
        (ws / "USER.md").write_text("The user likes short answers.\n" * 20)
        settings = Settings(data_dir=Path(tmp) / "data")
        ctx = ToolContext("u", "console", "u", "s", "r", ws, time.monotonic() + 3600)
        tools: dict[str, Any] = {}
        for label, module in (("before", old_tools), ("after", file_tools)):
            tools[label] = next(t for t in module.roost_tools(settings) if t.name == "read_file")

        rows: list[tuple[str, str, float]] = []
        for path in ("notes.md", "a/b/c/notes.md"):
            calls = {label: (lambda tool=tools[code], path=path: tool.execute(ctx, {"path": path}))
                     for label, code in VARIANTS}
            for label, micros in (await interleaved(calls)).items():
                rows.append((f"read_file {path}", label, micros))
        user = ws / "USER.md"
        reads = {label: (lambda read=(old_cache if code == "before" else cache).read_cached:
                         read(user, 8000, within=ws)) for label, code in VARIANTS}
        for read in reads.values():
            assert read()  # cached from now on
        for label, micros in (await interleaved(reads)).items():
            rows.append(("read_cached USER.md (hit)", label, micros))

    print(f"before = {rev}; openat2 available: {beneath.has_openat2()}; "
          f"median of {ROUNDS} rounds x {CALLS} calls")
    print(f"{'call':34} {'code':24} {'us/call':>8}")
    for call_name, label, micros in rows:
        print(f"{call_name:34} {label:24} {micros:8.1f}")


if __name__ == "__main__":
    asyncio.run(main())
