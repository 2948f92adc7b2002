"""History pipeline, pruning, pairing repair and context segments, through the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import ChatMessage, ToolCall
from bot.contracts.tools import Tool, ToolContext
from bot.engine.context import CLEARED_RESULT, MISSING_RESULT
from bot.testing.app import scripted, settle
from tests.conftest import AppFactory


class BigTool:
    """A tool returning a large, recognisable result."""

    @staticmethod
    async def _big(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        size = int(args["size"])
        return "H" * 2000 + "M" * (size - 4000) + "T" * 2000

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        schema = {"type": "object", "properties": {"size": {"type": "integer"}}}
        return [Tool("big", "returns size characters", schema, self._big)]


def big_turn(size: int) -> dict[str, Any]:
    return {"match": f"^fetch {size}$", "steps": [
        {"tool_calls": [{"name": "big", "arguments": {"size": size}}]},
        {"reply": f"fetched {size}"}]}


async def test_only_the_last_n_user_turns_reach_the_model(make_app: AppFactory) -> None:
    provider = scripted({"reply": "ok {message}"}, loop=True)
    app, channel, _ = await make_app(provider, history_turns=2)
    for text in ("one", "two", "three", "four"):
        await channel.say(text)
        await settle(app)
    contents = [m.content for m in provider.requests[-1].messages]
    # Two past user turns, then the current message.
    assert contents == ["two", "ok two", "three", "ok three", "four"]


async def test_soft_trim_keeps_head_and_tail_of_old_large_tool_results(
    make_app: AppFactory,
) -> None:
    turns = [big_turn(10_000), {"reply": "ok"}]
    provider = scripted(*turns, loop=True)
    # ~2,500 tokens of tool output in a 6,000-token window crosses the 0.3 soft ratio.
    app, channel, _ = await make_app(provider, BigTool(), context_window=6_000,
                                     output_reserve=256, compaction=False)
    await channel.say("fetch 10000")
    await settle(app)
    for text in ("a", "b", "c"):  # push the tool result behind 3 newer assistant replies
        await channel.say(text)
        await settle(app)
    tool = next(m for m in provider.requests[-1].messages if m.role == "tool")
    assert tool.content.startswith("H" * 1500) and tool.content.endswith("T" * 1500)
    assert "characters trimmed" in tool.content and len(tool.content) < 3_200


async def test_recent_tool_results_are_protected_from_pruning(make_app: AppFactory) -> None:
    provider = scripted(big_turn(10_000), big_turn(10_001), loop=True)
    app, channel, _ = await make_app(provider, BigTool(), context_window=12_000,
                                     output_reserve=256, compaction=False)
    await channel.say("fetch 10000")
    await settle(app)
    await channel.say("fetch 10001")
    await settle(app)
    # In the second run the first result sits within the last 3 assistant messages.
    second_call = provider.requests[2]
    tool = next(m for m in second_call.messages if m.role == "tool")
    assert len(tool.content) == 10_000


async def test_hard_clear_empties_old_results_once_enough_is_prunable(
    make_app: AppFactory,
) -> None:
    calls = [{"name": "big", "arguments": {"size": 15_000}}] * 4  # 60 K chars prunable
    provider = scripted({"match": "^fetch$", "steps": [{"tool_calls": calls},
                                                       {"reply": "fetched"}]},
                        {"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider, BigTool(), context_window=5_000,
                                     output_reserve=256, compaction=False)
    await channel.say("fetch")
    await settle(app)
    for text in ("a", "b", "c"):
        await channel.say(text)
        await settle(app)
    tools = [m for m in provider.requests[-1].messages if m.role == "tool"]
    assert len(tools) == 4
    assert tools[0].content == CLEARED_RESULT  # oldest first, until under the hard ratio
    assert all(t.content == CLEARED_RESULT or "characters trimmed" in t.content
               for t in tools)


async def test_broken_tool_pairing_in_stored_history_is_repaired(make_app: AppFactory) -> None:
    provider = scripted({"reply": "fine"})
    app, channel, _ = await make_app(provider)
    session = await app.store.get("default:test:direct:u1")
    call_a, call_b = ToolCall("a", "list_files", {}), ToolCall("b", "list_files", {})
    await app.store.append_run(session, "old", [
        ChatMessage("user", "hi"),
        ChatMessage("tool", "orphan", tool_call_id="zzz", tool_name="list_files"),
        ChatMessage("assistant", "", tool_calls=(call_a, call_b)),
        ChatMessage("tool", "result a", tool_call_id="a", tool_name="list_files"),
        ChatMessage("tool", "wrong id", tool_call_id="nope", tool_name="list_files"),
        ChatMessage("assistant", "done"),
    ])
    await channel.say("next")
    await settle(app)
    sent = provider.requests[0].messages
    assert [(m.role, m.tool_call_id, m.content) for m in sent] == [
        ("user", None, "hi"),
        ("assistant", None, ""),
        ("tool", "a", "result a"),
        ("tool", "b", MISSING_RESULT),
        ("assistant", None, "done"),
        ("user", None, "next"),
    ]


async def test_segments_fit_the_budget_and_keep_the_newest_turns(make_app: AppFactory) -> None:
    provider = scripted({"reply": "{message}"}, loop=True)
    app, channel, _ = await make_app(provider, context_window=3_000, output_reserve=500,
                                     history_turns=1000, compaction=False)
    for i in range(60):
        await channel.say(f"message number {i} " + "x" * 200)
        await settle(app)
    session = await app.store.get("default:test:direct:u1")
    tokens = session.context_tokens
    assert tokens["total"] <= tokens["budget"] == 2_500
    assert tokens["total"] == sum(tokens[k] for k in ("rom", "kernel", "l2", "l1", "current"))
    sent = provider.requests[-1].messages
    assert sent[-1].content.startswith("message number 59")
    assert sent[0].content.startswith("message number 5")  # oldest turns evicted
    assert "message number 0 " not in " ".join(m.content for m in sent)
    assert sent[0].role == "user"  # whole turns only


async def test_kernel_carries_user_md_and_pinned_facts_and_status_shows_segments(
    make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider)
    await channel.say("/pin The launch is on Friday")
    await channel.say("/pin Budget is 5k")
    await settle(app)
    await channel.say("/unpin 2")
    await settle(app)
    await channel.say("hello")
    await settle(app)
    system = provider.requests[-1].system
    assert "The launch is on Friday" in system and "Budget is 5k" not in system
    assert "About the user (USER.md)" in system
    await channel.say("/status")
    await settle(app)
    status = channel.replies[-1]
    assert "Context (tokens, last run): system" in status and "kernel" in status
    await channel.say("/pins")
    await settle(app)
    assert channel.replies[-1] == "Pinned facts:\n#1 The launch is on Friday"


async def test_rom_is_fixed_for_a_run_and_the_summary_precedes_recent_turns(
    make_app: AppFactory,
) -> None:
    provider = scripted(
        {"match": r"^(\[Earlier summary\]|u1: )", "reply": "earlier: greetings"},
        {"match": "^many$", "steps": [
            {"tool_calls": [{"name": "list_files", "arguments": {"path": str(i)}}]}
            for i in range(3)] + [{"reply": "done"}]},
        {"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider, compact_min_messages=5, memory_flush=False)
    for text in ("a", "b", "c"):
        await channel.say(text)
        await settle(app)
    await app.engine.compactor.wait()
    await channel.say("many")
    await settle(app)
    run = [r for r in provider.requests if r.messages[-1].content == "many"
           or (r.messages and any(m.content == "many" for m in r.messages))]
    assert len(run) == 4 and len({r.system for r in run}) == 1  # ROM immutable within a run
    first = run[0].messages
    assert first[0].content.startswith("[Summary of earlier conversation]")  # L2 ...
    assert first[2].role == "user"  # ... then L1, newer, starting at a whole turn
    tokens = (await app.store.get("default:test:direct:u1")).context_tokens
    assert tokens["l2"] > 0 and tokens["total"] <= tokens["budget"]
