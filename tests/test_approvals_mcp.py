"""MCP tools their server marks destructive (and not read-only) wait for approval, through
a real server written with the MCP SDK, unless the server's configuration trusts them."""

from __future__ import annotations

from typing import Any

from bot.testing.app import ChatChannel
from tests.test_approvals import is_prompt, press
from tests.test_mcp import call, eventually, make, offered, stdio

__all__ = ["make"]  # the fixture


async def test_a_destructive_mcp_tool_asks_and_a_read_only_one_does_not(make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__wipe", {"path": "/srv/db"}, "wiped"),
         call("toolbox__peek", {"path": "/srv/db"}, "peeked")],
        mcp={"servers": {"toolbox": stdio(startup="eager")}})
    await eventually(lambda: "toolbox__wipe" in offered(chat.app), "tools listed")
    await chat.say("wipe it")
    prompt = await chat.wait_for_message(is_prompt, 30)
    assert "toolbox__wipe" in prompt.text and "/srv/db" in prompt.text
    assert chat.tool_results("toolbox__wipe") == []
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    await chat.settle(30)
    assert chat.tool_results("toolbox__wipe") == ["wiped /srv/db"]
    assert await chat.ask("peek at it") == ["peeked"]
    assert chat.tool_results("toolbox__peek") == ["peeked /srv/db"]
    assert sum(1 for m in chat.sent if m.buttons) == 1
    # readOnlyHint makes the tool read-only (an edit may restart a run that called it).
    assert [(e.payload["name"], e.payload["read_only"]) for e in chat.events
            if e.type == "tool.call"] == [("toolbox__wipe", False), ("toolbox__peek", True)]


async def test_a_server_configured_approve_false_is_trusted(make: Any) -> None:
    chat: ChatChannel = await make(
        [call("toolbox__wipe", {"path": "/tmp/scratch"}, "wiped")],
        mcp={"servers": {"toolbox": stdio(startup="eager", approve=False)}})
    await eventually(lambda: "toolbox__wipe" in offered(chat.app), "tools listed")
    assert await chat.ask("wipe it") == ["wiped"]
    assert chat.tool_results("toolbox__wipe") == ["wiped /tmp/scratch"]
    assert not any(m.buttons for m in chat.sent)
