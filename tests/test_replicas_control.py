"""Two Roost apps on one PostgreSQL database (replicas in one test process): /stop on one
cancels the run on the other (NOTIFY roost_control), cache invalidations reach the other
(NOTIFY roost_invalidate), and a system job (heartbeat) fires once per deployment."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.jobs import JobSpec
from bot.contracts.runtime import Runtime
from bot.testing.app import ChatChannel, EventRecorder, create_app, scripted
from bot.testing.telegram import FakeTelegram
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env
from tests.test_run_all_channels import free_port

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

Pair = list[tuple[Roost, ChatChannel, EventRecorder]]


class Beats:
    """A system job like the heartbeat: counts its runs across both apps."""

    def __init__(self) -> None:
        self.runs = 0
        self.ran = asyncio.Event()

    @hookimpl
    def roost_scheduled_jobs(self) -> JobSpec:
        async def beat(_app: Runtime) -> None:
            self.runs += 1
            self.ran.set()
        return JobSpec("beat", "every 1m", beat)


@pytest.fixture
async def beats() -> Beats:
    return Beats()


@pytest.fixture
async def pair(pg_url: str, tmp_path: Path, beats: Beats) -> AsyncIterator[Pair]:
    made: Pair = []
    try:
        for name in ("a", "b"):
            app, log = await create_app(scripted({"reply": "too late", "delay": 30}),
                                        (f"beats-{name}", beats), data_dir=tmp_path / name,
                                        database_url=pg_url, clock=lambda: NOW,
                                        admins=["test:u1"])
            channel = ChatChannel("test", sender="u1")
            await channel.attach(app, log)
            made.append((app, channel, log))
        yield made
    finally:
        for app, _, _ in made:
            await app.close()


def _told(app: Roost) -> asyncio.Event:
    """An event set once ``app`` has handled another replica's invalidation."""
    assert app.control is not None
    seen = asyncio.Event()
    original: Callable[[str, str], Awaitable[None]] = app.control.on_invalidate

    async def wrapped(what: str, name: str) -> None:
        await original(what, name)
        seen.set()

    app.control.on_invalidate = wrapped
    return seen


async def test_stop_sent_to_one_replica_cancels_the_run_on_the_other(pair: Pair) -> None:
    (a, chat_a, log_a), (_b, chat_b, _) = pair
    await chat_a.say("think hard")
    await log_a.wait_for("activity")
    assert a.dispatcher.running_count("default:test:direct:u1") == 1
    await chat_b.say("/stop")
    await chat_b.settle()
    assert chat_b.replies == ["Stopped."]
    await log_a.wait_for("run.cancelled")
    await chat_a.settle()
    assert chat_a.replies == []  # the cancelled run says nothing more


async def test_stop_with_nothing_running_anywhere_says_so(pair: Pair) -> None:
    _, (_b, chat_b, _) = pair[0], pair[1]
    await chat_b.say("/stop")
    await chat_b.settle()
    assert chat_b.replies == ["Nothing is running."]


async def test_stop_for_a_session_whose_lease_holder_died_answers_nothing_is_running(
        pair: Pair) -> None:
    (a, _, _), _ = pair
    assert a.control is not None
    # A lease of a replica that died holding it (not expired yet): nobody answers for it.
    await a.store.db.execute(
        "INSERT INTO session_leases (session_key, owner, expires_at) VALUES (?, ?, ?)",
        ("default:test:direct:u1", "ghost-1-abc", a.control.clock() + 60))
    assert await a.control.stop_elsewhere("stop", "default:test:direct:u1", wait=0.2) == (0, 0)


async def test_malformed_control_notifications_are_ignored(pair: Pair) -> None:
    (_a, chat_a, log_a), (b, _, _) = pair
    for junk in ("not json", "[1, 2]", '{"kind": "request", "target": "*"}'):
        await b.store.db.execute("SELECT pg_notify(?, ?)", ("roost_control", junk))
    await chat_a.say("think hard")
    await log_a.wait_for("activity")
    assert b.control is not None
    assert await b.control.stop_elsewhere("stop", "default:test:direct:u1") == (1, 0)


async def test_stopall_sent_to_one_replica_counts_the_other_replicas_runs(pair: Pair) -> None:
    (_a, chat_a, log_a), (_b, chat_b, _) = pair
    await chat_a.say("think hard")
    await log_a.wait_for("activity")
    await chat_b.say("/stopall")
    await chat_b.settle()
    assert chat_b.replies == ["Stopped 1 run(s) and dropped 0 queued message(s)."]


