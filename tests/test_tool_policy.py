"""Tool policies: profiles, allow/deny lists, plugin groups, and hidden-tool calls."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bot.agents.tool_policy import PROFILES, ToolPolicy
from bot.config.settings import Settings
from bot.contracts.llm import ToolCall
from bot.contracts.tools import Tool, ToolContext
from bot.observability.tracing import RunTrace
from bot.tools.executor import ToolExecutor


async def _ok(context: ToolContext, args: Mapping[str, Any]) -> str:
    return "ok"


def make(name: str) -> Tool:
    return Tool(name, f"The {name} tool.", {"type": "object", "properties": {}}, execute=_ok)


GROUPS = {
    "read_file": "file_tools", "write_file": "file_tools", "list_files": "file_tools",
    "edit_file": "file_tools",
    "sql": "sql_tool",
    "get_error_detail": "error_tools", "get_tool_result": "error_tools",
    "memory_search": "memory", "memory_get": "memory",
    "cron": "cron",
    "web_fetch": "web",
}
TOOLS = {name: make(name) for name in GROUPS}


def names(policy: ToolPolicy, tools: Mapping[str, Tool] = TOOLS,
          groups: Mapping[str, str] = GROUPS) -> set[str]:
    return set(policy.filter(tools, groups))


def test_full_profile_offers_every_tool() -> None:
    assert names(ToolPolicy()) == set(TOOLS)
    assert list(ToolPolicy().filter(TOOLS, GROUPS)) == list(TOOLS)  # order kept


def test_coding_profile() -> None:
    assert names(ToolPolicy("coding")) == {
        "read_file", "write_file", "list_files", "edit_file", "sql",
        "get_error_detail", "get_tool_result",
    }


def test_messaging_profile_has_no_file_writes() -> None:
    got = names(ToolPolicy("messaging"))
    assert got == {"read_file", "list_files", "memory_search", "memory_get",
                   "get_error_detail", "get_tool_result", "cron"}
    assert not got & {"write_file", "edit_file", "sql"}


def test_minimal_profile() -> None:
    assert names(ToolPolicy("minimal")) == {"get_error_detail", "get_tool_result"}


def test_profiles_are_data() -> None:
    assert set(PROFILES) == {"full", "coding", "messaging", "minimal"}
    assert PROFILES["full"] is None


def test_unknown_profile_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown tool profile"):
        ToolPolicy("everything")


def test_profile_only_keeps_registered_tools() -> None:
    tools = {"read_file": TOOLS["read_file"]}
    assert names(ToolPolicy("coding"), tools) == {"read_file"}


def test_allow_adds_beyond_the_profile() -> None:
    assert names(ToolPolicy("minimal", allow=("web_fetch", "sql"))) == {
        "get_error_detail", "get_tool_result", "web_fetch", "sql",
    }


def test_deny_removes_from_the_profile() -> None:
    assert "sql" not in names(ToolPolicy("coding", deny=("sql",)))
    assert names(ToolPolicy(deny=("cron",))) == set(TOOLS) - {"cron"}


def test_deny_wins_over_allow() -> None:
    got = names(ToolPolicy("minimal", allow=("sql", "web_fetch"), deny=("sql",)))
    assert got == {"get_error_detail", "get_tool_result", "web_fetch"}


def test_groups_in_allow_and_deny() -> None:
    assert names(ToolPolicy("minimal", allow=("group:memory",))) == {
        "get_error_detail", "get_tool_result", "memory_search", "memory_get",
    }
    assert names(ToolPolicy(deny=("group:file_tools",))) == set(TOOLS) - {
        "read_file", "write_file", "list_files", "edit_file",
    }


def test_group_deny_wins_over_named_allow() -> None:
    got = names(ToolPolicy("minimal", allow=("write_file", "web_fetch"),
                           deny=("group:file_tools",)))
    assert got == {"get_error_detail", "get_tool_result", "web_fetch"}


def test_tool_without_a_group_is_not_in_any_group() -> None:
    tools = {**TOOLS, "loose": make("loose")}
    assert "loose" in names(ToolPolicy(), tools)
    assert "loose" in names(ToolPolicy(deny=("group:file_tools",)), tools)


def test_unknown_names_and_groups_are_ignored_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="roost.agents.tool_policy"):
        got = names(ToolPolicy("minimal", allow=("nope", "group:ghost"),
                               deny=("missing", "group:phantom")))
    assert got == {"get_error_detail", "get_tool_result"}
    text = caplog.text
    for name in ("'nope'", "'ghost'", "'missing'", "'phantom'"):
        assert name in text


def test_lists_are_accepted_and_stored_as_tuples() -> None:
    policy = ToolPolicy("minimal", allow=["sql"], deny=["cron"])  # type: ignore[arg-type]
    assert policy.allow == ("sql",) and policy.deny == ("cron",)
    assert names(policy) == {"get_error_detail", "get_tool_result", "sql"}


async def test_hidden_tool_called_anyway_is_an_unknown_tool(tmp_path: Path) -> None:
    allowed = ToolPolicy("messaging").filter(TOOLS, GROUPS)
    assert "write_file" not in allowed
    executor = ToolExecutor(allowed, Settings())
    context = ToolContext("u1", "test", "c1", "default:test:direct:u1", "run-1", tmp_path,
                          deadline=1e12)
    calls = [ToolCall("c-1", "write_file", {"path": "a.md", "content": "x"}),
             ToolCall("c-2", "read_file", {})]
    hidden, visible = await executor.run_batch(calls, context, trace=RunTrace("run-1", "s"))
    assert hidden.is_error and hidden.attempts == 0
    assert hidden.error is not None and hidden.error.code == "UNKNOWN_TOOL"
    assert "Unknown tool 'write_file'" in hidden.content
    assert "write_file" not in hidden.content.split("Available tools:")[1]
    assert not visible.is_error and visible.content == "ok"
