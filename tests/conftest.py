"""The project's own fixture over the shipped :mod:`bot.testing.app` harness.

``make_app`` is :func:`bot.testing.app.create_app` with this suite's conventions:
any provider (not only a scripted one), one data dir per test (a second call is a
restart of the service), and a :class:`bot.testing.app.ChatChannel` named
``test`` in which ``u1`` speaks. Helpers (``scripted``, ``settle``,
``ChatChannel``, ``EventRecorder``...) are imported from :mod:`bot.testing.app`.

It also says how the suite runs under ``pytest -n auto`` (the README's command): how
many workers, which tests start first, and that Python may cache bytecode.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import ssl
import sys
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bot.app.roost import Roost
from bot.contracts.llm import LLMProvider
from bot.testing.app import ChatChannel, EventRecorder, closing_apps, create_app
from bot.testing.mail import Dovecot
from bot.testing.postgres import PostgresCluster

if TYPE_CHECKING:
    from tests.matrix_server import Synapse

from tests import worker_forks
from tests.ordering import (
    DURATIONS,
    E2E_SECONDS,
    OTHER_SECONDS,
    SLOW_SECONDS,
    deal,
    known_durations,
)
from tests.precompile import precompile

CHANNEL = "test"
"""The name of the chat channel ``make_app`` adds."""
USER = "u1"
"""Who speaks in it unless a test says otherwise."""


def make_chat(*, stream: bool = False) -> ChatChannel:
    """The chat channel of this suite: ``test``, where ``u1`` speaks."""
    return ChatChannel(CHANNEL, sender=USER, stream=stream)


AppFactory = Callable[..., Awaitable[tuple[Roost, ChatChannel, EventRecorder]]]
"""``make_app(provider_or_None, *plugins, stream=False, **settings)``; ``None`` builds the
provider the configured way, from ``settings`` through the provider plugins."""


@pytest.fixture
async def make_app(tmp_path: Path) -> AsyncIterator[AppFactory]:
    async with closing_apps() as apps:

        async def factory(llm: LLMProvider | None, /, *plugins: object, stream: bool = False,
                          **settings: Any) -> tuple[Roost, ChatChannel, EventRecorder]:
            data_dir = settings.pop("data_dir", tmp_path / "data")
            app, log = await create_app(llm, *plugins, data_dir=data_dir, **settings)
            apps.append(app)
            channel = make_chat(stream=stream)
            await channel.attach(app, log)
            return app, channel, log

        yield factory


@pytest.fixture(scope="session")
def dovecot() -> Iterator[Dovecot]:
    """A real Dovecot IMAP server for this test session (one per xdist worker), started
    by the first test that asks (bot/testing/mail.py)."""
    server = Dovecot().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A real PostgreSQL server for this test session (one per xdist worker)."""
    cluster = PostgresCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def pg_url(postgres_cluster: PostgresCluster) -> str:
    """A fresh, empty PostgreSQL database of its own for this test."""
    return await postgres_cluster.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The storage contract's backends: an SQLite file, then a PostgreSQL database of the
    test's own with Roost's schema already applied (copied from a migrated template)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'roost.db'}"
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    if cluster not in _MIGRATED:
        # Roost's schema applied once per cluster; each test copies it (no migration).
        from bot.storage.sessions import SessionStore

        url = await cluster.create_database()
        store = await SessionStore.open(url)
        await store.close()
        _MIGRATED[cluster] = url.rsplit("/", 1)[1]
    return await cluster.create_database(template=_MIGRATED[cluster])


_MIGRATED: dict[PostgresCluster, str] = {}
"""Per cluster, the database with Roost's schema that ``database_url`` databases copy."""


# -- how the suite runs ---------------------------------------------------------------

# A container may set PYTHONDONTWRITEBYTECODE=1 (the image does): then each of the ~100
# `roost` processes the suite starts compiles Roost from source again, and each xdist
# worker rewrites every test module's asserts again. Let Python cache bytecode, as it
# does by default; this runs in the controller before the workers start, so they and
# every process they start inherit it. __pycache__ is ignored by git.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Collecting the suite imports every SDK and builds thousands of pydantic models in each
# worker; the cyclic collector would scan them again and again (collection took 6.3-7.2 s
# of CPU with it, 3.7-4.1 s without). It stays off until the tests run, which freeze what
# collection built (never scanned again) and turn it back on.
gc.disable()


class _OneCertifiContext(types.ModuleType):
    """:mod:`ssl` as aiogram's session module sees it in this suite: the certifi context it
    makes for every session is made once per process."""

    create_default_context = staticmethod(functools.cache(ssl.create_default_context))

    def __getattr__(self, name: str) -> Any:
        return getattr(ssl, name)


