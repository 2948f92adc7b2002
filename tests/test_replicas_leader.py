"""Replicas on one PostgreSQL database elect one leader (bot/storage/leader.py): only it
long-polls Telegram; when it dies (kill -9) another takes over within the lease. Webhook
mode without an explicit secret is refused on PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from bot.app.roost import Roost, shared_secret_missing
from bot.config.settings import Settings, SetupError
from bot.contracts.channel import ChannelContext
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.storage.leader import Leader, check_period, replica_id
from bot.testing.app import create_app, scripted
from bot.testing.slack import FakeSlack
from bot.testing.telegram import BOB, FakeTelegram
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env

SCRIPT = "turns:\n  - reply: 'hello from roost'\nloop: true\n"


@pytest.fixture
async def leaders(pg_url: str) -> AsyncIterator[list[Leader]]:
    made: list[Leader] = []
    try:
        yield made
    finally:
        for leader in made:
            await leader.close()


def _contender(url: str, made: list[Leader]) -> Leader:
    leader = Leader(url, check_every=0.2)
    made.append(leader)
    leader.start()
    return leader


async def _backend_of_lock(url: str) -> int:
    """The server pid of the session holding the leader lock."""
    conn = await asyncpg.connect(url)
    try:
        while True:
            pid = await conn.fetchval("SELECT pid FROM pg_locks WHERE locktype = 'advisory'"
                                      " AND granted")
            if pid is not None:
                return int(pid)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_on_sqlite_the_one_process_always_leads() -> None:
    leader = Leader(None)
    leader.start()
    await asyncio.wait_for(leader.wait_leading(), 1)
    assert leader.is_leader
    await leader.close()


async def test_one_of_two_replicas_leads_and_the_other_takes_over_when_its_connection_drops(
        pg_url: str, leaders: list[Leader]) -> None:
    first = _contender(pg_url, leaders)
    await asyncio.wait_for(first.wait_leading(), 10)
    second = _contender(pg_url, leaders)
    # The second tries the lock every 0.2 s and is refused while the first holds it.
    holder = await _backend_of_lock(pg_url)
    assert first.is_leader and not second.is_leader
    # The leader's connection ends (as when its process is killed): the server releases
    # the lock, the first notices at its next ping, the second takes the lock.
    admin = await asyncpg.connect(pg_url)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", holder)
    finally:
        await admin.close()
    await asyncio.wait_for(first.wait_lost(), 10)
    await asyncio.wait_for(second.wait_leading(), 10)
    assert second.is_leader
    # The first contends again and stays a follower while the second leads.
    assert await _backend_of_lock(pg_url) != holder
    assert not first.is_leader


async def test_a_closed_leader_releases_the_lock_at_once(
        pg_url: str, leaders: list[Leader]) -> None:
    first = _contender(pg_url, leaders)
    await asyncio.wait_for(first.wait_leading(), 10)
    second = _contender(pg_url, leaders)
    await first.close()
    assert not first.is_leader
    await asyncio.wait_for(second.wait_leading(), 10)


def test_replica_ids_are_unique_and_name_the_process() -> None:
    a, b = replica_id(), replica_id()
    assert a != b and f"-{os.getpid()}-" in a
    assert check_period(30) == 5.0 and check_period(3) == pytest.approx(0.6)


# -- roost run ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_roost_run_replicas_long_poll_on_the_leader_only_and_fail_over_after_kill_9(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    (tmp_path / "script.yaml").write_text(SCRIPT)
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
        ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
        ROOST_DATABASE_URL=pg_url, ROOST_LEASE_SECONDS="3",
        TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url)
    first = await start_roost(tmp_path / "a", env)
    second: RoostProcess | None = None
    try:
        await until_logged(first, b"this replica leads: long polling")
        second = await start_roost(tmp_path / "b", env)
        await until_logged(second, b"another replica polls")
        await until_logged(second, b"roost ready")

        fake_telegram.private_message("hi")
        (sent,) = await fake_telegram.wait_for("sendMessage", limit=30)
        assert sent.params["text"] == "hello from roost"

        # Two pollers would end each other's long polls (409 Conflict): only the leader polls.
        assert all(c.status != 409 for c in fake_telegram.calls_of("getUpdates"))
        first.kill()  # kill -9: no goodbye; its connection drops and the lock with it
        await first.wait()
        await until_logged(second, b"this replica leads: long polling")
        # Another chat: the first chat's session may still be leased to the dead replica
        # for up to the lease (bot.dispatch.replicas), which is not what this test is about.
        fake_telegram.private_message("still there?", sender=BOB)
        await fake_telegram.wait_for("sendMessage", 2, limit=30)
        assert [c.params["text"] for c in fake_telegram.sent("sendMessage")] == [
            "hello from roost", "hello from roost"]
        assert all(c.status != 409 for c in fake_telegram.calls_of("getUpdates"))
        second.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await second.wait() == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert not (tmp_path / "a" / "data" / "roost.db").exists()


@pytest.mark.e2e
async def test_roost_run_refuses_telegram_webhooks_on_postgresql_without_a_secret(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_DATABASE_URL=pg_url,
        TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url,
        ROOST_TELEGRAM_WEBHOOK_URL="https://bot.example.com/telegram")
    proc = await start_roost(tmp_path, env)
    assert proc.stderr is not None
    async with asyncio.timeout(60):
        err = (await proc.stderr.read()).decode()
        assert await proc.wait() == 2
    assert "Traceback" not in err
    assert "ROOST_TELEGRAM_WEBHOOK_SECRET" in err
    assert fake_telegram.calls_of("setWebhook") == []


# -- Slack Socket Mode ------------------------------------------------------------------------


class Lead:
    """A leadership the test hands over and takes back."""

    def __init__(self) -> None:
        self.leading = asyncio.Event()
        self.following = asyncio.Event()
        self.following.set()

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    def set(self, leading: bool) -> None:
        (self.leading if leading else self.following).set()
        (self.following if leading else self.leading).clear()

    async def wait_leading(self) -> None:
        await self.leading.wait()

    async def wait_lost(self) -> None:
        await self.following.wait()


async def test_slack_socket_mode_connects_only_while_this_replica_leads(
        fake_slack: FakeSlack) -> None:
    received: list[InboundMessage] = []

    async def handler(message: InboundMessage) -> None:
        received.append(message)

    channel = SlackChannel(Settings(**fake_slack.settings(socket_mode=True)), host="127.0.0.1")
    lead = Lead()
    await channel.begin(handler, ChannelContext(leadership=lead))
    try:
        # A follower can send but holds no Socket Mode connection.
        assert channel.health().ready and "standby" in channel.health().detail
        await channel.send(OutboundMessage(channel="slack", chat_id="D1", text="from a follower"))
        assert fake_slack.socket_connections == 0
        lead.set(True)
        await fake_slack.wait_for_socket()
        await fake_slack.socket_event(fake_slack.direct_message("hello leader"))
        await fake_slack.wait_until(lambda: bool(received), what="the message delivered")
        assert [m.text for m in received] == ["hello leader"]
        lead.set(False)  # leadership lost: the connection is closed
        await fake_slack.wait_until(lambda: all(ws.closed for ws in fake_slack.sockets),
                                    what="the socket closed")
        assert fake_slack.socket_connections == 1
    finally:
        await channel.stop()


def test_webhook_modes_on_postgresql_need_explicit_secrets_and_sqlite_does_not() -> None:
    pg = "postgresql://roost@127.0.0.1:5432/roost"
    telegram = {"telegram_webhook_url": "https://bot.example.com/telegram"}
    with pytest.raises(SetupError, match="ROOST_TELEGRAM_WEBHOOK_SECRET"):
        shared_secret_missing(Settings(database_url=pg, **telegram), "telegram")
    shared_secret_missing(Settings(database_url=pg, telegram_webhook_secret="s", **telegram),
                          "telegram")
    shared_secret_missing(Settings(database_url=pg), "telegram")  # long polling: no secret
    shared_secret_missing(Settings(**telegram), "telegram")  # SQLite: one process
    with pytest.raises(SetupError, match="SLACK_SIGNING_SECRET"):
        shared_secret_missing(Settings(database_url=pg, slack_bot_token="x"), "slack")
    shared_secret_missing(Settings(database_url=pg, slack_bot_token="x", slack_app_token="y"),
                          "slack")  # Socket Mode: the leader connects, no signing secret


# -- Telegram long polling ----------------------------------------------------------------------


class Logged(logging.Handler):
    """Counts log records containing ``text``; :meth:`wait` for the ``n``-th."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.count = 0
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.count += 1
            self.changed.set()

    async def wait(self, n: int) -> None:
        async with asyncio.timeout(10):  # a hang guard
            while self.count < n:
                self.changed.clear()
                await self.changed.wait()


