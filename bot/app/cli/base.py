"""The ``roost`` command group, its shared helpers, ``version`` and the entry point."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bot import __version__
from bot.config.settings import ConfigError, Settings, load_settings
from bot.observability import logformat, redact

if TYPE_CHECKING:
    pass

log = logging.getLogger("roost")
T = TypeVar("T")

EXIT_SETUP = 2

output_options = {"format": "text"}
"""How one-line errors are written: ``text`` (``roost: ...``) or ``json`` (a log record)."""


def setup_logging(level: str, *, quiet: bool = False, fmt: str = "text") -> None:
    output_options["format"] = fmt
    logformat.configure("WARNING" if quiet else level, fmt=fmt)
    # Library chatter (HTTP requests) would drown Roost's own lines.
    for noisy in ("httpx", "httpcore", "anthropic", "openai", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` (``err``: to stderr) with every secret masked.

    Every command prints through this: configured secrets and credentials inside
    URLs are masked by :func:`bot.observability.redact.redact`, the masking of log
    records and ``roost config show``.
    """
    click.echo(redact.redact(text), err=err, nl=nl)


def fail(message: str) -> None:
    """Say why Roost cannot go on: one line on stderr (one JSON record under json logs)."""
    if output_options["format"] == "json":
        log.error("%s", message)
    else:
        echo(f"roost: {message}", err=True)


class _Held(logging.Handler):
    """Keeps the records of loading the settings until their log format is known."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def cli_settings(ctx: click.Context, **overrides: Any) -> Settings:
    held = _Held()
    config_log = logging.getLogger("roost.config")  # deprecated setting names
    config_log.addHandler(held)
    config_log.propagate = False
    try:
        settings = load_settings(ctx.obj.get("config"), **overrides)
    except ConfigError as exc:
        _say(held.records, "text")
        echo(f"roost: {exc}", err=True)
        sys.exit(EXIT_SETUP)
    finally:
        config_log.removeHandler(held)
        config_log.propagate = True
    # Before anything can log: no configured secret reaches any log line.
    redact.install(redact.secrets_of(settings))
    _say(held.records, settings.log_format)
    if settings.plugins_dir is not None:
        from bot.app.plugins_dir import use_plugins_dir

        use_plugins_dir(settings.plugins_dir)
    return settings


def _say(records: list[logging.LogRecord], fmt: str) -> None:
    """Write ``records`` to stderr as the configured log format would."""
    formatter = logformat.JsonFormatter() if fmt == "json" else logformat.TextFormatter()
    for record in records:
        echo(formatter.format(record), err=True)


def run_command(coro: Coroutine[Any, Any, T], what: str = "") -> T:
    """``asyncio.run(coro)``; a failure is one line saying ``what`` failed and exit code 1.

    ``ROOST_LOG_LEVEL=DEBUG`` prints the traceback too (masked, like every output).
    """
    try:
        return asyncio.run(coro)
    except click.ClickException:
        raise
    except Exception as exc:
        if os.environ.get("ROOST_LOG_LEVEL", "").upper() == "DEBUG":
            echo("".join(traceback.format_exception(exc)).rstrip("\n"), err=True)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        fail(f"{what}: {detail}" if what else detail)
        sys.exit(1)


def run_and_exit(coro: Coroutine[Any, Any, int], what: str = "") -> None:
    sys.exit(run_command(coro, what))


def database_of(settings: Settings) -> str:
    """How to name the database of ``settings`` in a line (its URL is masked on output)."""
    return f"the database {settings.database_url or settings.db_path}"


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
def version() -> None:
    """Print Roost's version."""
    echo(f"roost {__version__}")


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
    # fast_exit: `roost run` ends the process without tearing the interpreter down.
    cli(obj={"fast_exit": True}, prog_name="roost")
