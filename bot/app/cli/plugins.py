"""``roost plugins``: list, install, uninstall, enable and disable plugins."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from bot.config.settings import Settings, SetupError

if TYPE_CHECKING:
    pass


from bot.app.cli.base import EXIT_SETUP, cli, cli_settings, database_of, echo, fail, run_command


@cli.group()
def plugins() -> None:
    """Inspect, install and enable or disable plugins."""


def _persisted_disabled(settings: Settings) -> set[str]:
    if not settings.database_url and not settings.db_path.exists():
        return set()

    async def load() -> set[str]:
        from bot.pluginhost.state import load_disabled
        from bot.storage.sessions import SessionStore

        store = await SessionStore.open(
            settings.database, connect_attempts=settings.database_connect_attempts)
        try:
            return await load_disabled(store.db, store.lock)
        finally:
            await store.close()

    return run_command(load(), f"cannot read {database_of(settings)}")


def _plugin_rows(settings: Settings, *, include_builtin: bool) -> list[dict[str, Any]]:
    from bot.pluginhost.manager import get_plugin_manager

    host = get_plugin_manager(disabled=_persisted_disabled(settings))
    try:
        asyncio.run(host.validate_configs(settings.plugins))
    except SetupError as exc:  # a built-in plugin's bad [plugins.<name>] value
        fail(str(exc))
        sys.exit(EXIT_SETUP)
    rows: list[dict[str, Any]] = []
    for name, _plugin in host.pm.list_name_plugin():
        info = host.info.get(name)
        if info and info.builtin and not include_builtin:
            continue
        rows.append({
            "name": name,
            "distribution": info.distribution if info else "",
            "version": info.version if info else "",
            "builtin": bool(info and info.builtin),
            "hooks": host.hooks_of(name),
            "enabled": name not in host.disabled,
            "error": host.errors.get(name, ""),
        })
    for name, error in host.errors.items():
        if not any(r["name"] == name for r in rows):
            rows.append({"name": name, "distribution": "", "version": "", "builtin": False,
                         "hooks": [], "enabled": False, "error": error})
    return rows


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Include the built-in plugins.")
@click.pass_context
def plugins_list(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """List external plugins (--all: built-ins too) with their hooks, state and errors."""
    rows = _plugin_rows(cli_settings(ctx), include_builtin=show_all)
    if as_json:
        echo(json.dumps(rows, indent=2))
        return
    if not rows:
        echo("no external plugins installed (--all lists the built-in ones)")
    for row in rows:
        state = "error" if row["error"] else ("enabled" if row["enabled"] else "disabled")
        dist = f"{row['distribution']} {row['version']}".strip()
        echo(f"{row['name']:<28} {dist:<16} {state:<8} {', '.join(row['hooks'])}")
        if row["error"]:
            echo(f"    error: {row['error']}")


def _pip(ctx: click.Context, action: str, names: tuple[str, ...]) -> None:
    from bot.pluginhost.install import describe_change, pip_command, plugin_entry_points

    settings = cli_settings(ctx)  # puts plugins_dir on sys.path
    before = plugin_entry_points()
    command = pip_command(action, list(names))
    if settings.plugins_dir is not None:
        from bot.app import plugins_dir

        if action == "install":
            command += plugins_dir.pip_target_args(settings.plugins_dir)
        else:
            # pip uninstalls only inside its own environment.
            outside = [n for n in names if not plugins_dir.uninstall(settings.plugins_dir, n)]
            command = pip_command(action, outside) if outside else []
    code = run_pip(command) if command else 0
    if code != 0:
        echo(f"roost: pip {action} failed (exit code {code})", err=True)
        sys.exit(code)
    echo(describe_change(before, plugin_entry_points()))
    echo("Restart Roost to apply the change.")


def run_pip(command: list[str]) -> int:
    """Run pip, each of its lines echoed masked (it prints its index URLs, a token in their
    query included); its exit code."""
    import subprocess

    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace") as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            echo(line.rstrip("\n"))
        return pip.wait()


@plugins.command("install")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def plugins_install(ctx: click.Context, names: tuple[str, ...]) -> None:
    """pip install plugin packages into Roost's environment (or ROOST_PLUGINS_DIR)."""
    _pip(ctx, "install", names)


@plugins.command("uninstall")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def plugins_uninstall(ctx: click.Context, names: tuple[str, ...]) -> None:
    """pip uninstall plugin packages from Roost's environment (or ROOST_PLUGINS_DIR)."""
    _pip(ctx, "uninstall", names)


def _set_enabled(ctx: click.Context, name: str, enabled: bool) -> None:
    from bot.pluginhost.manager import ESSENTIAL_PLUGINS, get_plugin_manager
    from bot.pluginhost.state import save_state
    from bot.storage.sessions import SessionStore

    settings = cli_settings(ctx)
    host = get_plugin_manager()
    if host.pm.get_plugin(name) is None:
        echo(f"roost: no plugin named {name!r} is loaded "
                   f"(see `roost plugins list --all`)", err=True)
        sys.exit(1)
    if not enabled and name in ESSENTIAL_PLUGINS:
        echo(f"roost: {name} is essential to Roost and cannot be disabled", err=True)
        sys.exit(1)

    async def save() -> None:
        store = await SessionStore.open(
            settings.database, connect_attempts=settings.database_connect_attempts)
        try:
            await save_state(store.db, store.lock, name, enabled)
        finally:
            await store.close()

    run_command(save(), f"cannot use {database_of(settings)}")
    echo(f"{name} {'enabled' if enabled else 'disabled'}; a running Roost applies it "
               "at its next start (or use /plugin in chat to apply it at once)")


@plugins.command("enable")
@click.argument("name")
@click.pass_context
def plugins_enable(ctx: click.Context, name: str) -> None:
    """Enable a plugin (remembered in the database)."""
    _set_enabled(ctx, name, True)


@plugins.command("disable")
@click.argument("name")
@click.pass_context
def plugins_disable(ctx: click.Context, name: str) -> None:
    """Disable a plugin (remembered in the database)."""
    _set_enabled(ctx, name, False)
