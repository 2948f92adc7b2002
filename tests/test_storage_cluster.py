"""The test PostgreSQL server (bot/testing/postgres.py): real, isolated per test, findable."""

from __future__ import annotations

from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from bot.testing import postgres
from bot.testing.postgres import PostgresCluster, PostgresUnavailable, find_binary


async def test_each_database_is_fresh_and_private(postgres_cluster: PostgresCluster) -> None:
    first = await postgres_cluster.create_database()
    second = await postgres_cluster.create_database()
    assert first != second
    conn = await asyncpg.connect(first)
    try:
        await conn.execute("CREATE TABLE t (x int)")
        assert str(await conn.fetchval("SHOW server_version")).startswith(("15", "16", "17"))
    finally:
        await conn.close()
    other = await asyncpg.connect(second)
    try:
        assert await other.fetchval("SELECT to_regclass('t')") is None
    finally:
        await other.close()


def test_server_binaries_are_found_under_debians_versioned_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for version in ("13", "15"):
        bindir = tmp_path / "lib" / version / "bin"
        bindir.mkdir(parents=True)
        (bindir / "initdb").write_text("")
    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)
    monkeypatch.setattr(postgres.glob, "glob",
                        lambda pattern: [str(p) for p in (tmp_path / "lib").glob("*/bin/initdb")])
    assert find_binary("initdb") == str(tmp_path / "lib" / "15" / "bin" / "initdb")


def test_missing_server_binaries_name_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)
    monkeypatch.setattr(postgres.glob, "glob", lambda pattern: [])
    with pytest.raises(PostgresUnavailable, match="apt-get install postgresql"):
        find_binary("initdb")
