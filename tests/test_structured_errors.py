"""Structured error extraction, the tool execution summary and the error-handling prompt."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import Order, PromptContext, PromptSection
from bot.engine.exec_summary import MAX_ENTRIES, ExecutionSummary, parse_statement
from bot.tools.structured_errors import ERROR_TYPES, StructuredError, extract
from plugins import prompt_sections

# (message, error_type, affected_resources, dependencies)
DIALECTS: list[tuple[str, str, list[str], list[str]]] = [
    # SQLite
    ("FOREIGN KEY constraint failed", "foreign_key_constraint", [], []),
    ("no such table: main.orders", "resource_not_found", ["orders"], []),
    ("table users already exists", "resource_exists", ["users"], []),
    ('near "SELEC": syntax error', "syntax_error", [], []),
    ("UNIQUE constraint failed: users.email", "resource_exists", ["users"], []),
    ("attempt to write a readonly database", "permission_denied", [], []),
    ("database is locked", "timeout", [], []),
    # PostgreSQL
    ('update or delete on table "customers" violates foreign key constraint '
     '"sales_customer_id_fkey" on table "sales"',
     "foreign_key_constraint", ["customers"], ["sales"]),
    ('insert or update on table "sales" violates foreign key constraint "sales_fk"\n'
     'DETAIL:  Key (customer_id)=(9) is not present in table "customers".',
     "foreign_key_constraint", ["sales"], ["customers"]),
    ('relation "orders" does not exist', "resource_not_found", ["orders"], []),
    ('relation "orders" already exists', "resource_exists", ["orders"], []),
    ('syntax error at or near "SELEC"', "syntax_error", [], []),
    ("permission denied for table payroll", "permission_denied", ["payroll"], []),
    ("ERROR:  cannot drop table customers because other objects depend on it\n"
     "DETAIL:  constraint sales_customer_id_fkey on table sales depends on table customers\n"
     "constraint refunds_fk on table refunds depends on table customers\n"
     "HINT:  Use DROP ... CASCADE to drop the dependent objects too.",
     "foreign_key_constraint", ["customers"], ["sales", "refunds"]),
    # MySQL
    ("ERROR 1451 (23000): Cannot delete or update a parent row: a foreign key constraint "
     "fails (`shop`.`sales`, CONSTRAINT `sales_ibfk_1` FOREIGN KEY (`customer_id`) "
     "REFERENCES `customers` (`id`))",
     "foreign_key_constraint", ["customers"], ["sales"]),
    ("Cannot drop table 'customers' referenced by a foreign key constraint 'sales_ibfk_1' "
     "on table 'sales'.", "foreign_key_constraint", ["customers"], ["sales"]),
    ("ERROR 1146 (42S02): Table 'shop.orders' doesn't exist",
     "resource_not_found", ["orders"], []),
    ("ERROR 1050 (42S01): Table 'orders' already exists", "resource_exists", ["orders"], []),
    ("ERROR 1064 (42000): You have an error in your SQL syntax; check the manual that "
     "corresponds to your MySQL server version for the right syntax to use near "
     "'TABLEE orders' at line 1", "syntax_error", [], []),
    ("ERROR 1045 (28000): Access denied for user 'bob'@'localhost' (using password: YES)",
     "permission_denied", [], []),
    # OS
    ("[Errno 2] No such file or directory: 'notes/x.md'",
     "resource_not_found", ["notes/x.md"], []),
    ("ENOENT: no such file or directory, open '/tmp/x'", "resource_not_found", ["/tmp/x"], []),
    ("[Errno 13] Permission denied: '/etc/shadow'", "permission_denied", ["/etc/shadow"], []),
    ("EEXIST: file already exists, mkdir 'out'", "resource_exists", ["out"], []),
    ("[Errno 111] Connection refused", "connection_error", [], []),
    ("Connection timed out", "timeout", [], []),
    # HTTP
    ("Client error '404 Not Found' for url 'https://api.example.com/items/9'",
     "resource_not_found", ["https://api.example.com/items/9"], []),
    ("401 Client Error: Unauthorized for url: https://api.example.com/me",
     "permission_denied", ["https://api.example.com/me"], []),
    ("403, message='Forbidden', url=URL('https://x.io/a')",
     "permission_denied", ["https://x.io/a"], []),
    ("HTTP 409 Conflict", "resource_exists", [], []),
    ("429 Too Many Requests", "connection_error", [], []),
    ("Server error '503 Service Unavailable' for url 'https://x.io/'",
     "connection_error", ["https://x.io/"], []),
    ("HTTP Error 504: Gateway Timeout", "timeout", [], []),
    ("ReadTimeout: the read operation timed out", "timeout", [], []),
]


@pytest.mark.parametrize(("message", "error_type", "affected", "dependencies"), DIALECTS,
                         ids=[m[:40] for m, *_ in DIALECTS])
def test_dialect_messages_yield_type_resources_and_dependencies(
    message: str, error_type: str, affected: list[str], dependencies: list[str]
) -> None:
    found = extract(message)
    assert found.error_type == error_type
    assert found.affected_resources == affected
    assert found.dependencies == dependencies
    assert found.message == message
    assert found.suggested_actions, "every classified error suggests something concrete"


def test_foreign_key_on_drop_suggests_dropping_the_dependents_first() -> None:
    found = extract("Cannot drop table 'customers' referenced by a foreign key constraint "
                    "'sales_ibfk_1' on table 'sales'.")
    assert found.suggested_actions[0] == "Drop dependent tables first: sales"
    assert any("ON DELETE CASCADE" in a and "sales_ibfk_1" in a
               for a in found.suggested_actions)
    assert found.suggested_actions[-1] == "Then retry dropping customers"


def test_error_codes_come_from_the_message_when_the_tool_gives_none() -> None:
    assert extract("ERROR 1146 (42S02): Table 'shop.orders' doesn't exist").error_code == "1146"
    assert extract("(1452, 'Cannot add or update a child row: a foreign key constraint "
                   "fails')").error_code == "1452"
    assert extract("SQLSTATE[23503]: Foreign key violation").error_code == "23503"
    assert extract("[Errno 2] No such file or directory: 'a'").error_code == "ENOENT"
    assert extract("Client error '404 Not Found' for url 'https://a.b/'").error_code == "HTTP_404"


def test_a_specific_tool_code_wins_over_the_message_code_but_a_generic_one_does_not() -> None:
    message = "ERROR 1146 (42S02): Table 'shop.orders' doesn't exist"
    assert extract(message, code="DB_MISSING").error_code == "DB_MISSING"
    assert extract(message, code="TOOL_ERROR").error_code == "1146"
    assert extract("odd", code="TOOL_ERROR").error_code == "TOOL_ERROR"


def test_the_tool_code_classifies_a_message_no_pattern_knows() -> None:
    found = extract("path '../x' resolves outside the workspace", code="PATH_ESCAPE")
    assert found.error_type == "permission_denied"
    assert found.suggested_actions
    assert extract("it took too long", code="TIMEOUT").error_type == "timeout"


def test_an_unknown_message_stays_intact_with_empty_fields() -> None:
    message = "  something odd happened\n  at line 3  "
    found = extract(message)
    assert found == StructuredError("", "unknown", message, [], [], [])


def test_exit_status_is_not_mistaken_for_an_http_status() -> None:
    assert extract("exit status 127").error_type == "unknown"


def test_tool_details_win_over_patterns_field_by_field() -> None:
    found = extract(
        "FOREIGN KEY constraint failed", code="SQLITE_CONSTRAINT_FOREIGNKEY",
        details={"affected_resources": ["customers"], "dependencies": ("sales",)},
    )
    assert found.error_type == "foreign_key_constraint"
    assert found.error_code == "SQLITE_CONSTRAINT_FOREIGNKEY"
    assert found.affected_resources == ["customers"]
    assert found.dependencies == ["sales"]
    overridden = extract('no such table: orders', details={
        "error_type": "permission_denied", "error_code": 42, "suggested_actions": "ask"})
    assert overridden.error_type == "permission_denied"
    assert overridden.error_code == "42"
    assert overridden.affected_resources == ["orders"]  # not overridden: the pattern's
    assert overridden.suggested_actions == ["ask"]


def test_malformed_details_are_ignored_not_raised() -> None:
    found = extract("no such table: orders", details={
        "error_type": "made_up", "dependencies": 7, "affected_resources": {"x": 1}})
    assert found.error_type == "resource_not_found"
    assert found.affected_resources == ["orders"]
    assert found.dependencies == []

    class Exploding(dict[str, Any]):
        def get(self, *_: Any, **__: Any) -> Any:
            raise RuntimeError("boom")

    assert extract("no such table: orders", details=Exploding(a=1)).error_type == \
        "resource_not_found"


def test_extraction_never_raises_and_keeps_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.tools import structured_errors

    def broken(*_: Any) -> Any:
        raise RuntimeError("pattern bug")

    monkeypatch.setattr(structured_errors, "_from_patterns", broken)
    found = extract("FOREIGN KEY constraint failed", code="X")
    assert (found.error_type, found.message, found.error_code) == (
        "unknown", "FOREIGN KEY constraint failed", "X")
    assert extract(None).error_type == "unknown"  # type: ignore[arg-type]


def test_to_dict_has_every_additive_field_and_is_json() -> None:
    found = extract("no such table: orders", code="SQLITE_ERROR")
    payload = {"status": "error", "error": found.message, **found.to_dict()}
    assert json.loads(json.dumps(payload)) == {
        "status": "error",
        "error": "no such table: orders",
        "error_code": "SQLITE_ERROR",
        "error_type": "resource_not_found",
        "affected_resources": ["orders"],
        "dependencies": [],
        "suggested_actions": found.suggested_actions,
    }
    assert found.error_type in ERROR_TYPES


def test_lists_are_bounded() -> None:
    found = extract("x", details={"dependencies": [f"t{i}" * 300 for i in range(50)]})
    assert len(found.dependencies) == 10
    assert all(len(d) <= 200 for d in found.dependencies)


# --- SQL statement parsing -------------------------------------------------------------


@pytest.mark.parametrize(("query", "verb", "kind", "names"), [
    ("DROP TABLE sales", "DROP", "table", ("sales",)),
    ("drop table if exists `shop`.`sales`, customers", "DROP", "table", ("sales", "customers")),
    ('-- tidy up\nCREATE TABLE IF NOT EXISTS "Order Items" (id INT)', "CREATE", "table",
     ("Order Items",)),
    ("CREATE UNIQUE INDEX ix_email ON users(email)", "CREATE", "index", ("ix_email",)),
    ("INSERT OR REPLACE INTO main.users VALUES (1)", "INSERT", "table", ("users",)),
    ("UPDATE users SET a = 1", "UPDATE", "table", ("users",)),
    ("/* c */ DELETE FROM users WHERE id = 1", "DELETE", "table", ("users",)),
])
def test_sql_statements_are_parsed_into_verb_kind_and_names(
    query: str, verb: str, kind: str, names: tuple[str, ...]
) -> None:
    stmt = parse_statement(query)
    assert stmt is not None
    assert (stmt.verb, stmt.kind, stmt.names) == (verb, kind, names)


def test_reads_and_renames_parse_as_expected() -> None:
    assert parse_statement("SELECT * FROM users") is None
    stmt = parse_statement("ALTER TABLE a RENAME TO b")
    assert stmt is not None and stmt.new_name == "b"


# --- the execution summary ----------------------------------------------------------------

FK_FAILURE = extract("FOREIGN KEY constraint failed", code="SQLITE_CONSTRAINT_FOREIGNKEY",
                     details={"affected_resources": ["customers"], "dependencies": ["sales"]})


def test_an_empty_summary_renders_nothing() -> None:
    assert ExecutionSummary().render() == ""


def test_summary_lists_tool_key_argument_and_outcome() -> None:
    summary = ExecutionSummary()
    summary.record("sql", {"query": "DROP TABLE customers"}, False,
                   "FOREIGN KEY constraint failed", FK_FAILURE)
    summary.record("sql", {"query": "DROP TABLE sales"}, True, "OK.")
    text = summary.render()
    assert text.startswith("<TOOL_EXECUTION_SUMMARY>\n")
    assert text.endswith("\n</TOOL_EXECUTION_SUMMARY>")
    assert "- sql: DROP TABLE customers → FAILED (foreign_key_constraint; blocked by: sales)" \
        in text
    assert "- sql: DROP TABLE sales → SUCCESS (dropped table sales)" in text
    assert "State changes: dropped table sales." in text
    assert 'After sql "DROP TABLE customers" failed (blocked by sales): dropped table sales.' \
        in text


def test_summary_keeps_only_the_last_five_executions() -> None:
    summary = ExecutionSummary()
    for i in range(MAX_ENTRIES + 3):
        summary.record("read_file", {"path": f"notes/{i}.md"}, True, "text")
    text = summary.render()
    assert len(summary) == MAX_ENTRIES
    assert "notes/2.md" not in text
    assert all(f"notes/{i}.md" in text for i in range(3, MAX_ENTRIES + 3))


def test_reset_starts_a_new_turn() -> None:
    summary = ExecutionSummary()
    summary.record("sql", {"query": "DROP TABLE sales"}, True, "OK.")
    summary.reset()
    assert summary.render() == ""
    summary.record("read_file", {"path": "a.md"}, True, "x")
    assert "dropped" not in summary.render()


def test_sql_state_changes_name_the_operation_table_and_row_count() -> None:
    summary = ExecutionSummary()
    summary.record("sql", {"query": "CREATE TABLE t (id INTEGER)"}, True, "OK.")
    summary.record("sql", {"query": "INSERT INTO t VALUES (?)", "params": [1]}, True,
                   "OK: 3 rows affected.")
    summary.record("sql", {"query": "UPDATE t SET id = 2 WHERE 0"}, True, "OK: 0 rows affected.")
    summary.record("sql", {"query": "DELETE FROM t"}, True, "OK: 1 row affected.")
    summary.record("sql", {"query": "SELECT * FROM t"}, True, '{"columns":["id"]}')
    text = summary.render()
    assert ("State changes: created table t; inserted 3 rows into t; "
            "deleted 1 row from t.") in text
    assert "- sql: SELECT * FROM t → SUCCESS\n" in text


def test_failed_calls_change_no_state() -> None:
    summary = ExecutionSummary()
    summary.record("sql", {"query": "DROP TABLE customers"}, False, "FOREIGN KEY constraint "
                   "failed")
    assert "State changes" not in summary.render()
    assert "FAILED (foreign_key_constraint)" in summary.render()


def test_file_tools_report_the_files_they_changed() -> None:
    summary = ExecutionSummary()
    summary.record("write_file", {"path": "a.md", "content": "x"}, True, "Created a.md (1 bytes).")
    summary.record("write_file", {"path": "b.md", "content": "x"}, True, "Overwrote b.md.")
    summary.record("edit_file", {"path": "c.md", "old": "a", "new": "b"}, True, "Edited c.md")
    summary.record("read_file", {"path": "d.md"}, True, "x")
    assert "State changes: created a.md; overwrote b.md; edited c.md." in summary.render()


def test_a_search_query_is_not_read_as_sql() -> None:
    summary = ExecutionSummary()
    summary.record("web_search", {"query": "drop table python"}, True, "results")
    assert "State changes" not in summary.render()


def test_the_key_argument_is_the_most_telling_one_and_short() -> None:
    summary = ExecutionSummary()
    summary.record("fetch", {"headers": "h", "url": "https://a.b/c"}, True, "ok")
    summary.record("custom", {"n": 3, "label": "first string"}, True, "ok")
    summary.record("custom", {"n": 3}, True, "ok")
    summary.record("sql", {"query": "SELECT " + "x, " * 100 + "\n  y FROM t"}, True, "ok")
    lines = summary.render().splitlines()
    assert lines[2] == "- fetch: https://a.b/c → SUCCESS"
    assert lines[3] == "- custom: first string → SUCCESS"
    assert lines[4] == '- custom: {"n":3} → SUCCESS'
    key = lines[5].removeprefix("- sql: ").split(" → ")[0]
    assert len(key) == 80 and key.endswith("…") and "\n" not in key


def test_an_unclassified_failure_shows_its_first_line() -> None:
    summary = ExecutionSummary()
    summary.record("custom", {"x": "y"}, False, "\nboom: it broke\ntraceback...")
    assert "- custom: y → FAILED: boom: it broke" in summary.render()


def test_a_failure_is_read_from_the_error_json_the_model_sees() -> None:
    payload = {"status": "error", "error": "FOREIGN KEY constraint failed",
               **FK_FAILURE.to_dict()}
    summary = ExecutionSummary()
    summary.record("sql", {"query": "DROP TABLE customers"}, False,
                   "Tool 'sql' failed: " + json.dumps(payload))
    summary.record("custom", {"x": "y"}, False, '{"status": "error", "error": "odd thing"}')
    text = summary.render()
    assert "FAILED (foreign_key_constraint; blocked by: sales)" in text
    assert "- custom: y → FAILED: odd thing" in text


def test_a_failure_redone_successfully_is_not_flagged_as_resolved() -> None:
    summary = ExecutionSummary()
    summary.record("sql", {"query": "DROP TABLE customers"}, False, "x", FK_FAILURE)
    summary.record("sql", {"query": "DROP TABLE sales"}, True, "OK.")
    summary.record("sql", {"query": "DROP TABLE customers"}, True, "OK.")
    assert "After sql" not in summary.render()


# --- the error-handling prompt section --------------------------------------------------


def _context(ws: Path, **changes: Any) -> PromptContext:
    message = InboundMessage("telegram", "c", "direct", "u1", "hi", sender_name="Ann")
    base = PromptContext(message=message, session_key="s", workspace=ws, tool_names=("sql",),
                         model="m", provider="p", agent="default")
    return replace(base, **changes)


def _section(sections: list[PromptSection]) -> PromptSection | None:
    return next((s for s in sections if s.name == "error_handling" and s.text), None)


def test_error_guidance_is_in_full_prompts_with_tools(tmp_path: Path) -> None:
    section = _section(prompt_sections.roost_prompt_sections(_context(tmp_path)))
    assert section is not None
    assert section.order == Order.ERROR_HANDLING
    assert Order.SAFETY < Order.ERROR_HANDLING < Order.WORKSPACE
    for words in ("error_type", "dependencies", "<TOOL_EXECUTION_SUMMARY>", "retry",
                  "DROP TABLE customers"):
        assert words in section.text


def test_error_guidance_is_left_out_without_tools_or_in_minimal_mode(tmp_path: Path) -> None:
    assert _section(prompt_sections.roost_prompt_sections(
        _context(tmp_path, tool_names=()))) is None
    assert _section(prompt_sections.roost_prompt_sections(
        _context(tmp_path, mode="minimal"))) is None
