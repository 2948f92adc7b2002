"""The ``roost`` command line: run, chat, plugins, config, version."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bot import __version__
from bot.config.settings import ConfigError, Settings, load_settings
from bot.contracts.hookspecs import hookimpl
from bot.observability import logformat, redact

if TYPE_CHECKING:
    from bot.app.roost import Roost
    from bot.contracts.events import RunEvent
    from bot.storage.errors import ErrorStore

log = logging.getLogger("roost")

EXIT_SETUP = 2

_output = {"format": "text"}
"""How one-line errors are written: ``text`` (``roost: ...``) or ``json`` (a log record)."""


def _setup_logging(level: str, *, quiet: bool = False, fmt: str = "text") -> None:
    _output["format"] = fmt
    logformat.configure("WARNING" if quiet else level, fmt=fmt)
    # Library chatter (HTTP requests) would drown Roost's own lines.
    for noisy in ("httpx", "httpcore", "anthropic", "openai", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(message: str) -> None:
    """Say why Roost cannot go on: one line on stderr (one JSON record under json logs)."""
    if _output["format"] == "json":
        log.error("%s", message)
    else:
        click.echo(f"roost: {message}", err=True)


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    try:
        settings = load_settings(ctx.obj.get("config"), **overrides)
    except ConfigError as exc:
        click.echo(f"roost: {exc}", err=True)
        sys.exit(EXIT_SETUP)
    # Before anything can log: no configured secret reaches any log line.
    redact.install(redact.secrets_of(settings))
    if settings.plugins_dir is not None:
        from bot.app.plugins_dir import use_plugins_dir

        use_plugins_dir(settings.plugins_dir)
    return settings


def _run_async(coro: Coroutine[Any, Any, int]) -> None:
    sys.exit(asyncio.run(coro))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="roost",
                      message="%(prog)s %(version)s")
@click.option("--config", "config", type=click.Path(path_type=Path), default=None,
              help="Path to roost.toml (default: ./roost.toml if present).")
@click.pass_context
def cli(ctx: click.Context, config: Path | None) -> None:
    """Roost: an LLM agent in your chats, extended by plugins."""
    ctx.ensure_object(dict)
    ctx.obj["config"] = config


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Start every channel whose credentials are set; Ctrl-C or SIGTERM stops cleanly."""
    settings = _settings(ctx)
    _setup_logging(settings.log_level, fmt=settings.log_format)
    _run_async(_serve(settings))


async def _open_app(settings: Settings) -> Roost | None:
    """The app, or ``None`` after saying exactly what to set for the provider."""
    from bot.app.roost import Roost, resolve_provider
    from bot.config.settings import SetupError
    from bot.pluginhost.manager import get_plugin_manager

    host = get_plugin_manager()
    try:
        await resolve_provider(settings, host)
    except SetupError as exc:
        _fail(str(exc))
        return None
    try:
        return await Roost.create(settings, host=host)
    except (OSError, sqlite3.Error) as exc:
        # A data directory that cannot be created or a database that cannot be opened.
        log.debug("opening the app failed", exc_info=True)
        _fail(f"cannot open the data directory {settings.data_dir}: {exc}")
        return None
    except Exception as exc:
        log.debug("opening the app failed", exc_info=True)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        _fail(f"cannot start: {detail} (ROOST_LOG_LEVEL=DEBUG shows the traceback)")
        return None


def _stop_signal() -> asyncio.Event:
    """An event set by Ctrl-C or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _first(*awaitables: Awaitable[Any]) -> None:
    """Wait until one of ``awaitables`` is done; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


PLATFORM_MODULES = {"aiogram": "aiogram", "discord": "discord.py", "slack_bolt": "slack-bolt",
                    "slack_sdk": "slack-sdk"}
"""The platform SDKs' top-level modules and the distributions that install them."""


def missing_sdk(channel: str, exc: ModuleNotFoundError) -> str:
    """What to install when channel ``channel`` could not import ``exc.name``."""
    module = (exc.name or "").partition(".")[0] or "a module"
    package = PLATFORM_MODULES.get(module, module)
    if channel in ("telegram", "discord", "slack"):
        return f"the {channel} channel needs {package}: pip install 'roost[{channel}]'"
    return f"the {channel} channel needs {package}: pip install {package}"


