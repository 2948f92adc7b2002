"""Whole runs over the real SDKs: the engine, the provider plugins and local fake APIs."""

from __future__ import annotations

import asyncio

from bot.testing.anthropic import FakeAnthropic, ToolUse
from bot.testing.app import settle
from bot.testing.openai import FakeOpenAI, FunctionCall
from plugins.provider_retry import RetryPolicy
from tests.conftest import AppFactory


async def test_claude_tool_loop_end_to_end(make_app: AppFactory) -> None:
    async with FakeAnthropic() as fake:
        fake.reply_tool_calls(ToolUse("write_file", {"path": "a.txt", "content": "hi"}),
                              text="Writing.")
        fake.reply_text("All done.")
        app, channel, log = await make_app(
            None, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url, model="claude-test")
        await channel.say("write a file")
        await settle(app)
        assert channel.replies == ["All done."]
        first, second = fake.requests
        assert first.body["model"] == "claude-test"
        assert "write_file" in {t["name"] for t in first.body["tools"]}
        tool_result = second.body["messages"][-1]["content"][0]
        assert tool_result["type"] == "tool_result" and "a.txt" in tool_result["content"]
        session = await app.store.get("default:test:direct:u1")
        assert session.input_tokens > 0 and session.provider == "anthropic"
        assert "chunk" in log.types()


async def test_claude_overload_is_retried_and_reported_as_run_retrying(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.fail(529)
        fake.reply_text("Recovered.")
        app, channel, log = await make_app(
            None, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url)
        real = await getattr(app.provider, "warm_up")()  # noqa: B009 - LazyProvider
        setattr(real, "retry", RetryPolicy(3, 0.01))  # noqa: B010 - a quick backoff
        await channel.say("hello")
        await settle(app)
        assert channel.replies == ["Recovered."]
        retrying = [e for e in log.events if e.type == "run.retrying"]
        assert len(retrying) == 1
        assert retrying[0].payload["attempt"] == 2 and retrying[0].payload["maxAttempts"] == 3


async def test_stop_cancels_a_slow_claude_stream_and_closes_the_connection(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.reply_text(["slow "] * 200, chunk_delay=0.05)
        app, channel, log = await make_app(
            None, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url)
        await channel.say("take your time")
        await log.wait_for("chunk")
        await channel.say("/stop")
        await settle(app)
        await asyncio.wait_for(fake.disconnected.wait(), 5)
        assert channel.replies == ["Stopped."]
        assert (await app.store.get("default:test:direct:u1")).messages == []


async def test_local_model_tool_loop_over_openai_compatible_api(make_app: AppFactory) -> None:
    async with FakeOpenAI() as fake:
        fake.reply_tool_calls(FunctionCall("list_files", {}))
        fake.reply_text("Your workspace has the usual files.")
        app, channel, _ = await make_app(
            None, provider="openai", openai_base_url=fake.base_url, model="llama3")
        await channel.say("what files do I have?")
        await settle(app)
        assert channel.replies == ["Your workspace has the usual files."]
        second = fake.requests[1].body["messages"]
        assert second[0]["role"] == "system"
        assert second[-1]["role"] == "tool" and "AGENTS.md" in second[-1]["content"]
