"""A real ``roost run`` killed with SIGKILL while a tool call waits for approval: the press
after the restart resumes the run, which neither asks again nor runs the call twice."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.wire import ALICE
from tests.roost_processes import start_roost, until_logged
from tests.test_approvals_telegram import answer_of, prompt_of
from tests.test_cli import clean_env

BEFORE = """turns:
  - steps:
      - tool_calls:
          - name: write_file
            arguments: {path: "note.txt", content: "approved once"}
      - reply: "first life"
"""
AFTER = "turns:\n  - reply: 'written after the restart'\n"
CONFIG = '[agents.default]\ntools = { approve = ["write_file"] }\n'


def prompt_recorded(db: Path) -> None:
    """Wait until the pending approval's prompt is recorded (the pause is complete; a
    kill before that asks again after the restart, as the prompt may never have shown)."""
    deadline = time.monotonic() + 10  # a hang guard
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT prompt_id FROM approvals").fetchall()
        if rows and rows[0][0] is not None:
            return
        time.sleep(0.05)
    raise AssertionError("the approval prompt was never recorded")


def notes(root: Path) -> list[Path]:
    return list(root.rglob("note.txt"))


@pytest.mark.e2e
async def test_a_press_after_kill_9_resumes_the_paused_run_without_asking_again(
        tmp_path: Path, fake_telegram: FakeTelegram) -> None:
    script = tmp_path / "script.yaml"
    await asyncio.to_thread(script.write_text, BEFORE)
    await asyncio.to_thread((tmp_path / "roost.toml").write_text, CONFIG)
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script), ROOST_STREAM_REPLIES="false",
        ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
        TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url)
    proc = await start_roost(tmp_path, env)
    try:
        await until_logged(proc, b"roost ready")
        fake_telegram.private_message("write the note")
        mid, data = await prompt_of(fake_telegram)
        await asyncio.to_thread(prompt_recorded, tmp_path / "data" / "roost.db")
        proc.kill()  # SIGKILL at the pause
        await proc.wait()
        assert not await asyncio.to_thread(notes, tmp_path)
        # The model of the second life would answer anything else: a second tool call
        # or a second prompt would show.
        await asyncio.to_thread(script.write_text, AFTER)
        proc = await start_roost(tmp_path, env)
        await until_logged(proc, b"roost ready")
        press = fake_telegram.interactions.press(mid, data["Approve"])
        assert await answer_of(fake_telegram, press) == "Approved."
        async with asyncio.timeout(30):
            while fake_telegram.sent("sendMessage")[-1].params["text"] != \
                    "written after the restart":
                await fake_telegram.wait_for("sendMessage",
                                             len(fake_telegram.sent("sendMessage")) + 1,
                                             limit=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    [note] = await asyncio.to_thread(notes, tmp_path)
    assert await asyncio.to_thread(note.read_text) == "approved once"
    prompts = [c for c in fake_telegram.sent("sendMessage") if "reply_markup" in c.params]
    assert len(prompts) == 1  # not asked again
    assert fake_telegram.messages[(ALICE["id"], mid)]["text"].startswith("Approved by Alice")