def one_certifi_context() -> None:
    """Make aiogram's certifi TLS context once per process: AiohttpSession makes one for
    each session, which TolerantSession replaces at once with Roost's shared client_tls(),
    and the suite makes hundreds of sessions. What a session verifies with is unchanged
    (tests/test_client_tls.py checks that an untrusted certificate is refused)."""
    import aiogram.client.session.aiohttp

    aiogram.client.session.aiohttp.ssl = _OneCertifiContext("ssl")  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Freeze what start-up and collection built, then collect garbage as usual."""
    gc.freeze()
    gc.enable()


PACKAGES = ("bot", "channels", "plugins", "roost", "workspaces", "tests", "examples")
"""The rootdir's directories of Python modules the suite imports."""


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """In the controller of an xdist run, start the process the workers fork from
    (tests/worker_forks.py), then compile the project and rewrite the test modules once
    (tests/precompile.py), before the workers start and import them all at once; in a
    process that runs tests, :func:`one_certifi_context`."""
    if not getattr(config.option, "tx", None) or hasattr(config, "workerinput"):
        one_certifi_context()  # a process that runs tests
    elif not config.getoption("collectonly"):
        worker_forks.start()
        precompile(config, PACKAGES)


def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Start each local worker as a fork of tests/worker_forks.py's forking process."""
    python = worker_forks.launcher()
    for spec in specs:
        if python and spec.popen and not spec.python:
            spec.python = python


def pytest_unconfigure(config: pytest.Config) -> None:
    """End the workers' forking process (the workers have ended)."""
    worker_forks.close()


WORKERS_PER_CPU = 2.5
"""``-n auto`` starts this many workers per CPU (rounded down): most tests wait on sockets,
timers and other processes rather than compute, so one worker per CPU leaves the CPUs idle;
a worker is a fork (tests/worker_forks.py), so one more costs little."""
MAX_WORKERS = 16
"""...but no more than this: each worker may start its own PostgreSQL server, Dovecot and
Chromium."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: :data:`WORKERS_PER_CPU` workers per usable CPU, at most :data:`MAX_WORKERS`.

    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when it is set (``None`` hands
    over to pytest-xdist's own hook, which reads it).
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return max(1, min(int(WORKERS_PER_CPU * len(os.sched_getaffinity(0))), MAX_WORKERS))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations", action="store_true",
        help="record in tests/durations.json how long each test that ran took (setup, call "
             "and teardown; a second or more), which orders the next runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spread the long tests over the xdist workers, each starting with its longest.

    A test's expected time is its time in tests/durations.json, else that of its marker
    (``e2e``: separate ``roost`` processes; ``slow``); :func:`tests.ordering.deal` puts an
    even share in each worker's first slice of the collection. Without xdist the order
    is the file order, ``e2e`` then ``slow`` first.
    """
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers <= 1:
        items.sort(key=lambda item: 0 if item.get_closest_marker("e2e")
                   else 1 if item.get_closest_marker("slow") else 2)
        return
    known = known_durations()

    def seconds(item: pytest.Item) -> float:
        if item.nodeid in known:
            return known[item.nodeid]
        return E2E_SECONDS if item.get_closest_marker("e2e") else \
            SLOW_SECONDS if item.get_closest_marker("slow") else OTHER_SECONDS

    def shared(item: pytest.Item) -> str | None:
        # The browser tests share one Chromium and one `roost run` per worker.
        # The Matrix tests share one Synapse (tests/matrix_server.py) per worker.
        if item.nodeid.startswith("tests/test_matrix"):
            return "matrix"
        return "browser" if item.nodeid.startswith("tests/browser/") else None

    items[:] = deal(items, seconds, workers, group=shared)


_durations: dict[str, float] = {}
"""Per test id, the seconds its reports took (``--store-durations``, in the controller)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End the forking processes (tests/cli_forks.py, tests/roost_forks.py,
    tests/mcp_forks.py) that ran; update tests/durations.json with the tests this run ran
    (``--store-durations``)."""
    for forks in ("tests.cli_forks", "tests.roost_forks", "tests.mcp_forks"):
        if forks in sys.modules:
            sys.modules[forks].close()
    config = session.config
    if not config.getoption("store_durations") or hasattr(config, "workerinput"):
        return
    known = known_durations()
    for nodeid, seconds in _durations.items():
        known.pop(nodeid, None)
        if seconds >= 1.0:
            known[nodeid] = round(seconds, 1)
    DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n",
                         encoding="utf-8")


_STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say where the browser tests (tests/browser) left this run's logs (and screenshots)."""
    from tests.browser import ARTIFACTS

    if ARTIFACTS.is_dir() and any(p.stat().st_mtime >= _STARTED for p in ARTIFACTS.iterdir()):
        terminalreporter.write_line(f"Control UI roost logs (and screenshots): {ARTIFACTS}")


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """One real Synapse homeserver for the session's Matrix tests (tests/matrix_server.py)."""
    from tests.matrix_server import start

    server = start(tmp_path_factory.mktemp("synapse"))
    try:
        yield server
    finally:
        server.stop()
