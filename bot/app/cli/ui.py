"""``roost ui user add|list|remove|passwd``: the Control UI's accounts."""

from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn

import click

from bot.app.cli.base import (
    EXIT_SETUP,
    cli,
    cli_settings,
    database_of,
    echo,
    fail,
    run_and_exit,
)
from bot.config.settings import Settings

if TYPE_CHECKING:
    from bot.storage.ui_accounts import UiAccountStore



@cli.group()
def ui() -> None:
    """The Control UI at /ui (served when ROOST_HTTP_PORT is set)."""


@ui.group()
def user() -> None:
    """Accounts of the Control UI: viewer reads, operator acts, admin administers."""


async def _with_accounts(settings: Settings,
                         action: Callable[[UiAccountStore], Awaitable[int]]) -> int:
    from bot.storage.sessions import SessionStore
    from bot.storage.ui_accounts import UiAccountStore

    # WAL and the busy timeout let this write next to a running service; PostgreSQL
    # shares the accounts with every replica.
    store = await SessionStore.open(
        settings.database, connect_attempts=settings.database_connect_attempts)
    try:
        return await action(UiAccountStore(store.db, store.lock, store.writer))
    finally:
        await store.close()


def _refuse(line: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    fail(line)
    sys.exit(EXIT_SETUP)


def _read_password(from_stdin: bool) -> str:
    """The new password: stdin's first line, or typed twice at a prompt (not echoed)."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            _refuse("the two passwords differ")
    if not password:
        _refuse("the password is empty")
    return password


def _check_name(name: str) -> str:
    from bot.storage.ui_accounts import NAME_RULE, valid_name

    name = name.strip()
    if not valid_name(name):
        _refuse(f"{name!r} cannot name an account ({NAME_RULE})")
    return name


password_stdin = click.option("--password-stdin", "from_stdin", is_flag=True,
                              help="Read the password from the first line of stdin.")


@user.command("add")
@click.argument("name")
@click.option("--role", required=True, metavar="viewer|operator|admin",
              help="viewer reads; operator also acts; admin also manages plugins, users, budgets.")
@password_stdin
@click.pass_context
def user_add(ctx: click.Context, name: str, role: str, from_stdin: bool) -> None:
    """Add the account NAME with ROLE; the password is asked for (or read from stdin)."""
    from bot.storage.ui_accounts import ROLES
    from bot.ui.accounts import hash_password

    settings = cli_settings(ctx)
    if role not in ROLES:
        _refuse(f"unknown role {role!r}: viewer, operator or admin")
    name = _check_name(name)
    hashed = hash_password(_read_password(from_stdin))

    async def add(store: UiAccountStore) -> int:
        if not await store.add_account(name, role, hashed, time.time()):
            echo(f"roost: the UI account {name} exists already (roost ui user passwd "
                 f"{name} changes its password)", err=True)
            return 1
        echo(f"added UI account {name} ({role})")
        return 0

    run_and_exit(_with_accounts(settings, add), f"cannot use {database_of(settings)}")


@user.command("list")
@click.pass_context
def user_list(ctx: click.Context) -> None:
    """List the accounts and their roles."""
    settings = cli_settings(ctx)

    async def show(store: UiAccountStore) -> int:
        accounts = await store.accounts()
        if not accounts:
            echo("no UI account (the UI answers only on a loopback http_host, to anyone there)")
        for account in accounts:
            echo(f"{account.name}  {account.role}")
        return 0

    run_and_exit(_with_accounts(settings, show), f"cannot read {database_of(settings)}")


@user.command("remove")
@click.argument("name")
@click.pass_context
def user_remove(ctx: click.Context, name: str) -> None:
    """Remove the account NAME; its logins end at once."""
    settings = cli_settings(ctx)

    async def remove(store: UiAccountStore) -> int:
        if not await store.remove_account(name):
            echo(f"roost: no UI account is called {name}", err=True)
            return 1
        echo(f"removed UI account {name}")
        return 0

    run_and_exit(_with_accounts(settings, remove), f"cannot use {database_of(settings)}")


@user.command("passwd")
@click.argument("name")
@password_stdin
@click.pass_context
def user_passwd(ctx: click.Context, name: str, from_stdin: bool) -> None:
    """Set a new password for NAME; its logins end at once."""
    from bot.ui.accounts import hash_password

    settings = cli_settings(ctx)
    hashed = hash_password(_read_password(from_stdin))

    async def change(store: UiAccountStore) -> int:
        if not await store.set_password(name, hashed, time.time()):
            echo(f"roost: no UI account is called {name}", err=True)
            return 1
        echo(f"changed the password of UI account {name}")
        return 0

    run_and_exit(_with_accounts(settings, change), f"cannot use {database_of(settings)}")
