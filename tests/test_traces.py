"""Run traces (completed, failed, cancelled, verbose) and loop detection, through the engine."""

from __future__ import annotations

import asyncio

from bot.testing.app import scripted, settle
from tests.conftest import AppFactory
from tests.test_dispatch import BLOCK
from tests.test_runs import GateTools

KEY = "default:test:direct:u1"
TOOL_TURN = {"steps": [
    {"text": "looking", "tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"reply": "x" * 900}]}


async def test_a_completed_run_has_root_llm_and_tool_spans(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted(TOOL_TURN))
    await channel.say("what is here?")
    await settle(app)
    run = (await app.store.runs(KEY))[0]
    spans = await app.store.spans(run.run_id)
    assert [s.kind for s in spans] == ["agent", "llm", "tool", "llm"]
    root, llm1, tool, llm2 = spans
    assert root.parent_id is None and all(s.parent_id == root.span_id for s in spans[1:])
    assert root.attributes["status"] == "completed" and not root.error
    assert len(root.attributes["output_preview"]) == 500
    assert llm1.attributes["provider"] == "scripted" and llm1.attributes["iteration"] == 1
    assert llm1.attributes["input_tokens"] > 0 and llm2.attributes["output_tokens"] > 0
    assert "input" not in llm1.attributes  # not verbose
    assert tool.name == "list_files" and tool.error is False
    assert all(s.duration_ms > 0 for s in spans)
    assert run.input_tokens == llm1.attributes["input_tokens"] + llm2.attributes["input_tokens"]


async def test_verbose_traces_store_the_llm_input(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "ok"}), trace_verbose=True)
    await channel.say("remember the secret handshake")
    await settle(app)
    run = (await app.store.runs(KEY))[0]
    llm = next(s for s in await app.store.spans(run.run_id) if s.kind == "llm")
    assert "remember the secret handshake" in llm.attributes["input"]


async def test_a_failed_run_trace_records_the_error(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"error": "model exploded"}))
    await channel.say("hi")
    await settle(app)
    run = (await app.store.runs(KEY))[0]
    assert (run.status, run.error) == ("failed", "model exploded")
    root, llm = await app.store.spans(run.run_id)
    assert root.error and root.attributes["error_message"] == "model exploded"
    assert llm.error and llm.attributes["error_message"] == "model exploded"


async def test_a_cancelled_run_trace_is_finalized_as_cancelled(make_app: AppFactory) -> None:
    gate = GateTools()
    app, channel, _ = await make_app(scripted(BLOCK), gate)
    await channel.say("work")
    await asyncio.wait_for(gate.started.wait(), 5)
    await channel.say("/stop")
    await settle(app)
    run = (await app.store.runs(KEY))[0]
    assert run.status == "cancelled"
    root, llm, tool = await app.store.spans(run.run_id)
    assert root.attributes["status"] == "cancelled" and root.error
    assert tool.name == "block" and tool.error and tool.attributes["interrupted"] is True
    assert not llm.error


async def test_repeating_the_same_call_three_times_warns_the_model(make_app: AppFactory) -> None:
    same = {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]}
    provider = scripted({"steps": [same, same, same, {"reply": "giving up"}]})
    app, channel, _ = await make_app(provider)
    await channel.say("loop")
    await settle(app)
    # The warning is read with the results, in the request's note: the history the
    # model saw stays as stored (and as cached).
    assert "[No progress" not in provider.requests[2].note
    assert "[No progress: you called list_files with identical arguments 3 times" in \
        provider.requests[3].note
    assert not any("[No progress" in m.content for m in provider.requests[3].messages)
    session = await app.store.get(KEY)
    assert not any("[No progress" in m.content for m in session.messages)
