"""SIGUSR2 asks a running ``roost run`` for a tracemalloc snapshot (bot/observability/memory.py)."""

from __future__ import annotations

import signal
import tracemalloc
from pathlib import Path

from bot.observability.memory import by_package, dump_snapshot, package_of
from bot.testing.telegram import FakeTelegram
from tests.roost_processes import start_roost, until_logged
from tests.test_cli import clean_env


def _env(telegram: FakeTelegram, **extra: str) -> dict[str, str]:
    return clean_env(ROOST_PROVIDER="scripted", TELEGRAM_BOT_TOKEN=telegram.token,
                     TELEGRAM_API_BASE=telegram.base_url, **extra)


def test_files_are_counted_under_their_top_level_package() -> None:
    site = "/venv/lib/python3.11/site-packages"
    assert package_of(f"{site}/aiogram/types/message.py") == "aiogram"
    assert package_of(f"{site}/six.py") == "six"
    assert package_of("/src/roost/bot/engine/runloop.py") == "bot"
    assert package_of("/src/roost/channels/telegram/intake.py") == "channels"
    assert package_of("/usr/lib/python3.11/json/decoder.py") == "<stdlib>"
    assert package_of("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"


def test_a_snapshot_is_written_and_read_back_by_package(tmp_path: Path) -> None:
    # In this process: a traced `roost run` starts several times slower, so the
    # signal itself is tested below without tracing (the bench traces one).
    tracemalloc.start(4)
    try:
        held = bytearray(2_000_000)  # allocated while traced: the snapshot holds it
        path = dump_snapshot(tmp_path)
    finally:
        tracemalloc.stop()
    assert path is not None and path.parent == tmp_path / "memory"
    sizes = by_package(tracemalloc.Snapshot.load(str(path)))
    assert sum(sizes.values()) >= len(held)


async def test_sigusr2_without_tracing_says_how_to_enable_it(
        tmp_path: Path, fake_telegram: FakeTelegram) -> None:
    proc = await start_roost(tmp_path, _env(fake_telegram))
    try:
        await until_logged(proc, b"roost ready")
        proc.send_signal(signal.SIGUSR2)
        line = (await until_logged(proc, b"memory snapshot requested"))[-1].decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    assert "PYTHONTRACEMALLOC=25" in line
    assert proc.returncode == 0
    assert not (tmp_path / "data" / "memory").exists()
