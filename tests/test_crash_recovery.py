"""A real ``roost run`` killed with SIGKILL or stopped with SIGTERM mid-conversation.

Separate processes against the fake Telegram Bot API (long polling) and the
fake Messages API, through the real aiogram and anthropic SDKs; see
:mod:`bot.testing.chaos`. ``bench/bench_chaos.py`` runs the same at scale.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from bot.testing.chaos import ChaosConfig, ChaosRun
from tests.roost_processes import forked_run

pytestmark = pytest.mark.e2e


async def test_kill_9_at_every_kind_of_moment_loses_and_repeats_nothing(
        tmp_path: Path) -> None:
    run = ChaosRun(tmp_path, ChaosConfig(users=3, kills=4, min_alive=0.8, max_alive=2.5,
                                         settle=30, seed=7), spawn=forked_run)
    report = await run.run()
    assert report.kills == 4
    assert report.acknowledged >= 4
    assert report.lost == []
    assert report.tools_twice == []
    # A kill in the few milliseconds between Telegram taking a reply (or a draft)
    # and Roost committing that it did leaves one extra copy: the Bot API has no
    # idempotency key (README, "What Roost guarantees"). bench_chaos measured
    # that window at 10 copies and 3 drafts in 200 kills; more than one here is a bug.
    assert len(report.duplicated) <= 1, report.duplicated
    assert len(report.frozen_drafts) <= 1, report.frozen_drafts
    assert report.integrity == "ok"
    assert report.exit_code == 0
    # A message given up after repeated interruptions is told so, in its chat.
    for number in report.given_up:
        sent = next(s for s in run.sent if s.number == number)
        assert any(t.startswith("I could not answer") for t in run.telegram.visible(sent.chat_id))


async def test_sigterm_with_50_runs_in_flight_then_restart_loses_nothing(
        tmp_path: Path) -> None:
    run = ChaosRun(tmp_path, env={"ROOST_SHUTDOWN_GRACE_SECONDS": "0.5"}, spawn=forked_run)
    # Answers stream for about 2 s: longer than the grace period.
    run.model.slow_delay = 0.15
    async with run.telegram, run.model:
        proc = await run.spawn(0)
        for i in range(50):
            run.say(i, "slow")
        await run.telegram.wait_until(lambda: len(run.model.requests) >= 50, limit=30)
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
        unanswered = [s for s in run.sent if not run.all_answered()]
        assert unanswered, "every run finished inside the grace period: nothing was tested"

        run.model.slow_delay = 0.01  # the SIGTERM is behind us: the repeated runs may be quick
        proc = await run.spawn(1)
        await run.telegram.wait_until(run.all_answered, limit=60)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
    report = run.count()
    assert report.acknowledged == 50
    assert report.answered == 50
    assert report.lost == [] and report.given_up == [] and report.duplicated == []
    assert report.frozen_drafts == []


async def test_an_idle_service_stops_cleanly_on_sigterm_and_loses_nothing(
        tmp_path: Path) -> None:
    run = ChaosRun(tmp_path, spawn=forked_run)
    async with run.telegram, run.model:
        proc = await run.spawn(0)
        run.say(0, "plain")
        await run.telegram.wait_until(run.all_answered, limit=30)
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
    report = run.count()
    assert report.answered == 1 and report.duplicated == []