async def test_telegram_long_polls_only_while_leading_and_again_after_regaining_it(
        tmp_path: Path, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="roost.channels.telegram")
    standby = Logged("another replica polls")
    logging.getLogger("roost.channels.telegram").addHandler(standby)
    received: list[str] = []
    arrived = asyncio.Event()

    async def handler(message: InboundMessage) -> None:
        received.append(message.text)
        arrived.set()

    config = Settings(data_dir=tmp_path, telegram_bot_token=fake_telegram.token,
                      telegram_api_base=fake_telegram.base_url)
    channel = TelegramChannel(config, polling_timeout=1, poll_backoff=0.01)
    lead = Lead()
    await channel.begin(handler, ChannelContext(leadership=lead))
    try:
        await standby.wait(1)
        assert channel.health().ready and "standby" in channel.health().detail
        assert fake_telegram.calls_of("getUpdates") == []
        lead.set(True)
        fake_telegram.private_message("one")
        await asyncio.wait_for(arrived.wait(), 10)
        lead.set(False)  # lost: the long poll in flight is cut, the channel waits
        await standby.wait(2)
        assert "standby" in channel.health().detail
        polls = len(fake_telegram.calls_of("getUpdates"))
        fake_telegram.private_message("two")  # kept by Telegram for the next leader
        lead.set(True)
        await fake_telegram.wait_until(lambda: len(received) == 2)
        assert received == ["one", "two"]
        assert len(fake_telegram.calls_of("getUpdates")) > polls
        assert all(c.status != 409 for c in fake_telegram.calls_of("getUpdates"))
    finally:
        logging.getLogger("roost.channels.telegram").removeHandler(standby)
        await channel.stop()


async def test_a_replica_that_fails_to_start_leaves_no_task_heartbeat_or_connection(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def connection_lost(self: Roost, *, jobs: bool = True) -> None:
        raise ConnectionResetError("the connection to the database was lost")

    # Late in start-up: the leader election runs, the control connection listens and the
    # replica's heartbeat is written by then.
    monkeypatch.setattr(Roost, "refresh_plugins", connection_lost)
    before = asyncio.all_tasks()
    with pytest.raises(ConnectionResetError):
        await create_app(scripted({"reply": "never"}), data_dir=tmp_path, database_url=pg_url)
    assert {t for t in asyncio.all_tasks() - before if not t.done()} == set()
    db = await asyncpg.connect(pg_url)
    try:
        assert await db.fetchval("SELECT count(*) FROM replicas") == 0
        # A closed connection's server process ends a moment after the client let go.
        others = -1
        for _ in range(100):
            others = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()")
            if others == 0:
                break
            await asyncio.sleep(0.05)
        assert others == 0
    finally:
        await db.close()
