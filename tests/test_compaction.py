"""Post-run compaction with the memory flush, mid-run compaction, and failure safety."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest

from bot.testing.app import scripted, settle
from tests.conftest import AppFactory

TODAY = dt.datetime.now(dt.UTC).date().isoformat()
FLUSH: dict[str, Any] = {"match": "^Pre-compaction memory flush", "steps": [
    {"tool_calls": [{"name": "write_file", "arguments": {
        "path": f"memory/{TODAY}.md", "content": "- u1 likes green tea\n"}}]},
    {"reply": "NO_REPLY"}]}
SUMMARY: dict[str, Any] = {"match": r"^(\[Earlier summary\]|u1: )",
                           "reply": "u1 talked about tea, twice."}
CHAT: dict[str, Any] = {"reply": "ack {message}"}
COMPACT = {"compact_min_messages": 5, "compact_keep_messages": 4}


async def chat(app: Any, channel: Any, *texts: str) -> None:
    for text in texts:
        await channel.say(text)
        await settle(app)
    await app.engine.compactor.wait()


async def test_post_run_compaction_flushes_memory_then_summarizes(
    make_app: AppFactory, tmp_path: Path
) -> None:
    provider = scripted(FLUSH, SUMMARY, CHAT, loop=True)
    app, channel, _ = await make_app(provider, **COMPACT)
    await chat(app, channel, "turn one")
    soul = tmp_path / "data/workspaces/test/u1/SOUL.md"
    soul.write_text("MARKER-OF-THE-PERSONA")
    await chat(app, channel, "turn two", "turn three")
    session = await app.store.get("default:test:direct:u1")
    assert session.compactions == 1 and session.flushed_compaction == 0
    assert session.summary == "u1 talked about tea, twice."
    assert [m.content for m in session.messages] == [
        "turn two", "ack turn two", "turn three", "ack turn three"]
    memory = tmp_path / f"data/workspaces/test/u1/memory/{TODAY}.md"
    assert memory.read_text() == "- u1 likes green tea\n"
    flush_request = next(r for r in provider.requests
                         if r.messages[-1].content.startswith("Pre-compaction"))
    assert {t.name for t in flush_request.tools} == {"read_file", "write_file"}
    assert "MARKER-OF-THE-PERSONA" not in flush_request.system  # minimal prompt
    assert "MARKER-OF-THE-PERSONA" in provider.requests[-4].system  # a normal run has it
    assert [m.content for m in flush_request.messages[:2]] == ["turn one", "ack turn one"]
    # The flush wrote nothing into the conversation itself.
    assert not any("Pre-compaction" in m.content for m in session.messages)
    await chat(app, channel, "turn four")
    sent = next(r for r in provider.requests if r.messages[-1].content == "turn four").messages
    assert sent[0].content == "[Summary of earlier conversation]\nu1 talked about tea, twice."
    assert sent[1].role == "assistant" and sent[2].content == "turn two"


async def test_a_failed_summary_loses_nothing_and_the_flush_runs_once_per_cycle(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    failing = {"match": SUMMARY["match"], "error": "summarizer unavailable"}
    provider = scripted(FLUSH, failing, CHAT, loop=True)
    app, channel, _ = await make_app(provider, **COMPACT)
    await chat(app, channel, "turn one", "turn two", "turn three")
    session = await app.store.get("default:test:direct:u1")
    assert session.compactions == 0 and session.summary == ""
    assert len(session.messages) == 6
    assert "history left as it was" in caplog.text
    provider.turns[1] = provider.turns[1].__class__(  # the summarizer recovers
        scripted(SUMMARY).turns[0].steps, provider.turns[1].match)
    attempts = len(provider.requests)
    await chat(app, channel, "turn four")
    assert len(provider.requests) == attempts + 1  # no retry right after a failure
    await chat(app, channel, "five", "six", "seven", "eight")  # 10 more messages: retry
    flushes = [r for r in provider.requests
               if r.messages[-1].content.startswith("Pre-compaction")]
    assert len(flushes) == 1  # not again in the same compaction cycle
    session = await app.store.get("default:test:direct:u1")
    assert session.compactions == 1


async def test_compaction_of_a_session_is_never_started_twice_at_once(
    make_app: AppFactory,
) -> None:
    provider = scripted(FLUSH, {**SUMMARY, "delay": 0.2}, CHAT, loop=True)
    app, channel, _ = await make_app(provider, **COMPACT)
    for text in ("turn one", "turn two", "turn three"):
        await channel.say(text)
        await settle(app)
    session = await app.store.get("default:test:direct:u1")
    assert app.engine.compactor.busy == {session.key}
    assert app.engine.compactor.schedule(session, channel_message()) is False
    await app.engine.compactor.wait()
    assert session.compactions == 1


def channel_message() -> Any:
    from bot.contracts.messages import InboundMessage

    return InboundMessage("test", "u1", "direct", "u1", "x")


async def test_mid_run_compaction_summarizes_the_oldest_messages_once(
    make_app: AppFactory,
) -> None:
    loop_turn = {"match": "^work$", "steps": [
        *[{"tool_calls": [{"name": "list_files", "arguments": {"path": f"d{i}"}}]}
          for i in range(4)],
        {"reply": "worked"}]}
    provider = scripted(SUMMARY, loop_turn, loop=True)
    app, channel, _ = await make_app(provider, compact_ratio=0.005,
                                     compact_min_messages=1000)
    await chat(app, channel, "work")
    assert channel.replies == ["worked"]
    summaries = [r for r in provider.requests if r.messages[0].content.startswith("u1: ")]
    assert len(summaries) == 1  # once per run
    after = provider.requests[provider.requests.index(summaries[0]) + 1]
    assert after.messages[0].content.startswith("[Summary of earlier conversation]")
    assert [m.content for m in after.messages].count("work") == 1  # the task stays verbatim
    assert len(after.messages) < len(summaries[0].messages[0].content)
    session = await app.store.get("default:test:direct:u1")
    assert session.messages[0].content == "work"  # the stored history is complete


async def test_compaction_can_be_switched_off(make_app: AppFactory,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="roost.engine.compaction")
    provider = scripted(FLUSH, SUMMARY, CHAT, loop=True)
    app, channel, _ = await make_app(provider, compaction=False, **COMPACT)
    await chat(app, channel, "a", "b", "c", "d")
    session = await app.store.get("default:test:direct:u1")
    assert len(session.messages) == 8 and session.compactions == 0
