"""Approvals on two replicas sharing one PostgreSQL database: a press arriving at the
replica that does not run the paused run resumes it, two presses racing on the two
replicas decide once, and a replica killed at the pause is taken over by the other,
where the press resumes the run once, without asking again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from bot.app.roost import Roost
from bot.contracts.messages import OutboundMessage
from bot.testing.app import ChatChannel, replica_chats, scripted
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.wire import ALICE
from plugins.scripted_provider import ScriptedProvider
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_approvals import APPROVE_TOUCH, Touch, press, touching
from tests.test_approvals_restart import AFTER, BEFORE, CONFIG, notes
from tests.test_approvals_telegram import prompt_of
from tests.test_cli import clean_env
from tests.test_run_all_channels import free_port


@pytest.fixture
async def replicas(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[list[Roost],
                                                                        list[ChatChannel],
                                                                        list[Touch]]]:
    touches = [Touch(), Touch()]
    async with contextlib.AsyncExitStack() as stack:
        apps: list[Roost] = []
        chats: list[ChatChannel] = []
        for n, touch in enumerate(touches):
            # One replica per Touch: each records what ran where.
            app_list, chat_list = await stack.enter_async_context(replica_chats(
                pg_url, tmp_path / str(n), _touching, touch, count=1, agents=APPROVE_TOUCH))
            apps += app_list
            chats += chat_list
        yield apps, chats, touches


def _touching() -> ScriptedProvider:
    return scripted(touching("r", "done"))


async def prompted(chats: list[ChatChannel]) -> tuple[int, OutboundMessage]:
    """Which replica showed the approval prompt, and the prompt."""
    waits = {asyncio.ensure_future(c.wait_for_message(lambda m: bool(m.buttons), 30)): i
             for i, c in enumerate(chats)}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    first = done.pop()
    return waits[first], first.result()


async def idle(apps: list[Roost]) -> None:
    for app in apps:
        await asyncio.wait_for(app.dispatcher.drain(), 30)


async def test_a_press_on_the_other_replica_resumes_the_run(replicas: Any) -> None:
    apps, chats, touches = replicas
    await chats[0].say("touch it")
    runner, prompt = await prompted(chats)
    other = 1 - runner
    # The press reaches the replica that does not run the session.
    await chats[other].hand_in(press(chats[runner], prompt, "Approve", "user"))
    assert chats[other].answers[-1][1] == "Approved."
    await idle(apps)
    assert touches[runner].ran == ["r"] and touches[other].ran == []
    assert chats[runner].replies[-1] == "done"


async def test_two_presses_racing_on_two_replicas_decide_once(replicas: Any) -> None:
    apps, chats, touches = replicas
    await chats[1].say("touch it")
    runner, prompt = await prompted(chats)
    await asyncio.gather(
        chats[0].hand_in(press(chats[runner], prompt, "Approve", "user", 1)),
        chats[1].hand_in(press(chats[runner], prompt, "Deny", "user", 2)))
    await idle(apps)
    notes = [str(note) for chat in chats for _, note in chat.answers]
    assert sorted(n.startswith("Already decided") for n in notes) == [False, True]
    ran = touches[0].ran + touches[1].ran
    approved = "Approved." in notes
    assert ran == (["r"] if approved else [])
    row = (await apps[0].approvals.store.recent())[0]
    assert row.state == ("approved" if approved else "denied")


async def _until_row(pg_url: str, sql: str, check: Callable[[list[Any]], bool]) -> list[Any]:
    """The rows of ``sql`` once ``check`` holds for them (a hang guard of 30 s)."""
    conn = await asyncpg.connect(pg_url)
    try:
        for _ in range(600):
            rows = [tuple(r) for r in await conn.fetch(sql)]
            if check(rows):
                return rows
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise AssertionError(f"never: {sql}")


@pytest.mark.e2e
async def test_a_replica_killed_at_the_pause_is_taken_over_and_one_press_resumes_it(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    envs = {}
    for name, script in (("b", BEFORE), ("a", AFTER)):
        cwd = tmp_path / name
        await asyncio.to_thread(cwd.mkdir)
        await asyncio.to_thread((cwd / "script.yaml").write_text, script)
        await asyncio.to_thread((cwd / "roost.toml").write_text, CONFIG)
        port = free_port()
        envs[name] = clean_env(
            ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(cwd / "script.yaml"),
            ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
            ROOST_DATABASE_URL=pg_url, ROOST_LEASE_SECONDS="2",
            ROOST_TELEGRAM_WEBHOOK_SECRET="s3cret",
            ROOST_TELEGRAM_WEBHOOK_URL=f"http://127.0.0.1:{port}/telegram",
            ROOST_TELEGRAM_WEBHOOK_PORT=str(port), TELEGRAM_BOT_TOKEN=fake_telegram.token,
            TELEGRAM_API_BASE=fake_telegram.base_url)
    procs: dict[str, RoostProcess] = {}
    try:
        procs["b"] = await start_roost(tmp_path / "b", envs["b"])
        await until_logged(procs["b"], b"roost ready")
        fake_telegram.private_message("write the note")  # to b's webhook
        mid, data = await prompt_of(fake_telegram)
        [(holder,)] = await _until_row(
            pg_url, "SELECT a.prompt_id FROM approvals a", lambda rows: bool(
                rows and rows[0][0] is not None))
        [(owner_b,)] = await _until_row(pg_url, "SELECT owner FROM session_leases",
                                        lambda rows: len(rows) == 1)
        procs["a"] = await start_roost(tmp_path / "a", envs["a"])  # the webhook is a's now
        await until_logged(procs["a"], b"roost ready")
        procs["b"].kill()  # kill -9 at the pause, holding the session's lease
        await procs["b"].wait()
        # a takes the session over once b's lease expired, and resumes the run at its pause.
        await _until_row(pg_url, "SELECT owner FROM session_leases",
                         lambda rows: len(rows) == 1 and rows[0][0] != owner_b)
        query = fake_telegram.interactions.queries[
            fake_telegram.interactions.press(mid, data["Approve"])["callback_query"]["id"]]
        while not query.answered:  # over a's webhook
            await fake_telegram.wait_for("answerCallbackQuery",
                                         len(fake_telegram.calls_of("answerCallbackQuery")) + 1,
                                         ok=False, limit=30)
        assert query.text == "Approved."
        async with asyncio.timeout(30):
            while "written after the restart" not in fake_telegram.sent_texts():
                await fake_telegram.wait_for("sendMessage",
                                             len(fake_telegram.sent("sendMessage")) + 1,
                                             limit=30)
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    [note] = await asyncio.to_thread(notes, tmp_path)  # written once, by a
    assert note.is_relative_to(tmp_path / "a")
    assert await asyncio.to_thread(note.read_text) == "approved once"
    prompts = [c for c in fake_telegram.sent("sendMessage") if "reply_markup" in c.params]
    assert len(prompts) == 1 and holder  # asked once, in b's life
    assert fake_telegram.messages[(ALICE["id"], mid)]["text"].startswith("Approved by Alice")
