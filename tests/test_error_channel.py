"""The error channel end to end: short summary + ID to the model, full detail on request."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from bot.contracts.hookspecs import hookimpl
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.testing.app import scripted, settle, without_summary
from tests.conftest import AppFactory

LONG_ERROR = ("permission denied for table invoices\nDETAIL: role 'bot' lacks SELECT\n"
              + "stack line\n" * 200)


class Tools:
    @staticmethod
    async def _billing(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        raise ToolError(LONG_ERROR, code="EACCES")

    @staticmethod
    async def _dump(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        return "".join(f"line {i:05d}\n" for i in range(3_000))  # 33,000 chars

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        schema: dict[str, Any] = {"type": "object", "properties": {}}
        return [Tool("billing", "reads invoices", schema, self._billing),
                Tool("dump", "a big listing", schema, self._dump)]


async def test_a_failure_costs_few_tokens_and_its_detail_is_one_call_away(
    make_app: AppFactory,
) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [{"name": "billing", "arguments": {}}]},
        {"tool_calls": [{"name": "get_error_detail", "arguments": {"error_id": "{error_id}"}}]},
        {"reply": "The bot role cannot read invoices."}]})
    app, channel, _ = await make_app(provider, Tools())
    await channel.say("show my invoices")
    await settle(app)
    failure = [m for m in provider.requests[1].messages if m.role == "tool"][-1]
    assert failure.is_error
    # The execution summary is read after the results (the request's note).
    assert "- billing → FAILED (permission_denied; invoices)" in provider.requests[1].note
    failure = dataclasses.replace(failure, content=without_summary(failure.content))
    assert failure.content.startswith("Tool 'billing' failed: Code EACCES: permission denied "
                                      "for table invoices\n[Error ID: err_")
    assert "get_error_detail" in failure.content and len(failure.content) < 300
    detail = [m for m in provider.requests[2].messages if m.role == "tool"][-1]
    data = json.loads(without_summary(detail.content))
    assert data["raw_error"]["message"] == LONG_ERROR  # nothing lost
    assert channel.replies == ["The bot role cannot read invoices."]
    stored = await app.services.errors.list(session_id="default:test:direct:u1")
    assert [e.tool_name for e in stored] == ["billing"]


async def test_errors_of_another_session_stay_hidden(make_app: AppFactory) -> None:
    provider = scripted(
        {"match": "^fail$", "steps": [{"tool_calls": [{"name": "billing", "arguments": {}}]},
                                      {"reply": "failed"}]},
        {"match": "^peek (.+)$", "steps": [
            {"tool_calls": [{"name": "get_error_detail",
                             "arguments": {"error_id": "{message}"}}]},
            {"reply": "peeked"}]})
    app, channel, _ = await make_app(provider, Tools())
    await channel.say("fail", sender="alice")
    await settle(app)
    errors = await app.services.errors.list()
    await channel.say(f"peek {errors[0].id}", sender="mallory")
    await settle(app)
    result = [m for m in provider.requests[-1].messages if m.role == "tool"][-1]
    assert "ERROR_NOT_FOUND" in result.content and "permission" not in result.content


async def test_large_results_are_stored_and_read_in_slices(make_app: AppFactory) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [{"name": "dump", "arguments": {}}]},
        {"tool_calls": [{"name": "get_tool_result",
                         "arguments": {"result_id": "{result_id}", "offset": 2000}}]},
        {"reply": "read it"}]})
    app, channel, _ = await make_app(provider, Tools())
    await channel.say("dump it")
    await settle(app)
    preview = [m for m in provider.requests[1].messages if m.role == "tool"][-1]
    assert preview.content.startswith("line 00000\n") and len(preview.content) < 2_300
    assert "33,000" in preview.content or "33000" in preview.content
    page = [m for m in provider.requests[2].messages if m.role == "tool"][-1]
    # Lines are 11 chars: offset 2,000 is 9 chars into line 181, right where the preview ended.
    assert page.content.startswith("1\nline 00182\n")
    assert preview.content.split("\n\n[Result")[0].endswith("line 00180\nline 0018")


def sql(query: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "sql", "arguments": {"query": query}}]}


async def test_dropping_tables_with_foreign_keys_plays_out_through_the_engine(
    make_app: AppFactory, tmp_path: Any
) -> None:
    provider = scripted({"steps": [
        sql("CREATE TABLE customers (id INTEGER PRIMARY KEY)"),
        sql("CREATE TABLE sales (id INTEGER PRIMARY KEY, "
            "customer_id INTEGER REFERENCES customers(id))"),
        sql("INSERT INTO customers VALUES (1)"),
        sql("INSERT INTO sales VALUES (10, 1)"),
        sql("DROP TABLE customers"),
        {"tool_calls": [{"name": "get_error_detail", "arguments": {"error_id": "{error_id}"}}]},
        sql("DROP TABLE sales"),
        sql("DROP TABLE customers"),
        {"reply": "Dropped sales, then customers."}]})
    app, channel, _ = await make_app(provider)
    await channel.say("drop the customers table")
    await settle(app)
    failed = without_summary(
        [m for m in provider.requests[5].messages if m.role == "tool"][-1].content)
    assert failed.startswith("Tool 'sql' failed: ")
    assert "[type: foreign_key_constraint; depends on: sales; " \
           "suggested: Drop dependent tables first: sales]" in failed
    detail = json.loads(without_summary(
        [m for m in provider.requests[6].messages if m.role == "tool"][-1].content))
    assert detail["raw_error"]["dependencies"] == ["sales"]
    summary = provider.requests[8].note
    assert "<TOOL_EXECUTION_SUMMARY>" in summary and "FAILED" in summary
    assert channel.replies == ["Dropped sales, then customers."]
    check = scripted({"steps": [sql("SELECT name FROM sqlite_master"), {"reply": "x"}]})
    app.engine.provider = check
    await channel.say("what tables?")
    await settle(app)
    tables = without_summary([m for m in check.requests[1].messages
                              if m.role == "tool"][-1].content)
    assert "customers" not in tables and "sales" not in tables


async def test_admins_read_errors_in_chat_and_operators_on_the_command_line(
    make_app: AppFactory, tmp_path: Any
) -> None:
    import subprocess

    from tests.cli_forks import run_roost
    from tests.test_cli import clean_env

    provider = scripted({"steps": [{"tool_calls": [{"name": "billing", "arguments": {}}]},
                                   {"reply": "failed"}]})
    app, channel, _ = await make_app(provider, Tools(), admins=["test:boss"])
    await channel.say("bill me", sender="alice")
    await settle(app)
    (error,) = await app.services.errors.list()
    await channel.say(f"/errors {error.id}", sender="alice")
    await channel.say(f"/errors {error.id}", sender="boss")
    await channel.say("/errors", sender="boss")
    await settle(app)
    refused, detail, listing = channel.replies[-3:]
    assert refused == "/errors is for admins only."
    assert detail.startswith(f"{error.id} at ") and "permission denied" in detail
    assert listing.startswith("Latest tool errors:\n" + error.id)
    await app.close()

    def roost(*args: str) -> subprocess.CompletedProcess[str]:
        return run_roost(list(args), cwd=tmp_path, env=clean_env(), timeout=60)

    listed = roost("errors", "list", "--tool", "billing", "--since", "1h")
    assert listed.returncode == 0 and error.id in listed.stdout
    assert "permission denied" in listed.stdout
    assert roost("errors", "list", "--tool", "other").stdout.strip() == "no errors match"
    shown = roost("errors", "show", error.id)
    assert json.loads(shown.stdout)["error"]["message"] == LONG_ERROR
    assert roost("errors", "show", "err_nope").returncode == 1


async def test_a_daily_job_deletes_errors_past_their_retention(make_app: AppFactory) -> None:
    import time

    from bot.contracts.jobs import JobSpec
    from bot.storage.errors import ErrorStore

    app, _, _ = await make_app(scripted({"reply": "x"}), error_retention_days=30)
    old = ErrorStore(app.store.db, app.store.lock, clock=lambda: time.time() - 31 * 86400)
    await old.store("s", "billing", "ancient failure")
    await old.flush()
    assert app.services.errors is not None
    await app.services.errors.store("s", "billing", "fresh failure")
    await app.services.errors.flush()
    jobs = [j for j in await app.host.collect("roost_scheduled_jobs", settings=app.settings)
            if isinstance(j, JobSpec) and j.name == "error-retention"]
    assert [j.schedule for j in jobs] == ["every 24h"]
    await jobs[0].func(app.runtime)
    remaining = await app.services.errors.list()
    assert [e.raw_error["message"] for e in remaining] == ["fresh failure"]
