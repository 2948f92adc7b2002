"""Approvals on two replicas sharing one PostgreSQL database: a press arriving at the
replica that does not run the paused run resumes it, and two presses racing on the two
replicas decide once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.messages import OutboundMessage
from bot.testing.app import ChatChannel, replica_chats, scripted
from plugins.scripted_provider import ScriptedProvider
from tests.test_approvals import APPROVE_TOUCH, Touch, press, touching


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
