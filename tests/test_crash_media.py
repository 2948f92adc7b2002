"""Files and crashes: a real ``roost run`` killed with SIGKILL while it answers a message
that came with a file it refused, then started again on the same data dir.

Uses the crash-recovery harness (:mod:`bot.testing.chaos`): the fake Telegram Bot
API (long polling) and the fake Messages API, through the real aiogram and
anthropic SDKs.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bot.testing.chaos import ChaosConfig, ChaosRun
from bot.testing.telegram import user
from tests.roost_processes import forked_run

pytestmark = pytest.mark.e2e

REFUSED = "bigscan.pdf is 2 MB; files over 1 MB are not accepted"


async def test_a_refused_file_notice_is_sent_once_though_the_run_is_repeated_after_kill_9(
    tmp_path: Path,
) -> None:
    run = ChaosRun(tmp_path, ChaosConfig(users=0, kills=0),
                   env={"ROOST_MEDIA_MAX_FILE_MB": "1", "ROOST_STREAM_REPLIES": "false"},
                   spawn=forked_run)
    run.model.slow_delay = 0.5  # the answer takes seconds: the kill lands while it streams
    telegram = run.telegram
    alice = user(7001, "Alice")
    async with telegram, run.model:
        first = await run.spawn(0)
        try:
            telegram.document(b"%PDF-1.7\n" + bytes(2 * 1024 * 1024), "bigscan.pdf",
                              "application/pdf", caption="slow #1 what does it say?",
                              sender=alice)
            await telegram.wait_until(lambda: REFUSED in telegram.sent_texts(7001), limit=60)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        answered_before = [t for t in telegram.sent_texts(7001) if t.startswith("ok #1")]

        run.model.slow_delay = 0.01  # the kill is behind us: the repeated answer may be quick
        second = await run.spawn(1)
        try:
            await telegram.wait_until(
                lambda: any(t.startswith("ok #1") for t in telegram.sent_texts(7001)), limit=60)
        finally:
            second.send_signal(signal.SIGTERM)
            assert await second.wait() == 0

    texts = telegram.sent_texts(7001)
    assert answered_before == []  # killed mid-answer: the repeated run answered
    assert texts.count(REFUSED) == 1, texts
    assert sum(t.startswith("ok #1") for t in texts) == 1
