"""``roost config``, ``mcp``, ``errors``, ``pairing``, ``status`` and ``init``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bot.config.settings import Settings, SetupError

if TYPE_CHECKING:
    from bot.storage.errors import ErrorStore


from bot.app.cli.base import (
    EXIT_SETUP,
    cli,
    cli_settings,
    database_of,
    echo,
    fail,
    run_and_exit,
    setup_logging,
)


@cli.group()
def config() -> None:
    """Inspect configuration."""


@config.command("show")
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration with secrets masked."""
    from bot.app.config_view import config_lines
    from bot.pluginhost.manager import get_plugin_manager

    settings = cli_settings(ctx)
    host = get_plugin_manager()
    try:
        asyncio.run(host.validate_configs(settings.plugins))
    except SetupError as exc:  # a built-in plugin's bad [plugins.<name>] value
        fail(str(exc))
        sys.exit(EXIT_SETUP)
    for _key, line in config_lines(settings, host):
        echo(line)


@cli.group()
def mcp() -> None:
    """Check the MCP servers of [mcp.servers.<name>]."""


def _mcp_report(ctx: click.Context, name: str | None) -> None:
    # The plugin owns the client; imported here so other commands never load the SDK.
    from plugins.mcp.cli import list_servers, test_server

    settings = cli_settings(ctx)
    setup_logging("ERROR")
    work = list_servers(settings) if name is None else test_server(settings, name)
    code, text = asyncio.run(work)
    echo(text)
    sys.exit(code)


@mcp.command("list")
@click.pass_context
def mcp_list(ctx: click.Context) -> None:
    """Start each server, list its tools, end it; say why one fails."""
    _mcp_report(ctx, None)


@mcp.command("test")
@click.argument("name")
@click.pass_context
def mcp_test(ctx: click.Context, name: str) -> None:
    """Start server NAME, print its tools with their parameters, end it."""
    _mcp_report(ctx, name)


@cli.group()
def errors() -> None:
    """Inspect stored tool errors."""


def parse_since(value: str, now: float) -> float:
    """``2h``, ``30m``, ``7d``, ``45s`` ago, or an ISO date/time (UTC if no zone)."""
    import datetime as dt

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].isdigit():
        return now - int(value[:-1]) * units[value[-1]]
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not like 2h, 30m, 7d or 2026-11-21T10:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@errors.command("list")
@click.option("--session", help="Only this session key.")
@click.option("--tool", help="Only this tool.")
@click.option("--since", help="Only newer errors: 2h, 30m, 7d or an ISO date/time.")
@click.option("--limit", default=50, show_default=True, help="At most this many.")
@click.pass_context
def errors_list(ctx: click.Context, session: str | None, tool: str | None, since: str | None,
                limit: int) -> None:
    """List stored tool errors, newest first."""
    import time

    settings = cli_settings(ctx)
    start = parse_since(since, time.time()) if since else None

    async def show(store: ErrorStore) -> int:
        rows = await store.list(session_id=session, tool_name=tool, since=start, limit=limit)
        for e in rows:
            echo(f"{e.id}  {e.iso_timestamp()}  {e.tool_name:<16} {e.session_id}  "
                       f"{e.short_summary}")
        if not rows:
            echo("no errors match")
        return 0

    run_and_exit(_with_errors(settings, show), f"cannot read {database_of(settings)}")


@errors.command("show")
@click.argument("error_id")
@click.pass_context
def errors_show(ctx: click.Context, error_id: str) -> None:
    """Show one stored error in full."""
    settings = cli_settings(ctx)

    async def show(store: ErrorStore) -> int:
        found = await store.get(error_id)
        if found is None:
            echo(f"roost: no error {error_id}", err=True)
            return 1
        from bot.storage.errors import error_report

        echo(error_report(found))
        return 0

    run_and_exit(_with_errors(settings, show), f"cannot read {database_of(settings)}")


async def _with_errors(settings: Settings,
                       action: Callable[[ErrorStore], Awaitable[int]]) -> int:
    from bot.storage.errors import ErrorStore
    from bot.storage.sessions import SessionStore

    if not settings.database_url and not settings.db_path.exists():
        echo(f"roost: no database at {settings.db_path}", err=True)
        return 1
    store = await SessionStore.open(
        settings.database, connect_attempts=settings.database_connect_attempts)
    try:
        return await action(ErrorStore(store.db, store.lock))
    finally:
        await store.close()


