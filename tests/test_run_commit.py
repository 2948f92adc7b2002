"""The dispatcher's one commit of a run: history, inbox and outbox, then the run's last event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.storage.db import Statements
from bot.testing.app import scripted, settle
from tests.conftest import AppFactory

KEY = "default:test:direct:u1"


async def test_a_stop_during_the_commit_still_announces_the_committed_run(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    app, channel, log = await make_app(scripted({"reply": "done"}))
    real_finish = app.inbox.finish
    entered, release = asyncio.Event(), asyncio.Event()

    def slow_finish(*args: Any, **kwargs: Any) -> Statements:
        body = real_finish(*args, **kwargs)

        async def slow(db: Any) -> Any:  # in the commit's transaction: a slow disk
            entered.set()
            await release.wait()
            return await body(db)
        return slow

    monkeypatch.setattr(app.inbox, "finish", slow_finish)
    await channel.say("hi")
    await asyncio.wait_for(entered.wait(), 5)
    assert app.dispatcher.stop_oldest(KEY)  # /stop while the commit is being written
    release.set()
    await log.wait_for("run.completed")
    await settle(app)
    history = (await app.store.get(KEY)).messages
    assert [m.content for m in history] == ["hi", "done"]
    # The run's observers hear how it really ended: answered, as its history says.
    assert "run.completed" in log.types() and "run.cancelled" not in log.types()