EXIT_UNAVAILABLE = 1
"""A platform could not be reached at start: a supervisor may well try again later
(unlike :data:`EXIT_SETUP`, which needs a change first)."""


async def _start_channel(app: Roost, name: str) -> tuple[int, str] | None:
    """Start channel ``name``; ``None``, or the exit code and one line saying why not.

    Platform calls at start are retried with backoff by the channel (each retry is
    logged); what is left when they give up is a sentence, not a traceback.
    """
    from bot.config.settings import SetupError

    try:
        await app.start_channel(name)
    except SetupError as exc:
        return EXIT_SETUP, str(exc)
    except ModuleNotFoundError as exc:
        return EXIT_SETUP, missing_sdk(name, exc)
    except Exception as exc:
        log.debug("the %s channel could not start", name, exc_info=True)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        return EXIT_UNAVAILABLE, (f"the {name} channel could not start: {detail} (gave up "
                                  "after retrying; ROOST_LOG_LEVEL=DEBUG shows the traceback)")
    return None


async def _serve(settings: Settings) -> int:
    app = await _open_app(settings)
    if app is None:
        return EXIT_SETUP
    try:
        names = app.configured_channels()
        if not names:
            _fail("no channel is configured: set a channel's credentials "
                  f"(channels available: {', '.join(app.channel_specs)}; "
                  "ROOST_CONSOLE=1 enables the console)")
            return EXIT_SETUP
        from bot.config.settings import SetupError

        stop = _stop_signal()
        try:
            # Before the channels: /healthz answers while they connect.
            await app.serve_http(names)
        except SetupError as exc:
            _fail(str(exc))
            return EXIT_SETUP
        except OSError as exc:
            _fail(f"the HTTP server cannot listen on {settings.http_host}:{settings.http_port}: "
                  f"{exc.strerror or exc}")
            return EXIT_SETUP
        for name in names:
            problem = await _start_channel(app, name)
            if problem:
                _fail(problem[1])
                return problem[0]
        await app.recover()
        log.info("roost ready: provider=%s model=%s channels=%s",
                 app.provider.name, settings.model, ",".join(names))
        warm_up = getattr(app.provider, "warm_up", None)
        if warm_up is not None:
            # Load the provider's SDK now, in a thread, not with the first message.
            app.background(warm_up(), "loading the LLM provider")
        eof = getattr(app.channels.get("console"), "eof", None)
        await _first(stop.wait(), *([eof.wait()] if isinstance(eof, asyncio.Event) else []))
        log.info("roost shutting down")
    finally:
        await app.close()
    return 0


@cli.command()
@click.option("-m", "--message", help="Send one message, print the answer, exit "
              "(exit code 1 if it failed).")
@click.option("--demo", is_flag=True, help="Use the shipped demo script (no API key needed).")
@click.option("--no-stream", is_flag=True, help="Print answers whole instead of streaming.")
@click.option("-q", "--quiet", is_flag=True, help="Hide the tool-call lines.")
@click.pass_context
def chat(ctx: click.Context, message: str | None, demo: bool, no_stream: bool,
         quiet: bool) -> None:
    """Chat with Roost in this terminal (the console channel)."""
    overrides: dict[str, Any] = {"provider": "scripted"} if demo else {}
    settings = _settings(ctx, **overrides)
    if demo:
        from plugins.providers import DEMO_SCRIPT

        settings.script = DEMO_SCRIPT
    _chat_logging(settings)
    _run_async(_chat(settings, message, stream=not no_stream, quiet=quiet))


