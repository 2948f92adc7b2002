"""``roost run`` on Telegram stops at once on SIGTERM: the long poll is cut, not waited out.

A separate process (the real aiogram) against the fake Bot API, whose
``getUpdates`` holds a long poll open for 30 s (Roost's default) until an
update arrives or the client hangs up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bot.testing.telegram import FakeTelegram
from tests.roost_forks import spawn

pytestmark = pytest.mark.e2e


async def test_sigterm_during_a_long_poll_closes_the_poll_and_exits_cleanly(
        tmp_path: Path, fake_telegram: FakeTelegram) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROOST_", "TELEGRAM_", "ANTHROPIC_", "OPENAI_", "DISCORD_",
                                "SLACK_"))}
    env.update(ROOST_PROVIDER="scripted", ROOST_DATA_DIR=str(tmp_path / "data"),
               TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url)
    proc = await spawn(["run"], cwd=tmp_path, env=env)
    try:
        [poll] = await fake_telegram.wait_for("getUpdates", limit=60, ok=False)
        assert poll.status == 0  # held open: nothing to deliver
        proc.send_signal(signal.SIGTERM)
        _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    polls = fake_telegram.calls_of("getUpdates")
    # Every poll ended by the bot hanging up, none by its 30 s timeout running out
    # (an empty answer, status 200): the process did not wait for one.
    assert polls and all(call.status == 0 for call in polls)
    assert b"roost shutting down" in stderr
