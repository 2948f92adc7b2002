"""Resilient tool execution through the engine: retries, turn timeout, breaker sharing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from bot.contracts.hookspecs import hookimpl
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolRetry
from bot.testing.app import scripted, settle, without_summary
from tests.conftest import AppFactory

FAST = ToolRetry(initial_delay=0.001, max_delay=0.002, max_total=1.0)


class Flaky:
    """``flaky`` fails transiently twice, then works; ``slow`` never finishes."""

    def __init__(self) -> None:
        self.calls = 0

    async def _flaky(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        self.calls += 1
        if self.calls <= 2:
            raise ToolError("upstream returned 503", code="HTTP_503", retryable=True)
        return "weather: sunny"

    async def _down(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        raise ConnectionError("connection refused")

    async def _slow(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        await asyncio.Event().wait()
        return "never"

    async def _quick(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        return "quick result"

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        schema: dict[str, Any] = {"type": "object", "properties": {}}
        return [Tool("flaky", "flaky weather", schema, self._flaky, retry=FAST),
                Tool("down", "always down", schema, self._down, retry=FAST),
                Tool("slow", "never ends", schema, self._slow, timeout=60),
                Tool("quick", "instant", schema, self._quick)]


def call(name: str) -> dict[str, Any]:
    return {"name": name, "arguments": {}}


async def test_transient_failures_are_retried_invisibly(make_app: AppFactory) -> None:
    flaky = Flaky()
    provider = scripted({"steps": [{"tool_calls": [call("flaky")]}, {"reply": "It's sunny."}]})
    app, channel, log = await make_app(provider, flaky)
    await channel.say("weather?")
    await settle(app)
    assert flaky.calls == 3
    tool_msgs = [m for m in provider.requests[1].messages if m.role == "tool"]
    assert [without_summary(m.content) for m in tool_msgs] == ["weather: sunny"]
    assert [e.type for e in log.events].count("tool.call") == 1  # retries emit no events
    run = (await app.store.runs("default:test:direct:u1"))[0]
    span = next(s for s in await app.store.spans(run.run_id) if s.kind == "tool")
    assert span.attributes["attempts"] == 3
    assert [d["decision"] for d in span.attributes["decisions"]][:2] == ["retry", "retry"]


async def test_turn_timeout_keeps_finished_results_and_tells_model_and_user(
    make_app: AppFactory,
) -> None:
    provider = scripted({"steps": [{"tool_calls": [call("quick"), call("slow")]},
                                   {"reply": "Partial answer."}]})
    app, channel, _ = await make_app(provider, Flaky(), turn_timeout=0.2)
    await channel.say("do both")
    await settle(app)
    quick, slow = [m for m in provider.requests[1].messages if m.role == "tool"]
    assert quick.content == "quick result" and not quick.is_error
    assert slow.is_error and "skipped" in slow.content.lower()
    notices = [m.text for m in channel.sent if m.kind == "notice"]
    assert len(notices) == 1 and "slow" in notices[0]
    assert channel.replies[-1] == "Partial answer."


async def test_an_open_breaker_is_shared_by_every_session(make_app: AppFactory) -> None:
    provider = scripted({"steps": [{"tool_calls": [call("down")]}, {"reply": "down"}]},
                        loop=True)
    app, channel, _ = await make_app(provider, Flaky())
    await channel.say("try", sender="alice")  # 5 transient failures open the breaker
    await settle(app)
    assert app.engine.breakers.get("down").state == "open"
    await channel.say("try", sender="bob")
    await settle(app)
    bob_result = [m for m in provider.requests[-1].messages if m.role == "tool"][-1]
    assert "CIRCUIT_OPEN" in bob_result.content or "circuit" in bob_result.content.lower()
    metrics = app.engine.tool_metrics.snapshot()["down"]
    assert metrics["circuit_breaker_opens"] == 1 and metrics["short_circuits"] >= 1


async def test_admins_see_tool_health_and_observers_get_metrics(make_app: AppFactory) -> None:
    provider = scripted({"steps": [{"tool_calls": [call("down")]}, {"reply": "down"}]},
                        loop=True)
    app, channel, log = await make_app(provider, Flaky(), admins=["test:boss"])
    await channel.say("try", sender="alice")
    await settle(app)
    result = next(e for e in log.events if e.type == "tool.result")
    assert result.payload["metrics"]["transient_error_count"] == 5
    await channel.say("/status", sender="alice")
    await channel.say("/status", sender="boss")
    await settle(app)
    alice, boss = channel.replies[-2:]
    assert "Tool health" not in alice
    assert "down: 5 errors (5 transient, 0 permanent), 4 retries" in boss
    assert "breaker open (opened 1x)" in boss
