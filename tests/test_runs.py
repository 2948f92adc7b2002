"""The run engine through the service's public path: a channel submits, replies come back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bot.contracts.guard import InputCheck
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import PromptContext
from bot.contracts.tools import Tool, ToolContext
from bot.engine.gates import WITHHELD
from bot.engine.requests import RunRequest
from bot.testing.app import scripted, settle, without_summary
from tests.conftest import AppFactory

SCHEMA = {"type": "object", "properties": {"tag": {"type": "string"}}}


class GateTools:
    """Tools whose progress a test controls."""

    def __init__(self, parties: int = 1) -> None:
        self.barrier = asyncio.Barrier(parties)
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.entered = 0
        self._entered = asyncio.Condition()
        self.cancelled = 0
        self.order: list[str] = []

    async def _barrier(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        await asyncio.wait_for(self.barrier.wait(), 5)
        return f"passed {args['tag']}"

    async def wait_entered(self, count: int, limit: float = 5.0) -> None:
        """Wait until ``count`` calls of ``block`` are (or were) inside it."""
        async with asyncio.timeout(limit), self._entered:
            await self._entered.wait_for(lambda: self.entered >= count)

    async def _block(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        self.started.set()
        async with self._entered:
            self.entered += 1
            self._entered.notify_all()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "released"

    async def _ordered(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        # Later calls finish first, so results must be put back in call order.
        await asyncio.sleep(0.01 * (3 - int(args["tag"])))
        self.order.append(args["tag"])
        return f"result {args['tag']}"

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [
            Tool("barrier", "waits for its siblings", SCHEMA, self._barrier),
            Tool("block", "waits until released", SCHEMA, self._block),
            Tool("ordered", "finishes in reverse", SCHEMA, self._ordered),
        ]


async def test_plain_reply_is_delivered_persisted_and_observed(make_app: AppFactory) -> None:
    app, channel, log = await make_app(scripted({"reply": "Hello there"}))
    await channel.say("hi")
    await settle(app)
    assert channel.replies == ["Hello there"]
    session = await app.store.get("default:test:direct:u1")
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "hi"), ("assistant", "Hello there")]
    assert log.types()[0] == "run.started"
    assert log.types()[-1] == "run.completed"
    assert "chunk" in log.types()


async def test_tool_call_runs_in_the_senders_workspace_and_is_persisted(
    make_app: AppFactory, tmp_path: Path
) -> None:
    provider = scripted({"steps": [
        {"text": "Saving.", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "n.md", "content": "tea"}}]},
        {"reply": "Saved."},
    ]})
    app, channel, log = await make_app(provider)
    await channel.say("remember tea", sender="alice")
    await settle(app)
    assert channel.replies == ["Saved."]
    assert (tmp_path / "data/workspaces/test/alice/n.md").read_text() == "tea"
    session = await app.store.get("default:test:direct:alice")
    roles = [m.role for m in session.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert session.messages[1].tool_calls[0].name == "write_file"
    assert session.messages[2].tool_call_id == session.messages[1].tool_calls[0].id
    types = log.types()
    assert types.index("tool.call") < types.index("tool.result") < types.index("run.completed")
    assert "block.reply" in types
    # The model saw the tool result on its second call.
    assert provider.requests[1].messages[-1].role == "tool"


async def test_several_tool_calls_run_concurrently_and_results_keep_call_order(
    make_app: AppFactory,
) -> None:
    gate = GateTools(parties=3)
    calls = [{"name": "barrier", "arguments": {"tag": str(i)}} for i in range(3)]
    ordered = [{"name": "ordered", "arguments": {"tag": str(i)}} for i in range(3)]
    provider = scripted({"steps": [
        {"tool_calls": calls}, {"tool_calls": ordered}, {"reply": "done"}]})
    app, channel, _ = await make_app(provider, gate)
    await channel.say("go")
    await settle(app)
    assert channel.replies == ["done"]  # would time out if the barrier tools ran one by one
    assert gate.order == ["2", "1", "0"]
    tool_msgs = [m for m in provider.requests[2].messages if m.role == "tool"]
    assert [without_summary(m.content) for m in tool_msgs[-3:]] == [
        "result 0", "result 1", "result 2"]


async def test_no_reply_is_not_delivered_but_is_persisted(make_app: AppFactory) -> None:
    app, channel, log = await make_app(scripted({"reply": "  NO_REPLY \n"}), stream=True)
    await channel.say("psst")
    await settle(app)
    assert channel.sent == []
    assert channel.streams == [[None]]  # nothing pushed: a possible NO_REPLY is held back
    session = await app.store.get("default:test:direct:u1")
    assert [m.role for m in session.messages] == ["user", "assistant"]
    completed = await log.wait_for("run.completed")
    assert completed.payload["silent"] is True


async def test_streaming_splits_text_before_tool_calls_from_the_final_answer(
    make_app: AppFactory,
) -> None:
    provider = scripted({"steps": [
        {"text": "Looking.", "tool_calls": [{"name": "list_files", "arguments": {}}]},
        {"reply": "Found it.", "chunk": 3},
    ]})
    app, channel, _ = await make_app(provider, stream=True)
    await channel.say("find")
    await settle(app)
    assert channel.streams[0] == ["Looking.", "Looking."]
    assert channel.streams[1][-1] == "Found it."
    assert channel.streams[1][:-1] == ["Fou", "Found", "Found it."]


async def test_iteration_limit_ends_the_run_with_an_explanation(make_app: AppFactory) -> None:
    provider = scripted({"steps": [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 5})
    app, channel, _ = await make_app(provider, max_iterations=3)
    await channel.say("loop forever")
    await settle(app)
    assert len(provider.requests) == 3
    assert "stopped after 3 steps" in channel.replies[0]


async def test_per_request_iteration_limit_overrides_the_setting(make_app: AppFactory) -> None:
    provider = scripted({"steps": [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 5})
    app, _, _ = await make_app(provider, max_iterations=5)
    session = await app.store.get("default:test:direct:x")
    message = InboundMessage("test", "x", "direct", "x", "go")
    result = await app.engine.run(RunRequest(message, session, max_iterations=2))
    assert result.iterations == 2
    assert len(provider.requests) == 2


async def test_tool_failures_reach_the_model_as_error_results(make_app: AppFactory) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [
            {"name": "no_such_tool", "arguments": {}},
            {"name": "read_file", "arguments": {"path": 7}},
            {"name": "read_file", "arguments": {"path": "../../etc/passwd"}},
            {"name": "read_file", "arguments": {}},
        ]},
        {"reply": "ok"},
    ]})
    app, channel, _ = await make_app(provider)
    await channel.say("break things")
    await settle(app)
    results = [m for m in provider.requests[1].messages if m.role == "tool"]
    assert all(m.is_error for m in results)
    assert "Unknown tool 'no_such_tool'" in results[0].content
    assert "'path' must be string" in results[1].content
    assert "PATH_ESCAPE" in results[2].content or "outside" in results[2].content
    assert "missing 'path'" in results[3].content
    assert channel.replies == ["ok"]


async def test_a_raising_plugin_is_logged_by_name_and_the_run_goes_on(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        @hookimpl
        def roost_run_event(self) -> None:
            raise RuntimeError("observer exploded")

        @hookimpl
        def roost_prompt_sections(self, prompt: PromptContext) -> None:
            raise ValueError("section exploded")

    caplog.set_level(logging.ERROR)
    app, channel, log = await make_app(scripted({"reply": "still fine"}), Broken())
    await channel.say("hi")
    await settle(app)
    assert channel.replies == ["still fine"]
    assert "run.completed" in log.types()
    assert "test-plugin-0" in app.host.errors
    assert "test-plugin-0" in caplog.text


async def test_input_check_refusal_skips_the_model_and_keeps_only_a_placeholder(
        make_app: AppFactory) -> None:
    class Refuser:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck | None:
            return InputCheck(refusal="I won't do that.") if "evil" in text else None

    provider = scripted({"reply": "never"}, loop=True)
    app, channel, _ = await make_app(provider, Refuser())
    await channel.say("do evil")
    await settle(app)
    assert channel.replies == ["I won't do that."]
    assert provider.requests == []
    session = await app.store.get("default:test:direct:u1")
    assert [m.content for m in session.messages] == [WITHHELD, "I won't do that."]


async def test_input_check_can_rewrite_text_and_add_a_note(make_app: AppFactory) -> None:
    class Shortener:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck:
            return InputCheck(text=text[:5], note="[input was shortened]")

    provider = scripted({"reply": "ok"})
    app, channel, _ = await make_app(provider, Shortener())
    await channel.say("abcdefghij")
    await settle(app)
    sent = provider.requests[0].messages[-1].content
    assert sent.startswith("abcde\n") and "[input was shortened]" in sent


async def test_provider_failure_tells_the_user_and_keeps_only_the_user_message(
    make_app: AppFactory,
) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [{"name": "list_files", "arguments": {}}]},
        {"error": "upstream is down"},
    ]})
    app, channel, log = await make_app(provider)
    await channel.say("try")
    await settle(app)
    assert channel.sent[0].kind == "error"
    assert "upstream is down" in channel.sent[0].text
    session = await app.store.get("default:test:direct:u1")
    assert [m.role for m in session.messages] == ["user"]
    assert (await log.wait_for("run.failed")).payload["error"] == "upstream is down"


async def test_group_history_is_shared_and_attributed_but_workspaces_are_personal(
    make_app: AppFactory, tmp_path: Path
) -> None:
    provider = scripted(
        {"steps": [{"tool_calls": [{"name": "write_file",
                                    "arguments": {"path": "me.txt", "content": "{message}"}}]},
                   {"reply": "noted"}]},
        {"reply": "hi bob"},
    )
    app, channel, _ = await make_app(provider)
    await channel.say("alice here", sender="a1", name="Alice", group="g1")
    await settle(app)
    await channel.say("bob here", sender="b2", name="Bob", group="g1")
    await settle(app)
    last = provider.requests[-1].messages
    assert last[0].content == "[Alice (id a1)]: alice here"
    assert last[-1].content == "[Bob (id b2)]: bob here"
    assert (tmp_path / "data/workspaces/test/a1/me.txt").exists()
    assert not (tmp_path / "data/workspaces/test/b2/me.txt").exists()
    assert channel.sent[0].reply_to == "1"  # group replies thread to the trigger


async def test_history_survives_a_restart(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "first answer"}))
    await channel.say("first")
    await settle(app)
    await app.close()
    provider = scripted({"reply": "second answer"})
    app2, channel2, _ = await make_app(provider)
    await channel2.say("second")
    await settle(app2)
    contents = [m.content for m in provider.requests[0].messages]
    assert contents == ["first", "first answer", "second"]


async def test_huge_messages_with_null_bytes_are_shortened_for_the_model_not_rejected(
    make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "read it"}, loop=True)
    app, channel, _ = await make_app(provider)
    weird = "a\x00b" + "x" * 1_000_000
    await channel.say(weird)
    await settle(app)
    assert channel.replies == ["read it"]
    sent = provider.requests[0].messages[-1].content
    assert sent.startswith(weird[:32_768]) and "shortened to the first 32,768" in sent
    await app.close()
    app2, _, _ = await make_app(scripted({"reply": "x"}))
    session = await app2.store.get("default:test:direct:u1")
    assert session.messages[0].content == weird[:32_768]


async def test_a_failed_delivery_is_logged_and_the_session_stays_intact(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app, channel, _ = await make_app(scripted({"reply": "lost in transit"}))

    async def broken_send(message: object) -> None:
        raise ConnectionError("platform down")

    setattr(channel, "send", broken_send)  # noqa: B010 - replace the bound method
    await channel.say("hello")
    await settle(app)
    assert "delivering run" in caplog.text and "platform down" in caplog.text
    session = await app.store.get("default:test:direct:u1")
    assert [m.content for m in session.messages] == ["hello", "lost in transit"]


async def test_prompt_follows_workspace_files_edited_by_tools_and_by_hand(
    make_app: AppFactory, tmp_path: Path
) -> None:
    provider = scripted(
        {"match": "^save", "steps": [
            {"tool_calls": [{"name": "write_file",
                             "arguments": {"path": "USER.md", "content": "Likes: tea"}}]},
            {"reply": "saved"}]},
        {"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider)
    await channel.say("hello")
    await settle(app)
    assert "Likes: tea" not in provider.requests[-1].system
    await channel.say("save that")
    await settle(app)
    await channel.say("again")
    await settle(app)
    assert "Likes: tea" in provider.requests[-1].system
    user_md = tmp_path / "data/workspaces/test/u1/USER.md"
    user_md.write_text("Likes: coffee, strongly")
    await channel.say("and now")
    await settle(app)
    assert "Likes: coffee, strongly" in provider.requests[-1].system


async def test_each_input_check_sees_the_text_as_the_ones_before_rewrote_it(
        make_app: AppFactory) -> None:
    seen: list[str] = []

    class Redactor:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck | None:
            seen.append(text)
            return InputCheck(text=text.replace("4111-1111", "[card]"))

    class Shouter:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck | None:
            seen.append(text)
            return InputCheck(text=text.upper(), note="shouted")

    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await make_app(provider, Redactor(), Shouter())
    await app.dispatcher.submit(InboundMessage(
        channel="test", chat_id="u1", chat_type="direct", sender_id="u1",
        text="pay with 4111-1111 please"))
    await settle(app)
    # pluggy calls the later-registered plugin first; either way the second
    # check sees the first one's rewrite, and both rewrites reach the model.
    assert seen[0] == "pay with 4111-1111 please"
    assert seen[1] in ("pay with [card] please", "PAY WITH 4111-1111 PLEASE")
    sent = provider.requests[-1].messages[-1].content
    assert sent.split("\n")[0].upper() == "PAY WITH [CARD] PLEASE" and "shouted" in sent
