"""A plain `pip install -e .` has no optional extra: the app and the CLI import without them."""

from __future__ import annotations

import subprocess
import sys


def test_the_app_and_the_demo_chat_run_without_the_postgres_extra(tmp_path: object) -> None:
    # asyncpg comes with `roost[postgres]` only; a SQLite install must not need it.
    script = ("import sys; sys.modules['asyncpg'] = None\n"
              "from bot.app.cli import main\n"
              "sys.argv = ['roost', 'chat', '--demo', '-m', 'hi']\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "asyncpg" not in done.stderr
