"""``roost db``: migrate a database, and copy one to another backend."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from bot.app.cli.base import cli, cli_settings, echo, run_and_exit, setup_logging

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.storage.sessions import SessionStore


@cli.group()
def db() -> None:
    """Migrate the database, or move a deployment to another one (SQLite <-> PostgreSQL)."""


async def _open_migrated(target: Path | str, settings: Settings) -> SessionStore:
    """The store on ``target`` with Roost's and every plugin's schema steps applied."""
    from bot.pluginhost.manager import get_plugin_manager
    from bot.pluginhost.migrations import migrate_plugins
    from bot.storage.db import retire_columns
    from bot.storage.sessions import SessionStore

    try:
        store = await SessionStore.open(
            target, pool_size=settings.database_pool_size,
            connect_attempts=settings.database_connect_attempts)
    except (ValueError, RuntimeError) as exc:  # a bad URL, a missing driver
        raise click.ClickException(str(exc)) from exc
    try:
        host = get_plugin_manager()
        if await migrate_plugins(host, store.db, store.lock):
            await retire_columns(store.db, store.lock)
        else:
            failed = "; ".join(f"{k}: {v}" for k, v in sorted(host.errors.items()))
            raise click.ClickException(f"plugin migrations failed: {failed}")
    except BaseException:
        await store.close()
        raise
    return store


@db.command("migrate")
@click.option("--url", "url", default=None,
              help="The database (default: ROOST_DATABASE_URL, else data_dir/roost.db).")
@click.pass_context
def db_migrate(ctx: click.Context, url: str | None) -> None:
    """Apply Roost's and the plugins' pending schema steps, then exit.

    ``roost run`` does this at start too; run it first to migrate while the
    service is down, or to check a new database. Replicas starting together
    on PostgreSQL migrate once (an advisory lock orders them).
    """
    settings = cli_settings(ctx)
    setup_logging("WARNING")

    async def run() -> int:
        from bot.storage.db import schema_version

        store = await _open_migrated(url or settings.database, settings)
        try:
            version = await schema_version(store.db)
        finally:
            await store.close()
        echo(f"database at schema version {version}")
        return 0

    run_and_exit(run(), f"cannot migrate the database {url or settings.database}")


@db.command("copy")
@click.option("--from", "source", required=True,
              help="The database to read: sqlite:///data/roost.db or postgresql://...")
@click.option("--to", "target", required=True,
              help="The database to fill: postgresql://... or sqlite:///...")
@click.option("--force", is_flag=True, help="Replace rows the target already holds.")
@click.pass_context
def db_copy(ctx: click.Context, source: str, target: str, force: bool) -> None:
    """Copy every table (Roost's and the plugins') with its ids to another database.

    Both are migrated first. Stop the service while copying: what it writes
    meanwhile is not copied. The row counts of every table are compared at
    the end; a difference is an error (exit 1).
    """
    from bot.storage.copy import CopyError, copy_database

    settings = cli_settings(ctx)
    setup_logging("WARNING")
    if source == target:
        raise click.UsageError("--from and --to name the same database")

    async def run() -> int:
        src = await _open_migrated(source, settings)
        try:
            dst = await _open_migrated(target, settings)
            try:
                copied = await copy_database(
                    src.db, dst.db, force=force,
                    progress=lambda table, n: echo(f"{table}: {n} rows"))
            finally:
                await dst.close()
        except CopyError as exc:
            echo(f"roost: {exc}", err=True)
            return 1
        finally:
            await src.close()
        total = sum(c.target_rows for c in copied)
        echo(f"copied {total} rows in {len(copied)} tables; row counts match")
        return 0

    run_and_exit(run(), "cannot copy the database")