async def test_a_plugin_disabled_on_one_replica_is_disabled_on_the_other(pair: Pair) -> None:
    (a, _, _), (b, _, _) = pair
    told = _told(b)
    name = "plugins.file_tools"
    assert name not in b.host.disabled and "read_file" in b.engine.plugins.tools
    assert await a.runtime.set_plugin_enabled(name, False) == f"{name} is now disabled."
    await asyncio.wait_for(told.wait(), 10)
    assert name in b.host.disabled
    assert "read_file" not in b.engine.plugins.tools
    assert set(b.engine.plugins.tools) == set(a.engine.plugins.tools)


async def test_a_revoked_pairing_is_forgotten_by_the_other_replicas_cache(pair: Pair) -> None:
    (a, _, _), (b, _, _) = pair
    access_b: Any = b.services.access
    access_b._paired.add(("telegram", "42"))  # approved earlier, cached by B
    told = _told(b)
    await a.runtime.invalidate_everywhere("pairing")
    await asyncio.wait_for(told.wait(), 10)
    assert not await access_b.is_paired("telegram", "42")


async def test_an_agent_reloaded_on_one_replica_is_resolved_again_on_the_other(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    (_a, chat_a, _), (b, _, _) = pair
    forgotten: list[str | None] = []
    original = b.router.invalidate

    def spy(name: str | None = None) -> bool:
        forgotten.append(name)
        return original(name)

    monkeypatch.setattr(b.router, "invalidate", spy)
    told = _told(b)
    await chat_a.say("/agent reload default")
    await chat_a.settle()
    assert chat_a.replies[0].startswith("Reloaded agent default")
    await asyncio.wait_for(told.wait(), 10)
    assert forgotten == ["default"]


async def test_a_system_job_fires_once_per_deployment_not_once_per_replica(
        pair: Pair, beats: Beats) -> None:
    (a, _, _), (b, _, _) = pair
    scheduler_a, scheduler_b = a.services.scheduler, b.services.scheduler
    assert scheduler_a is not None and scheduler_b is not None
    later = NOW + timedelta(minutes=1, seconds=1)
    fired = await asyncio.gather(scheduler_a.run_due(later), scheduler_b.run_due(later))
    assert sorted(len(f) for f in fired) == [0, 1]  # the fire time claimed once
    await asyncio.wait_for(beats.ran.wait(), 10)
    await asyncio.gather(scheduler_a.wait_idle(), scheduler_b.wait_idle())
    assert beats.runs == 1


# -- roost run ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_stop_sent_to_one_roost_run_replica_cancels_the_run_on_the_other(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    (tmp_path / "script.yaml").write_text("turns:\n  - reply: 'too late'\n    delay: 60\n"
                                          "loop: true\n")
    ports = {name: free_port() for name in ("a", "b")}
    base = dict(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
                ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
                ROOST_DATABASE_URL=pg_url, ROOST_TELEGRAM_WEBHOOK_SECRET="s3cret",
                TELEGRAM_BOT_TOKEN=fake_telegram.token,
                TELEGRAM_API_BASE=fake_telegram.base_url)
    url = {name: f"http://127.0.0.1:{port}/telegram" for name, port in ports.items()}
    procs: dict[str, RoostProcess] = {}
    try:
        for name in ("a", "b"):
            procs[name] = await start_roost(tmp_path / name, clean_env(
                **base, ROOST_TELEGRAM_WEBHOOK_URL=url[name],
                ROOST_TELEGRAM_WEBHOOK_PORT=str(ports[name])))
            await until_logged(procs[name], b"roost ready")
        hook = fake_telegram.webhook
        assert hook is not None and hook.secret == "s3cret"

        fake_telegram.webhook = dataclasses.replace(hook, url=url["a"])  # to replica A
        fake_telegram.private_message("think hard")
        await fake_telegram.wait_for("sendChatAction", limit=30)  # the run has started
        # Either replica may have claimed it (A took the update in, B was woken too):
        # /stop goes to the other one.
        runner = await _lease_holder(pg_url, procs)
        other = "b" if runner == "a" else "a"
        fake_telegram.webhook = dataclasses.replace(hook, url=url[other])
        fake_telegram.private_message("/stop")
        (sent,) = await fake_telegram.wait_for("sendMessage", limit=30)
        assert sent.params["text"] == "Stopped."
        await until_logged(procs[runner], b"stop of ")  # the runner cancelled it, asked
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await proc.wait() == 0
        assert [c.params["text"] for c in fake_telegram.sent("sendMessage")] == ["Stopped."]
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _lease_holder(url: str, procs: dict[str, RoostProcess]) -> str:
    """Which of ``procs`` holds the one session's lease (replica ids end in ``-<pid>-<random>``)."""
    db = await asyncpg.connect(url)
    try:
        (owner,) = [str(r[0]) for r in await db.fetch("SELECT owner FROM session_leases")]
    finally:
        await db.close()
    pid = int(owner.rsplit("-", 2)[-2])
    return next(name for name, proc in procs.items() if proc.pid == pid)
