"""``roost chat``: the console channel in this terminal."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from bot import __version__
from bot.config.settings import Settings
from bot.contracts.hookspecs import hookimpl
from bot.observability import logformat

if TYPE_CHECKING:
    from bot.contracts.events import RunEvent
    from bot.storage.errors import ErrorStore


from bot.app.cli.base import EXIT_SETUP, _fail, _output, _run_async, _settings, cli, log
from bot.app.cli.serve import _first, _open_app, _stop_signal


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
    overrides: dict[str, Any] = {}
    if demo:
        from plugins.providers import DEMO_SCRIPT

        overrides = {"provider": "scripted", "script": DEMO_SCRIPT}
    settings = _settings(ctx, **overrides)
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
        stop = _stop_signal(app.settings)
        await _first(console.eof.wait(), stop.wait())
        if not stop.is_set():
            # End of input: let answers to what was typed finish first.
            await _first(app.dispatcher.drain(), stop.wait())
        return 0
    finally:
        logging.getLogger("roost.engine.runloop").removeHandler(catcher)
        await app.close()