@cli.group()
def pairing() -> None:
    """Approve and list DM pairing requests (dm_policy = "pairing")."""


async def _with_access(settings: Settings, action: Callable[[Any], Awaitable[int]]) -> int:
    from bot.storage.access import AccessStore
    from bot.storage.sessions import SessionStore

    if not settings.database_url and not settings.db_path.exists():
        echo(f"roost: no database at {settings.db_path}", err=True)
        return 1
    # WAL and the busy timeout let this write next to a running service.
    store = await SessionStore.open(
        settings.database, connect_attempts=settings.database_connect_attempts)
    try:
        return await action(AccessStore(store.db, store.lock, store.writer,
                                        ttl=settings.pairing_code_ttl))
    finally:
        await store.close()


@pairing.command("approve")
@click.argument("code")
@click.pass_context
def pairing_approve(ctx: click.Context, code: str) -> None:
    """Approve the user who was given CODE; they can DM the bot at once."""
    settings = cli_settings(ctx)

    async def approve(store: Any) -> int:
        request = await store.approve(code, "cli")
        if request is None:
            echo(f"roost: no pending request has the code {code} (wrong, expired or "
                       "already used)", err=True)
            return 1
        name = f" ({request.display_name})" if request.display_name else ""
        echo(f"approved {request.user}{name}")
        return 0

    run_and_exit(_with_access(settings, approve), f"cannot use {database_of(settings)}")


@pairing.command("list")
@click.pass_context
def pairing_list(ctx: click.Context) -> None:
    """List pending pairing codes and approved users."""
    import time

    settings = cli_settings(ctx)

    async def show(store: Any) -> int:
        now = time.time()
        pending, paired = await store.pending(), await store.paired()
        echo("pending:" if pending else "pending: none")
        for r in pending:
            echo(f"  {r.code}  {r.user}  {r.display_name or '-'}  expires in "
                       f"{max(0, round((r.expires_at - now) / 60))} min")
        echo("approved:" if paired else "approved: none")
        for u in paired:
            echo(f"  {u.user}  {u.display_name or '-'}  by {u.approved_by}")
        return 0

    run_and_exit(_with_access(settings, show), f"cannot read {database_of(settings)}")


@cli.command()
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for an answer.")
@click.pass_context
def status(ctx: click.Context, timeout: float) -> None:
    """Ask a running Roost's /readyz (ROOST_HTTP_HOST/PORT) and print the answer.

    Exit code 0: ready; 1: not ready (the failing parts are printed); 2: no answer.
    """
    import http.client

    settings = cli_settings(ctx)
    if not settings.http_port:
        echo("roost: ROOST_HTTP_PORT is not set, so Roost serves no /readyz to ask",
                   err=True)
        sys.exit(EXIT_SETUP)
    # A server bound to every interface is asked on the loopback one.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.http_host, settings.http_host)
    try:
        connection = http.client.HTTPConnection(host, settings.http_port, timeout=timeout)
        try:
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            body = response.read().decode("utf-8", "replace")
        finally:
            connection.close()
    except (OSError, http.client.HTTPException) as exc:
        echo(f"roost: cannot reach {host}:{settings.http_port} ({exc})", err=True)
        sys.exit(EXIT_SETUP)
    if response.status == 200:
        echo(body, nl=False)
        sys.exit(0)
    echo("not ready:" if response.status == 503 else f"HTTP {response.status}:")
    echo(body, nl=False)
    sys.exit(1)


@cli.command()
@click.option("--force", is_flag=True, help="Overwrite roost.toml and .env.example.")
def init(force: bool) -> None:
    """Write a commented roost.toml and a .env.example (one line per credential) here."""
    from bot.app import init as templates

    here = Path.cwd()
    taken = templates.existing(here)
    if taken and not force:
        echo(f"roost: {', '.join(p.name for p in taken)} already "
                   f"{'exists' if len(taken) == 1 else 'exist'} here; nothing written "
                   "(--force overwrites)", err=True)
        sys.exit(1)
    for path in templates.write(here):
        echo(f"wrote {path.name}")
    echo("Next:\n"
               "  cp .env.example .env   # and fill in the credentials you use\n"
               "  roost chat             # try it in this terminal (no key: roost chat --demo)")
