"""The built-in ``sql`` tool, called the way the engine calls it."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from bot.config.settings import Settings
from bot.contracts import hookspecs
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolResult
from bot.engine.exec_summary import ExecutionSummary
from bot.tools.structured_errors import extract
from plugins import sql_tool
from workspaces import ensure_workspace, forget_workspace, workspace_dir

ROWS = 5


@pytest.fixture(autouse=True)
def _fresh_seed_cache() -> Iterator[None]:
    forget_workspace()
    yield
    forget_workspace()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def tool() -> Tool:
    return sql_tool.make_sql_tool(max_rows=ROWS, query_timeout=0.5)


@pytest.fixture
def ws(settings: Settings) -> Path:
    path = workspace_dir(settings.workspaces_dir, "telegram", "42")
    ensure_workspace(path)
    return path


def make_context(ws: Path, seconds: float = 30) -> ToolContext:
    return ToolContext(user_id="42", channel="telegram", chat_id="42",
                       session_key="telegram:42", run_id="run-1", workspace=ws,
                       deadline=time.monotonic() + seconds)


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return make_context(ws)


async def run(tool: Tool, ctx: ToolContext, query: str, *params: Any) -> str:
    args: dict[str, Any] = {"query": query}
    if params:
        args["params"] = list(params)
    result = await tool.execute(ctx, args)
    if isinstance(result, ToolResult):
        assert not result.is_error
        return result.content
    return result


async def fails(tool: Tool, ctx: ToolContext, query: str, **extra: Any) -> ToolError:
    with pytest.raises(ToolError) as exc:
        await tool.execute(ctx, {"query": query, **extra})
    return exc.value


async def shop(tool: Tool, ctx: ToolContext) -> None:
    """The spec's schema: sales references customers and products, and has rows."""
    await run(tool, ctx, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    await run(tool, ctx, "CREATE TABLE products (id INTEGER PRIMARY KEY, title TEXT)")
    await run(tool, ctx, "CREATE TABLE sales (id INTEGER PRIMARY KEY, "
              "customer_id INTEGER REFERENCES customers(id), "
              "product_id INTEGER REFERENCES products(id))")
    await run(tool, ctx, "INSERT INTO customers VALUES (1, 'Ann')")
    await run(tool, ctx, "INSERT INTO products VALUES (1, 'Tea')")
    await run(tool, ctx, "INSERT INTO sales VALUES (1, 1, 1)")


def tables(ws: Path) -> list[str]:
    with sqlite3.connect(ws / sql_tool.DB_FILE) as conn:
        return [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


# --- the plugin --------------------------------------------------------------------------


def test_plugin_offers_the_sql_tool_through_the_hook(settings: Settings) -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(sql_tool, name="plugins.sql_tool")
    (offered,) = pm.hook.roost_tools(settings=settings, services=None)
    assert [t.name for t in offered] == ["sql"]
    schema = offered[0].input_schema
    assert schema["required"] == ["query"]
    assert set(schema["properties"]) == {"query", "params"}


def test_sql_is_a_built_in_plugin() -> None:
    from bot.pluginhost.manager import BUILTIN_PLUGINS

    assert "plugins.sql_tool" in BUILTIN_PLUGINS


# --- statements and results ----------------------------------------------------------------


async def test_the_database_lives_in_the_workspace(tool: Tool, ctx: ToolContext,
                                                   ws: Path) -> None:
    assert await run(tool, ctx, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)") == "OK."
    assert (ws / "data.sqlite3").is_file()
    assert tables(ws) == ["t"]


async def test_writes_report_rows_affected_and_commit(tool: Tool, ctx: ToolContext,
                                                      ws: Path) -> None:
    await run(tool, ctx, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
    out = await run(tool, ctx, "INSERT INTO t (name) VALUES (?), (?)", "a", "b")
    assert out == "OK: 2 rows affected. Last inserted rowid: 2."
    assert await run(tool, ctx, "UPDATE t SET name = 'c' WHERE id = 1") == \
        "OK: 1 row affected."
    with sqlite3.connect(ws / sql_tool.DB_FILE) as conn:  # committed, visible to others
        assert conn.execute("SELECT name FROM t ORDER BY id").fetchall() == [("c",), ("b",)]


async def test_queries_return_columns_and_rows_as_json(tool: Tool, ctx: ToolContext) -> None:
    await run(tool, ctx, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, data BLOB)")
    await run(tool, ctx, "INSERT INTO t VALUES (1, 'Ann', x'0102'), (2, NULL, NULL)")
    result = json.loads(await run(tool, ctx, "SELECT * FROM t WHERE id >= ? ORDER BY id", 1))
    assert result == {"columns": ["id", "name", "data"],
                      "rows": [[1, "Ann", "<blob, 2 bytes>"], [2, None, None]],
                      "row_count": 2}


async def test_queries_return_at_most_the_row_cap_and_say_so(tool: Tool,
                                                             ctx: ToolContext) -> None:
    await run(tool, ctx, "CREATE TABLE n (i INTEGER)")
    await run(tool, ctx, "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
              "WHERE i < 50) INSERT INTO n SELECT i FROM r")
    result = json.loads(await run(tool, ctx, "SELECT i FROM n ORDER BY i"))
    assert result["rows"] == [[i] for i in range(1, ROWS + 1)]
    assert result["row_count"] == ROWS
    assert result["truncated"] is True
    assert "LIMIT" in result["note"]
    exact = json.loads(await run(tool, ctx, f"SELECT i FROM n LIMIT {ROWS}"))
    assert "truncated" not in exact


async def test_foreign_keys_are_enforced(tool: Tool, ctx: ToolContext) -> None:
    await shop(tool, ctx)
    err = await fails(tool, ctx, "INSERT INTO sales VALUES (2, 99, 1)")
    assert err.code == "SQLITE_CONSTRAINT_FOREIGNKEY"
    assert err.details["error_type"] == "foreign_key_constraint"
    assert err.details["affected_resources"] == ["sales"]
    assert err.details["dependencies"] == ["customers", "products"]
    assert "Insert the referenced row into customers, products first" in \
        err.details["suggested_actions"]


# --- the spec's scenario ------------------------------------------------------------------


async def test_dropping_tables_with_foreign_keys_plays_out_as_in_the_spec(
    tool: Tool, ctx: ToolContext, ws: Path
) -> None:
    await shop(tool, ctx)
    summary = ExecutionSummary()

    async def call(query: str) -> None:
        try:
            out = await run(tool, ctx, query)
        except ToolError as exc:
            summary.record("sql", {"query": query}, False, str(exc),
                           extract(str(exc), code=exc.code, details=exc.details))
        else:
            summary.record("sql", {"query": query}, True, out)

    # 1-2: the parents are still referenced by rows in sales.
    for parent in ("customers", "products"):
        err = await fails(tool, ctx, f"DROP TABLE {parent}")
        assert err.code == "SQLITE_CONSTRAINT_FOREIGNKEY"
        assert str(err).startswith("FOREIGN KEY constraint failed")
        assert err.details["error_type"] == "foreign_key_constraint"
        assert err.details["affected_resources"] == [parent]
        assert err.details["dependencies"] == ["sales"]
        assert err.details["suggested_actions"][0] == "Drop dependent tables first: sales"
        assert not err.retryable
        await call(f"DROP TABLE {parent}")
    assert tables(ws) == ["customers", "products", "sales"]

    # 3: the child goes; 4: the summary shows the blockers are gone; 5: the retries succeed.
    await call("DROP TABLE sales")
    text = summary.render()
    assert "- sql: DROP TABLE customers → FAILED (foreign_key_constraint; blocked by: sales)" \
        in text
    assert "- sql: DROP TABLE sales → SUCCESS (dropped table sales)" in text
    assert 'After sql "DROP TABLE customers" failed (blocked by sales): dropped table sales.' \
        in text
    assert 'After sql "DROP TABLE products" failed (blocked by sales): dropped table sales.' \
        in text
    assert await run(tool, ctx, "DROP TABLE customers") == "OK."
    assert await run(tool, ctx, "DROP TABLE products") == "OK."
    assert tables(ws) == []


async def test_a_referencing_table_without_referencing_rows_is_not_a_dependency(
    tool: Tool, ctx: ToolContext
) -> None:
    await shop(tool, ctx)
    await run(tool, ctx, "CREATE TABLE refunds (id INTEGER PRIMARY KEY, "
              "customer_id INTEGER REFERENCES customers(id))")
    await run(tool, ctx, "CREATE TABLE notes (id INTEGER PRIMARY KEY, "
              "about INTEGER REFERENCES customers)")  # implicit primary key
    await run(tool, ctx, "INSERT INTO notes VALUES (1, 1)")
    err = await fails(tool, ctx, "DROP TABLE customers")
    assert err.details["dependencies"] == ["notes", "sales"]


async def test_deleting_referenced_rows_names_the_referencing_tables(
    tool: Tool, ctx: ToolContext
) -> None:
    await shop(tool, ctx)
    err = await fails(tool, ctx, "DELETE FROM customers WHERE id = 1")
    assert err.details["dependencies"] == ["sales"]
    assert "rows in sales still reference customers" in str(err)


# --- errors ---------------------------------------------------------------------------------


async def test_syntax_errors_are_structured(tool: Tool, ctx: ToolContext) -> None:
    err = await fails(tool, ctx, "SELEC * FROM t")
    assert err.code == "SQLITE_ERROR"
    assert str(err) == 'near "SELEC": syntax error'
    assert err.details["error_type"] == "syntax_error"
    assert err.details["error_code"] == "SQLITE_ERROR"
    assert 'near "SELEC"' in err.details["suggested_actions"][0]


async def test_missing_and_existing_tables_are_structured(tool: Tool, ctx: ToolContext) -> None:
    err = await fails(tool, ctx, "SELECT * FROM nowhere")
    assert (err.details["error_type"], err.details["affected_resources"]) == (
        "resource_not_found", ["nowhere"])
    await run(tool, ctx, "CREATE TABLE t (id INTEGER)")
    err = await fails(tool, ctx, "CREATE TABLE t (id INTEGER)")
    assert (err.details["error_type"], err.details["affected_resources"]) == (
        "resource_exists", ["t"])


async def test_attach_is_refused_and_no_file_is_created(tool: Tool, ctx: ToolContext,
                                                        tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    err = await fails(tool, ctx, f"ATTACH DATABASE '{other}' AS other")
    assert err.code == "NOT_ALLOWED"
    assert "ATTACH" in str(err)
    assert err.details["error_type"] == "permission_denied"
    err = await fails(tool, ctx, f"VACUUM INTO '{other}'")
    assert err.code == "NOT_ALLOWED"
    assert not other.exists()
    assert (await fails(tool, ctx, "DETACH DATABASE main")).code == "NOT_ALLOWED"
    assert (await fails(tool, ctx, "SELECT load_extension('x')")).code == "NOT_ALLOWED"
    assert await run(tool, ctx, "VACUUM") == "OK."


async def test_a_runaway_query_is_stopped_at_the_time_limit(tool: Tool,
                                                            ctx: ToolContext) -> None:
    err = await fails(tool, ctx, "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL "
                      "SELECT i + 1 FROM r) SELECT count(*) FROM r")
    assert err.code == "TIMEOUT"
    assert err.details["error_type"] == "timeout"
    assert await run(tool, ctx, "SELECT 1 AS one") == '{"columns":["one"],"rows":[[1]],' \
        '"row_count":1}'


async def test_the_time_limit_shrinks_to_the_runs_deadline(ws: Path) -> None:
    patient = sql_tool.make_sql_tool(query_timeout=5)
    err = await fails(patient, make_context(ws, seconds=0.2), "WITH RECURSIVE r(i) AS "
                      "(SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r")
    assert err.code == "TIMEOUT"
    limit = re.search(r"after its ([\d.e-]+)s time limit", str(err))
    assert limit is not None and float(limit.group(1)) <= 0.2  # not the tool's 5 s


async def test_cancelling_the_call_stops_the_statement(ctx: ToolContext) -> None:
    slow = sql_tool.make_sql_tool(query_timeout=30)
    await run(slow, ctx, "CREATE TABLE n (i INTEGER)")
    # An endless write holds the database's write lock while it runs.
    endless = ("INSERT INTO n WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL "
               "SELECT i + 1 FROM r) SELECT i FROM r")
    task = asyncio.create_task(run(slow, ctx, endless))
    # No event marks the worker's start; if it has not started, the cancel is trivially fine.
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Were the worker still writing, this would wait out the busy timeout and fail.
    assert await run(slow, ctx, "INSERT INTO n VALUES (0)") == \
        "OK: 1 row affected. Last inserted rowid: 1."


async def test_one_statement_per_call(tool: Tool, ctx: ToolContext, ws: Path) -> None:
    err = await fails(tool, ctx, "CREATE TABLE a (id INT); CREATE TABLE b (id INT)")
    assert err.code == "MULTIPLE_STATEMENTS"
    assert tables(ws) == []
    assert await run(tool, ctx, "CREATE TABLE a (id INT); -- trailing comment") == "OK."


async def test_transaction_statements_are_refused(tool: Tool, ctx: ToolContext) -> None:
    for query in ("BEGIN", "  commit", "-- c\nROLLBACK", "SAVEPOINT s"):
        assert (await fails(tool, ctx, query)).code == "TRANSACTION_CONTROL"


@pytest.mark.parametrize("args", [
    {},
    {"query": ""},
    {"query": 1},
    {"query": "SELECT ?", "params": "x"},
    {"query": "SELECT ?", "params": [{"a": 1}]},
    {"query": "SELECT 1", "database": "other.db"},
])
async def test_bad_arguments_are_refused(tool: Tool, ctx: ToolContext,
                                         args: dict[str, Any]) -> None:
    with pytest.raises(ToolError) as exc:
        await tool.execute(ctx, args)
    assert exc.value.code == "INVALID_ARGUMENT"


async def test_wrong_parameter_count_is_explained(tool: Tool, ctx: ToolContext) -> None:
    err = await fails(tool, ctx, "SELECT ?, ?", params=[1])
    assert err.code == "INVALID_ARGUMENT"
    assert "params" in str(err)


async def test_each_user_has_their_own_database(tool: Tool, ctx: ToolContext,
                                                settings: Settings) -> None:
    await run(tool, ctx, "CREATE TABLE mine (id INT)")
    other_ws = workspace_dir(settings.workspaces_dir, "telegram", "7")
    ensure_workspace(other_ws)
    err = await fails(tool, make_context(other_ws), "SELECT * FROM mine")
    assert err.details["error_type"] == "resource_not_found"


async def test_a_symlinked_database_outside_the_workspace_is_refused(
    tool: Tool, ctx: ToolContext, ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.sqlite3"
    (ws / sql_tool.DB_FILE).symlink_to(outside)
    err = await fails(tool, ctx, "CREATE TABLE t (id INT)")
    assert err.code == "UNSAFE_FILE"
    assert not outside.exists()


async def test_concurrent_calls_on_one_database_are_serialised(tool: Tool,
                                                               ctx: ToolContext) -> None:
    await run(tool, ctx, "CREATE TABLE c (n INTEGER)")
    await run(tool, ctx, "INSERT INTO c VALUES (0)")
    await asyncio.gather(*(run(tool, ctx, "UPDATE c SET n = n + 1") for _ in range(20)))
    assert json.loads(await run(tool, ctx, "SELECT n FROM c"))["rows"] == [[20]]
