"""Where ``roost run``'s memory goes: per module at import, per new chat session at run time.

Part ``memory`` of ``bench/bench_telegram.py`` (``--only memory``):

* per module: a fresh interpreter imports, in the order ``roost run`` does for
  Telegram + Anthropic, each group of modules and reports the RSS it added
  (from ``/proc/self/status``);
* per session: ``roost run`` is started traced (``PYTHONTRACEMALLOC=1``), warmed
  up, asked for a snapshot (``SIGUSR2``, see :mod:`bot.observability.memory`),
  sent one message from each of 500 new chats, and asked again; the table shows
  the bytes per new session each source file holds more, from the two snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

from bench._common import print_table, roost_process, telegram_env

SESSIONS = 500
FIRST_CHAT = 500_000

IMPORT_GROUPS = (
    ("interpreter + asyncio, ssl, json", "asyncio, ssl, json, sqlite3"),
    ("pydantic + settings", "pydantic, bot.config.settings"),
    ("aiohttp (client)", "aiohttp"),
    ("CLI", "bot.app.cli"),
    ("core (engine, dispatch, storage, aiosqlite)", "bot.app.roost, aiosqlite"),
    ("plugins (built-in)", "plugins, channels.builtin, plugins.providers, plugins.memory"),
    ("aiogram (types built lazily)", "channels.telegram_lazy"),
    ("Telegram channel", "channels.telegram"),
    ("Anthropic provider (direct route, no SDK)", "plugins.anthropic_provider"),
)

_PROBE = """
import importlib, json, sys
def rss():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) / 1024
out = [("python", rss())]
for label, modules in json.loads(sys.argv[1]):
    before = rss()
    for name in modules.split(", "):
        importlib.import_module(name)
    out.append((label, rss() - before))
print(json.dumps(out))
"""


def per_module() -> list[tuple[str, float]]:
    """RSS (MiB) each group of modules adds, imported in ``roost run``'s order."""
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(IMPORT_GROUPS)],
                          capture_output=True, text=True, check=True)
    return [(label, float(mib)) for label, mib in json.loads(done.stdout)]


async def _snapshot(roost_dir: Path, proc: subprocess.Popen[str], seen: set[Path]
                    ) -> tracemalloc.Snapshot:
    proc.send_signal(signal.SIGUSR2)
    folder = roost_dir / "memory"
    for _ in range(600):
        new = set(folder.glob("*.tracemalloc")) - seen if folder.exists() else set()
        if new:
            [path] = new
            seen.add(path)
            await asyncio.sleep(0.5)  # written in one go; let the write finish
            return tracemalloc.Snapshot.load(str(path))
        await asyncio.sleep(0.1)
    raise TimeoutError("no memory snapshot")


async def per_session() -> list[tuple[str, float]]:
    """Bytes per new chat session held more, by source file (largest first)."""
    from bench.bench_telegram import fakes, parallel

    async with fakes() as (telegram, anthropic, tracker):
        with tempfile.TemporaryDirectory(prefix="roost-bench-mem-") as tmp, \
                contextlib.ExitStack() as stack:
            data = Path(tmp) / "data"
            env = telegram_env(data, telegram, anthropic, streaming=None)
            env["PYTHONTRACEMALLOC"] = "1"
            roost = stack.enter_context(roost_process(env, Path(tmp)))
            await asyncio.to_thread(roost.wait_ready, 120.0)
            for n in range(20):  # warm: first-use caches are not per-session memory
                await tracker.one(FIRST_CHAT - 1 - n)
            seen: set[Path] = set()
            before = await _snapshot(data, roost.proc, seen)
            await parallel(tracker, range(FIRST_CHAT, FIRST_CHAT + SESSIONS), 25)
            await asyncio.sleep(1.0)
            after = await _snapshot(data, roost.proc, seen)
            roost.stop()
    rows = []
    for stat in after.compare_to(before, "filename"):
        if stat.size_diff > 0:
            rows.append((stat.traceback[0].filename, stat.size_diff / SESSIONS))
    rows.sort(key=lambda r: -r[1])
    return rows


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "/lib/python3."):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


async def run_memory() -> None:
    """Print the two tables."""
    modules = per_module()
    print("\nRSS by module group, imported in roost run's order (MiB)")
    print_table(("group", "MiB"), [(label, f"{mib:.1f}") for label, mib in modules],
                numbers_right=True)
    print(f"  total after imports: {sum(m for _, m in modules):.1f} MiB")
    rows = await per_session()
    total = sum(b for _, b in rows)
    print(f"\nHeld per new chat session, by source file ({SESSIONS} sessions, tracemalloc;"
          f" {total / 1024:.1f} KiB in all)")
    print_table(("file", "bytes/session"),
                [(_short(f), f"{b:,.0f}") for f, b in rows[:12]], numbers_right=True)
