"""``roost chat``: the console channel in this terminal."""

from __future__ import annotations

import asyncio
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


from bot.app.cli.base import (
    EXIT_SETUP,
    cli,
    cli_settings,
    echo,
    fail,
    log,
    output_options,
    run_and_exit,
)
from bot.app.cli.serve import first_done, open_app, stop_signal


@cli.command()
@click.option("-m", "--message", help="Send one message, print the answer, exit "
              "(exit code 1 if it failed).")
@click.option("--demo", is_flag=True, help="Use the shipped demo script (no API key needed).")
@click.option("--no-stream", is_flag=True, help="Print answers whole instead of streaming.")
@click.option("-q", "--quiet", is_flag=True, help="Hide the tool-call lines.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="With -m: give up (exit code 1) when no answer came "
              "within this many seconds, or at once when the AI service is not answering.")
@click.pass_context
def chat(ctx: click.Context, message: str | None, demo: bool, no_stream: bool,
         quiet: bool, timeout: float) -> None:
    """Chat with Roost in this terminal (the console channel)."""
    overrides: dict[str, Any] = {}
    if demo:
        from plugins.providers import DEMO_SCRIPT

        overrides = {"provider": "scripted", "script": DEMO_SCRIPT}
    settings = cli_settings(ctx, **overrides)
    _chat_logging(settings, one_shot=message is not None)
    run_and_exit(_chat(settings, message, stream=not no_stream, quiet=quiet,
                     give_up_after=timeout))


def _chat_logging(settings: Settings, *, one_shot: bool = False) -> None:
    """Logs of a chat go to data_dir/chat.log; the terminal gets warnings as one line each.

    A failed answer is shown by the console itself, with its error ID; under ``-m``
    (``one_shot``) the circuit breaker's warnings stay in chat.log too, as the line
    giving up names the reason.
    """
    output_options["format"] = "text"
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot open the data directory {settings.data_dir}: {exc}")
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
    if one_shot:
        terminal.addFilter(lambda r: r.name != "roost.resilience.breaker")
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
    """Feeds the console what runs do: tool calls, and failures stored with an ID.

    It also notes when a run is held because the AI service is not answering
    (:attr:`held`, with the last error), which ends a one-shot ``-m``.
    """

    def __init__(self, console: Any, errors: ErrorStore | None) -> None:
        self.console = console
        self.errors = errors
        self.failures = 0
        self.tracebacks: dict[str, str] = {}
        self.held = asyncio.Event()
        self.last_error = ""

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
        elif event.type == "run.retrying":
            self.last_error = " ".join(str(payload.get("error") or "").split())
            if payload.get("attempt") == 0:  # held by the provider's circuit breaker
                self.held.set()
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
                quiet: bool = False, give_up_after: float = 30.0) -> int:
    from channels.console import ConsoleChannel

    app = await open_app(settings)
    if app is None:
        return EXIT_SETUP
    kind = ConsoleChannel if message is None else _one_shot_console()
    console = kind(read_stdin=message is None, stream=stream, quiet=quiet,
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
            # The scripted provider (--demo) plays a script: no model is asked.
            model = ("demo script, no model" if settings.provider == "scripted"
                     else f"{settings.model} via {app.provider.name}")
            echo(f"Roost {__version__} · {model} · data: {shown} · /help for commands, "
                 "Ctrl-D to quit", err=True)
        await app.add_channel(console)
        if message is not None:
            await console.say(message)
            return await _answered(app, observer, give_up_after)
        stop = stop_signal(app.settings)
        await first_done(console.eof.wait(), stop.wait())
        if not stop.is_set():
            # End of input: let answers to what was typed finish first.
            await first_done(app.dispatcher.drain(), stop.wait())
        return 0
    finally:
        logging.getLogger("roost.engine.runloop").removeHandler(catcher)
        await app.close()


def _one_shot_console() -> Any:
    """The console of ``-m``, which never promises an answer later: it gives up instead."""
    from bot.contracts.messages import OutboundMessage
    from bot.dispatch.delivery import HELD_NOTICE
    from channels.console import ConsoleChannel

    class OneShotConsole(ConsoleChannel):
        async def send(self, message: OutboundMessage) -> None:
            if message.text != HELD_NOTICE:
                await super().send(message)

    return OneShotConsole


async def _answered(app: Any, observer: _ChatObserver, limit: float) -> int:
    """Wait for the answer of ``-m``: 0 when it came, 1 (after one line) when it did not.

    It does not come when the run fails, when the AI service is not answering (the run
    is held until it is back) or when ``limit`` seconds pass first; the run is then
    cancelled and its message not kept for later.
    """
    try:
        async with asyncio.timeout(limit):
            await first_done(app.dispatcher.drain(), observer.held.wait())
    except TimeoutError:
        reason = f"no answer within {limit:g} s"
    else:
        if not observer.held.is_set():
            return 1 if observer.failures else 0
        reason = "the AI service is not answering"
    # Told it gave up, the user does not get this answer at the next start either.
    app.dispatcher.registry.abort_all("gave up")
    await app.dispatcher.drain()
    detail = f" ({observer.last_error})" if observer.last_error else ""
    fail(f"{reason}{detail}; gave up (details in {app.settings.data_dir / 'chat.log'})")
    return 1
