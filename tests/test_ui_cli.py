"""``roost ui user add|list|remove|passwd`` as a person runs them, on SQLite and PostgreSQL;
an account added there logs in to a running UI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

from bot.storage.sessions import SessionStore
from bot.testing.app import create_app, scripted
from bot.testing.ui import UiClient, serve_ui
from bot.ui.accounts import verify_password
from tests.cli_forks import run_roost
from tests.test_cli import ROOST, clean_env


def ui_user(*args: str, cwd: Path, database_url: str,
            password: str | None = None) -> subprocess.CompletedProcess[str]:
    """``roost ui user *args``, ``password`` piped to it, as a process of its own
    (:mod:`tests.cli_forks`)."""
    return run_roost(["ui", "user", *args], cwd=cwd, input=password,
                     env=clean_env(ROOST_DATABASE_URL=database_url), timeout=60)


async def rows(database_url: str, sql: str) -> list[tuple[object, ...]]:
    store = await SessionStore.open(database_url)
    try:
        async with store.db.execute(sql) as cur:
            return [tuple(r) for r in await cur.fetchall()]
    finally:
        await store.close()


def test_user_commands_add_list_passwd_remove_with_one_line_errors(
        tmp_path: Path, database_url: str) -> None:
    def run(*args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
        return ui_user(*args, cwd=tmp_path, database_url=database_url, password=password)

    added = run("add", "ada", "--role", "admin", "--password-stdin", password="first pass\n")
    assert (added.returncode, added.stdout, added.stderr) == (
        0, "added UI account ada (admin)\n", "")
    assert run("add", "vic", "--role", "viewer", "--password-stdin",
               password="viewer pass\n").returncode == 0
    stored = asyncio.run(rows(database_url, "SELECT name, role, password_hash FROM ui_users"
                                            " ORDER BY name"))
    assert [(n, r) for n, r, _ in stored] == [("ada", "admin"), ("vic", "viewer")]
    ada_hash = str(stored[0][2])
    assert ada_hash.startswith("scrypt$16384$8$1$") and "first pass" not in ada_hash  # full cost
    assert verify_password("first pass", ada_hash) and not verify_password("first", ada_hash)

    again = run("add", "ada", "--role", "viewer", "--password-stdin", password="other\n")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == ("roost: the UI account ada exists already (roost ui user passwd "
                            "ada changes its password)\n")
    bad_role = run("add", "bob", "--role", "root", "--password-stdin", password="pw\n")
    assert (bad_role.returncode, bad_role.stderr) == (
        2, "roost: unknown role 'root': viewer, operator or admin\n")
    empty = run("add", "bob", "--role", "viewer", "--password-stdin", password="\n")
    assert (empty.returncode, empty.stderr) == (2, "roost: the password is empty\n")

    listed = run("list")
    assert (listed.returncode, listed.stdout) == (0, "ada  admin\nvic  viewer\n")

    changed = run("passwd", "ada", "--password-stdin", password="second pass\n")
    assert changed.returncode == 0, changed.stderr
    new_hash = str(asyncio.run(rows(database_url, "SELECT password_hash FROM ui_users"
                                                  " WHERE name = 'ada'"))[0][0])
    assert verify_password("second pass", new_hash) and not verify_password("first pass",
                                                                             new_hash)
    unknown = run("passwd", "nobody", "--password-stdin", password="x\n")
    assert (unknown.returncode, unknown.stderr) == (1, "roost: no UI account is called nobody\n")

    assert run("remove", "vic").stdout == "removed UI account vic\n"
    gone = run("remove", "vic")
    assert (gone.returncode, gone.stderr) == (1, "roost: no UI account is called vic\n")
    assert run("list").stdout == "ada  admin\n"


async def test_an_account_added_by_the_cli_logs_in_and_passwd_ends_its_logins(
        tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'roost.db'}"
    assert ui_user("add", "ada", "--role", "operator", "--password-stdin", cwd=tmp_path,
                   database_url=database_url, password="cli pass\n").returncode == 0
    app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path,
                              database_url=database_url)
    try:
        server = await serve_ui(app)
        async with UiClient(server.url) as client:
            status, page = await client.log_in("ada", "cli pass")
            assert status == 200 and "ada (operator)" in page
            done = await asyncio.to_thread(ui_user, "passwd", "ada", "--password-stdin",
                                           cwd=tmp_path, database_url=database_url,
                                           password="new pass\n")
            assert done.returncode == 0, done.stderr
            status, _ = await client.get("/ui/", allow_redirects=False)
            assert status == 303  # the login ended with the old password
            status, page = await client.log_in("ada", "new pass")
            assert status == 200 and "ada (operator)" in page
    finally:
        await app.close()


def test_user_add_asks_for_the_password_twice_at_a_terminal_without_echoing_it(
        tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'roost.db'}"
    for typed, code in (("one secret\none secret\n", 0), ("one secret\nanother\n", 2)):
        master, slave = os.openpty()
        try:
            proc = subprocess.Popen([*ROOST, "ui", "user", "add", "ada", "--role", "viewer"],
                                    cwd=tmp_path, env=clean_env(ROOST_DATABASE_URL=database_url),
                                    stdin=slave, stdout=slave, stderr=slave,
                                    start_new_session=True)
            os.close(slave)
            shown = b""
            for prompt, line in zip((b"Password: ", b"Again: "), typed.splitlines(),
                                    strict=True):
                while prompt not in shown:
                    shown += os.read(master, 1024)
                shown = shown.split(prompt, 1)[1]
                os.write(master, line.encode() + b"\n")
            assert proc.wait(timeout=60) == code
            with contextlib.suppress(OSError):  # EIO once the child closed the terminal
                while chunk := os.read(master, 1024):
                    shown += chunk
        finally:
            os.close(master)
        assert b"secret" not in shown and b"another" not in shown  # never echoed
        if code:
            assert b"roost: the two passwords differ" in shown
    stored = asyncio.run(rows(database_url, "SELECT name, password_hash FROM ui_users"))
    assert len(stored) == 1 and verify_password("one secret", str(stored[0][1]))
