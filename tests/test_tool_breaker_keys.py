"""Tool breakers divided by a ``breaker_key``: each key opens and pauses on its own; tools
without one keep one breaker for every caller (tests/test_tool_exec.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.contracts.tools import ToolContext, ToolRetry
from bot.tools.breakers import Breakers
from tests.test_tool_exec import FakeTime, HTTPError, Scripted, call, context, executor, fake, run
from tests.test_tool_exec import tool as make_tool

__all__ = ["context", "fake"]  # the fixtures, used by name

ONCE = ToolRetry(max_attempts=1)


def by_user_and_host(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    return f"{ctx.user_id} {args.get('host', '')}"


async def test_a_keyed_tool_opens_only_the_failing_keys_breaker(
        fake: FakeTime, context: ToolContext, tmp_path: Path) -> None:
    body = Scripted(*([HTTPError("down", 503)] * 5), "up")
    ex = executor([make_tool("fetch", body, retry=ONCE, breaker_key=by_user_and_host)], fake)
    for _ in range(5):
        await run(ex, context, call("fetch", host="a"))
    [paused] = await run(ex, context, call("fetch", host="a"))
    assert paused.error is not None and paused.error.code == "CIRCUIT_OPEN"
    assert body.runs == 5
    other_user = ToolContext("u2", "test", "c2", "default:test:direct:u2", "run-2", tmp_path,
                             1e12)
    [fine] = await run(ex, other_user, call("fetch", host="a"))
    assert fine.content == "up"
    [other_host] = await run(ex, context, call("fetch", host="b"))
    assert other_host.content == "up"
    snapshot = ex.breakers.snapshot()["fetch"]
    assert (snapshot["state"], snapshot["keys"], snapshot["keys_open"]) == ("open", 3, 1)


async def test_a_key_function_that_raises_falls_back_to_the_tools_breaker(
        fake: FakeTime, context: ToolContext) -> None:
    def broken(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        raise KeyError("host")

    ex = executor([make_tool("fetch", Scripted("ok"), breaker_key=broken)], fake,
                  breakers=Breakers(clock=fake.clock))
    [outcome] = await run(ex, context, call("fetch"))
    assert outcome.content == "ok"
    assert ex.breakers.snapshot() == {"fetch": ex.breakers.get("fetch").snapshot()}
