"""``roost run``: start every configured channel and serve until stopped."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import click

from bot.config.settings import Settings

if TYPE_CHECKING:
    from bot.app.roost import Roost


from bot.app.cli.base import (
    EXIT_SETUP,
    cli,
    cli_settings,
    database_of,
    fail,
    log,
    run_and_exit,
    setup_logging,
)


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Start every channel whose credentials are set; Ctrl-C or SIGTERM stops cleanly."""
    settings = cli_settings(ctx)
    setup_logging(settings.log_level, fmt=settings.log_format)
    _raise_open_files()
    # Start-up imports the SDKs and builds thousands of long-lived objects (pydantic
    # models, plugin tables): the cyclic collector would scan them over and over for
    # nothing. It stays off until the service is ready, which then freezes them (never
    # scanned again), and on again if start-up fails.
    gc.disable()
    try:
        if not ctx.obj.get("fast_exit"):
            run_and_exit(_serve(settings))
        code = asyncio.run(_serve(settings))
    finally:
        gc.enable()
    # Everything is closed and flushed: what is left is the interpreter tearing
    # down its modules, which took seconds on a loaded machine (tens of thousands
    # of objects of the SDKs' models). Only the process's own entry point ends so;
    # in-process callers (tests) get the usual SystemExit.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _raise_open_files() -> None:
    """Raise the open-file soft limit to the hard one and say how many files Roost may open."""
    from bot.resilience.listener import raise_open_files

    before, after = raise_open_files()
    if after > before:
        log.info("open files: up to %d (soft limit raised from %d)", after, before)
    else:
        log.info("open files: up to %d", after)


async def open_app(settings: Settings) -> Roost | None:
    """The app, or ``None`` after saying exactly what to set for the provider."""
    from bot.app.offers import resolve_provider
    from bot.app.roost import Roost
    from bot.config.settings import SetupError
    from bot.pluginhost.manager import get_plugin_manager

    host = get_plugin_manager()
    try:
        await resolve_provider(settings, host)
    except SetupError as exc:
        fail(str(exc))
        return None
    try:
        return await Roost.create(settings, host=host)
    except SetupError as exc:  # e.g. a built-in plugin's bad [plugins.<name>] value
        fail(str(exc))
        return None
    except (OSError, sqlite3.Error) as exc:
        # A data directory that cannot be created or a database that cannot be opened.
        log.debug("opening the app failed", exc_info=True)
        where = (f"cannot open {database_of(settings)}" if settings.database_url
                 else f"cannot open the data directory {settings.data_dir}")
        fail(f"{where}: {exc}")
        return None
    except Exception as exc:
        log.debug("opening the app failed", exc_info=True)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        fail(f"cannot start: {detail} (ROOST_LOG_LEVEL=DEBUG shows the traceback)")
        return None


def stop_signal(settings: Settings) -> asyncio.Event:
    """An event set by Ctrl-C or SIGTERM; SIGUSR2 writes a memory snapshot meanwhile."""
    from bot.observability.memory import dump_snapshot

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR2, dump_snapshot, settings.data_dir)
    return stop


async def first_done(*awaitables: Awaitable[Any]) -> None:
    """Wait until one of ``awaitables`` is done; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


PLATFORM_MODULES = {"aiogram": "aiogram", "discord": "discord.py", "slack_bolt": "slack-bolt",
                    "slack_sdk": "slack-sdk",
                    "aioimaplib": "aioimaplib", "aiosmtplib": "aiosmtplib",
                    "nio": "matrix-nio", "markdown_it": "markdown-it-py"}
"""The platform SDKs' top-level modules and the distributions that install them."""


def missing_sdk(channel: str, exc: ModuleNotFoundError) -> str:
    """What to install when channel ``channel`` could not import ``exc.name``."""
    module = (exc.name or "").partition(".")[0] or "a module"
    package = PLATFORM_MODULES.get(module, module)
    if channel in ("telegram", "discord", "slack", "whatsapp", "email", "matrix"):
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


async def _loaded(warming: Awaitable[Any], name: str) -> None:
    """Await ``warming`` (the provider's SDK loading) and say when it is done."""
    began = time.perf_counter()
    await warming
    log.info("LLM provider %s loaded in %.2fs", name, time.perf_counter() - began)


async def _serve(settings: Settings) -> int:
    app = await open_app(settings)
    if app is None:
        return EXIT_SETUP
    try:
        names = app.configured_channels()
        if not names:
            fail("no channel is configured: set a channel's credentials "
                  f"(channels available: {', '.join(app.channel_specs)}; "
                  "ROOST_CONSOLE=1 enables the console)")
            return EXIT_SETUP
        from bot.config.settings import SetupError

        stop = stop_signal(settings)
        try:
            # Before the channels: /healthz answers while they connect.
            await app.serve_http(names)
        except SetupError as exc:
            fail(str(exc))
            return EXIT_SETUP
        except OSError as exc:
            fail(f"the HTTP server cannot listen on {settings.http_host}:{settings.http_port}: "
                  f"{exc.strerror or exc}")
            return EXIT_SETUP
        for name in names:
            problem = await _start_channel(app, name)
            if problem:
                fail(problem[1])
                return problem[0]
        await app.recover()
        gc.freeze()
        gc.enable()
        log.info("roost ready: provider=%s model=%s channels=%s",
                 app.provider.name, settings.model, ",".join(names))
        warm_up = getattr(app.provider, "warm_up", None)
        if warm_up is not None:
            # Load the provider's SDK now, in a thread, not with the first message.
            app.background(_loaded(warm_up(), app.provider.name), "loading the LLM provider")
        eof = getattr(app.channels.get("console"), "eof", None)
        await first_done(stop.wait(), *([eof.wait()] if isinstance(eof, asyncio.Event) else []))
        log.info("roost shutting down")
    finally:
        await app.close()
    return 0