def _chat_logging(settings: Settings) -> None:
    """Logs of a chat go to data_dir/chat.log; the terminal gets warnings as one line each.

    A failed answer is shown by the console itself, with its error ID.
    """
    _output["format"] = "text"
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"cannot open the data directory {settings.data_dir}: {exc}")
        sys.exit(EXIT_SETUP)
    root = logging.getLogger()
    if root.handlers:
        return  # an embedding application (or pytest) configured logging
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    root.setLevel(level)
    file = logging.FileHandler(settings.data_dir / "chat.log", encoding="utf-8")
    file.setFormatter(logging.Formatter(logformat.TEXT_FORMAT))
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(logging.WARNING)
    terminal.setFormatter(_OneLine())
    # The console reports failed runs itself (one line with the error ID).
    terminal.addFilter(lambda r: not (r.name == "roost.engine.runloop"
                                      and r.levelno >= logging.ERROR))
    root.addHandler(file)
    root.addHandler(terminal)
    logging.captureWarnings(True)
    for noisy in ("httpx", "httpcore", "anthropic", "openai", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _OneLine(logging.Formatter):
    """``roost: warning: <message>``: one line, the traceback left to chat.log."""

    def format(self, record: logging.LogRecord) -> str:
        message = " ".join(record.getMessage().split())
        return f"roost: {record.levelname.lower()}: {message}"


class _ChatObserver:
    """Feeds the console what runs do: tool calls, and failures stored with an ID."""

    def __init__(self, console: Any, errors: ErrorStore | None) -> None:
        self.console = console
        self.errors = errors
        self.failures = 0
        self.tracebacks: dict[str, str] = {}

    @hookimpl
    async def roost_run_event(self, event: RunEvent) -> None:
        """Show tool calls; store a failed run's error and hand its ID to the console."""
        payload = event.payload
        if event.type == "tool.call":
            self.console.tool_started(str(payload.get("id", "")), str(payload.get("name", "")),
                                      payload.get("arguments") or {})
        elif event.type == "tool.result":
            self.console.tool_finished(str(payload.get("id", "")), str(payload.get("name", "")),
                                       is_error=bool(payload.get("is_error")),
                                       result=str(payload.get("result", "")))
        elif event.type == "run.failed":
            self.failures += 1
            error_id = None
            if self.errors is not None:
                raw = {"message": str(payload.get("error", "")), "run_id": event.run_id}
                trace = self.tracebacks.pop(event.run_id, "")
                if trace:
                    raw["traceback"] = trace
                try:
                    stored = await self.errors.store(event.session_key, "run", raw)
                    error_id = stored.id
                except Exception:
                    log.exception("could not store the error of run %s", event.run_id)
            self.console.run_failed(error_id)


class _Tracebacks(logging.Handler):
    """Keeps the traceback the run loop logs for a failed run, for its stored error."""

    def __init__(self, observer: _ChatObserver) -> None:
        super().__init__(logging.ERROR)
        self.observer = observer

    def emit(self, record: logging.LogRecord) -> None:
        text = record.exc_text or ""
        if not text and record.exc_info and record.exc_info[0] is not None:
            text = logging.Formatter().formatException(record.exc_info)
        message = record.getMessage()
        if text and message.startswith("run "):
            self.observer.tracebacks[message.split()[1]] = text


async def _chat(settings: Settings, message: str | None, *, stream: bool,
                quiet: bool = False) -> int:
    from channels.console import ConsoleChannel

    app = await _open_app(settings)
    if app is None:
        return EXIT_SETUP
    console = ConsoleChannel(read_stdin=message is None, stream=stream, quiet=quiet,
                             wait_idle=app.dispatcher.drain,
                             history_file=settings.data_dir / "chat_history")
    observer = _ChatObserver(console, app.services.errors)
    app.host.register(observer, "roost.chat")
    catcher = _Tracebacks(observer)
    logging.getLogger("roost.engine.runloop").addHandler(catcher)
    try:
        if message is None:
            data = settings.data_dir
            shown = data if data.is_absolute() or str(data).startswith(".") else f"./{data}"
            click.echo(f"Roost {__version__} · {settings.model} via {app.provider.name} · "
                       f"data: {shown} · /help for commands, Ctrl-D to quit", err=True)
        await app.add_channel(console)
        if message is not None:
            await console.say(message)
            await app.dispatcher.drain()
            return 1 if observer.failures else 0
        stop = _stop_signal()
        await _first(console.eof.wait(), stop.wait())
        if not stop.is_set():
            # End of input: let answers to what was typed finish first.
            await _first(app.dispatcher.drain(), stop.wait())
        return 0
    finally:
        logging.getLogger("roost.engine.runloop").removeHandler(catcher)
        await app.close()


@cli.group()
def plugins() -> None:
    """Inspect, install and enable or disable plugins."""


def _persisted_disabled(settings: Settings) -> set[str]:
    if not settings.db_path.exists():
        return set()

    async def load() -> set[str]:
        from bot.pluginhost.state import load_disabled
        from bot.storage.sessions import SessionStore

        store = await SessionStore.open(settings.db_path)
        try:
            return await load_disabled(store.db, store.lock)
        finally:
            await store.close()

    return asyncio.run(load())


def _plugin_rows(settings: Settings, *, include_builtin: bool) -> list[dict[str, Any]]:
    from bot.pluginhost.manager import ESSENTIAL_PLUGINS, get_plugin_manager

    host = get_plugin_manager()
    host.disabled |= _persisted_disabled(settings) - ESSENTIAL_PLUGINS
    host.validate_configs(settings.plugins)
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
    rows = _plugin_rows(_settings(ctx), include_builtin=show_all)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no external plugins installed (--all lists the built-in ones)")
    for row in rows:
        state = "error" if row["error"] else ("enabled" if row["enabled"] else "disabled")
        dist = f"{row['distribution']} {row['version']}".strip()
        click.echo(f"{row['name']:<28} {dist:<16} {state:<8} {', '.join(row['hooks'])}")
        if row["error"]:
            click.echo(f"    error: {row['error']}")


def _pip(ctx: click.Context, action: str, names: tuple[str, ...]) -> None:
    import subprocess

    from bot.pluginhost.install import describe_change, pip_command, plugin_entry_points

    settings = _settings(ctx)  # puts plugins_dir on sys.path
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
    code = subprocess.call(command) if command else 0
    if code != 0:
        click.echo(f"roost: pip {action} failed (exit code {code})", err=True)
        sys.exit(code)
    click.echo(describe_change(before, plugin_entry_points()))
    click.echo("Restart Roost to apply the change.")


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

    settings = _settings(ctx)
    host = get_plugin_manager()
    if host.pm.get_plugin(name) is None:
        click.echo(f"roost: no plugin named {name!r} is loaded "
                   f"(see `roost plugins list --all`)", err=True)
        sys.exit(1)
    if not enabled and name in ESSENTIAL_PLUGINS:
        click.echo(f"roost: {name} is essential to Roost and cannot be disabled", err=True)
        sys.exit(1)

    async def save() -> None:
        store = await SessionStore.open(settings.db_path)
        try:
            await save_state(store.db, store.lock, name, enabled)
        finally:
            await store.close()

    asyncio.run(save())
    click.echo(f"{name} {'enabled' if enabled else 'disabled'}; a running Roost applies it "
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


@cli.group()
def config() -> None:
    """Inspect configuration."""


@config.command("show")
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration with secrets masked."""
    from bot.config.settings import SECRET_MASK

    settings = _settings(ctx)
    for key, value in settings.masked().items():
        if value is None:
            click.echo(f"# {key} = (unset)")
            continue
        line = f"{key} = {json.dumps(value)}"
        if SECRET_MASK in line:
            # Roost refuses the mask as a value, so a pasted-back line fails loudly.
            line += "  # masked: not the real value"
        click.echo(line)


@cli.group()
def mcp() -> None:
    """Check the MCP servers of [mcp.servers.<name>]."""


def _mcp_report(ctx: click.Context, name: str | None) -> None:
    # The plugin owns the client; imported here so other commands never load the SDK.
    from plugins.mcp.cli import list_servers, test_server

    settings = _settings(ctx)
    _setup_logging("ERROR")
    work = list_servers(settings) if name is None else test_server(settings, name)
    code, text = asyncio.run(work)
    click.echo(text)
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

    settings = _settings(ctx)
    start = parse_since(since, time.time()) if since else None

    async def show(store: ErrorStore) -> int:
        rows = await store.list(session_id=session, tool_name=tool, since=start, limit=limit)
        for e in rows:
            click.echo(f"{e.id}  {e.iso_timestamp()}  {e.tool_name:<16} {e.session_id}  "
                       f"{e.short_summary}")
        if not rows:
            click.echo("no errors match")
        return 0

    _run_async(_with_errors(settings, show))


@errors.command("show")
@click.argument("error_id")
@click.pass_context
def errors_show(ctx: click.Context, error_id: str) -> None:
    """Show one stored error in full."""
    settings = _settings(ctx)

    async def show(store: ErrorStore) -> int:
        found = await store.get(error_id)
        if found is None:
            click.echo(f"roost: no error {error_id}", err=True)
            return 1
        click.echo(json.dumps({"id": found.id, "timestamp": found.iso_timestamp(),
                               "session": found.session_id, "tool": found.tool_name,
                               "summary": found.short_summary, "error": found.raw_error},
                              indent=2, ensure_ascii=False))
        return 0

    _run_async(_with_errors(settings, show))


async def _with_errors(settings: Settings,
                       action: Callable[[ErrorStore], Awaitable[int]]) -> int:
    from bot.storage.errors import ErrorStore
    from bot.storage.sessions import SessionStore

    if not settings.db_path.exists():
        click.echo(f"roost: no database at {settings.db_path}", err=True)
        return 1
    store = await SessionStore.open(settings.db_path)
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

    if not settings.db_path.exists():
        click.echo(f"roost: no database at {settings.db_path}", err=True)
        return 1
    # WAL and the busy timeout let this write next to a running service.
    store = await SessionStore.open(settings.db_path)
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
    settings = _settings(ctx)

    async def approve(store: Any) -> int:
        request = await store.approve(code, "cli")
        if request is None:
            click.echo(f"roost: no pending request has the code {code} (wrong, expired or "
                       "already used)", err=True)
            return 1
        name = f" ({request.display_name})" if request.display_name else ""
        click.echo(f"approved {request.user}{name}")
        return 0

    _run_async(_with_access(settings, approve))


@pairing.command("list")
@click.pass_context
def pairing_list(ctx: click.Context) -> None:
    """List pending pairing codes and approved users."""
    import time

    settings = _settings(ctx)

    async def show(store: Any) -> int:
        now = time.time()
        pending, paired = await store.pending(), await store.paired()
        click.echo("pending:" if pending else "pending: none")
        for r in pending:
            click.echo(f"  {r.code}  {r.user}  {r.display_name or '-'}  expires in "
                       f"{max(0, round((r.expires_at - now) / 60))} min")
        click.echo("approved:" if paired else "approved: none")
        for u in paired:
            click.echo(f"  {u.user}  {u.display_name or '-'}  by {u.approved_by}")
        return 0

    _run_async(_with_access(settings, show))


@cli.command()
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for an answer.")
@click.pass_context
def status(ctx: click.Context, timeout: float) -> None:
    """Ask a running Roost's /readyz (ROOST_HTTP_HOST/PORT) and print the answer.

    Exit code 0: ready; 1: not ready (the failing parts are printed); 2: no answer.
    """
    import http.client

    settings = _settings(ctx)
    if not settings.http_port:
        click.echo("roost: ROOST_HTTP_PORT is not set, so Roost serves no /readyz to ask",
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
        click.echo(f"roost: cannot reach {host}:{settings.http_port} ({exc})", err=True)
        sys.exit(EXIT_SETUP)
    if response.status == 200:
        click.echo(body, nl=False)
        sys.exit(0)
    click.echo("not ready:" if response.status == 503 else f"HTTP {response.status}:")
    click.echo(body, nl=False)
    sys.exit(1)


@cli.command()
@click.option("--force", is_flag=True, help="Overwrite roost.toml and .env.example.")
def init(force: bool) -> None:
    """Write a commented roost.toml and a .env.example (one line per credential) here."""
    from bot.app import init as templates

    here = Path.cwd()
    taken = templates.existing(here)
    if taken and not force:
        click.echo(f"roost: {', '.join(p.name for p in taken)} already "
                   f"{'exists' if len(taken) == 1 else 'exist'} here; nothing written "
                   "(--force overwrites)", err=True)
        sys.exit(1)
    for path in templates.write(here):
        click.echo(f"wrote {path.name}")
    click.echo("Next:\n"
               "  cp .env.example .env   # and fill in the credentials you use\n"
               "  roost chat             # try it in this terminal (no key: roost chat --demo)")


@cli.command()
def version() -> None:
    """Print Roost's version."""
    click.echo(f"roost {__version__}")


def _load_dotenv() -> None:
    """Put ``.env`` of the working directory into the environment, below what is set.

    The settings read it themselves; this is for what reads the environment
    directly: OTEL_* for the exporter, ``${VAR}`` in MCP server tables, plugins.
    """
    path = Path(".env")
    if path.is_file():
        from dotenv import dotenv_values

        for name, value in dotenv_values(path).items():
            # NAME= (as in .env.example) means unset, not an empty credential.
            if value and name not in os.environ:
                os.environ[name] = value


def main() -> None:
    """Console-script entry point."""
    _load_dotenv()
    cli(obj={}, prog_name="roost")
