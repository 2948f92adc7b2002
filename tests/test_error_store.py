"""The error submission channel: stores, summaries, IDs, retention and the built-in tools."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.observability.tracing import Span
from bot.storage import errors as error_store
from bot.storage.errors import (
    ERROR_ID_RE,
    ErrorStore,
    ResultStore,
    StoredError,
    first_line,
    format_failure,
    format_large_result,
    normalize_raw_error,
    summarize_error,
)
from bot.storage.sessions import RunRecord, SessionStore
from bot.testing.app import scripted
from plugins import error_tools
from roost.testing import AppServices as Services
from tests.conftest import AppFactory

T0 = 1_732_230_214.0
"""2024-11-21 23:03:34 UTC."""
DAY = 86_400.0


class Clock:
    """A settable clock for the stores."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[SessionStore]:
    store = await SessionStore.open(tmp_path / "roost.db")
    yield store
    await store.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def errors(sessions: SessionStore, clock: Clock) -> ErrorStore:
    return ErrorStore(sessions.db, sessions.lock, clock=clock)


@pytest.fixture
def results(sessions: SessionStore, clock: Clock) -> ResultStore:
    return ResultStore(sessions.db, sessions.lock, clock=clock)


async def count(sessions: SessionStore, table: str) -> int:
    rows = list(await sessions.db.execute_fetchall(f"SELECT count(*) FROM {table}"))
    return int(rows[0][0])


# --- summaries -----------------------------------------------------------------------

LONG = ("Very long error message that exceeds one hundred characters and needs truncation "
        "for context window efficiency")


@pytest.mark.parametrize(("raw", "summary"), [
    # The spec's examples.
    ({"code": "SQL_ERROR", "message": "Syntax error near 'FROM'\nQuery: SELECT * FROM"},
     "Code SQL_ERROR: Syntax error near 'FROM'"),
    (RuntimeError("connection timeout after 30 seconds\nTCP handshake failed\n..."),
     "connection timeout after 30 seconds"),
    ("Short error", "Short error"),
    # The spec's algorithm cuts at 100 (its printed example stops at 95, a typo).
    (LONG, LONG[:100] + "..."),
    # Coded: the message part gets 80 characters.
    ({"code": "E", "message": "x" * 81}, "Code E: " + "x" * 80 + "..."),
    ({"code": "E", "message": "x" * 80}, "Code E: " + "x" * 80),
    ({"code": "E", "message": "first\nsecond"}, "Code E: first"),
    # A mapping with a message and no (or an empty) code: its first line, 100 max.
    ({"message": "plain\nmore"}, "plain"),
    ({"code": "", "message": "y" * 101}, "y" * 100 + "..."),
    # Exceptions: ToolError has a code; others use their message, or their type.
    (ToolError("no such table: users\nat line 3", code="SQL_ERROR"),
     "Code SQL_ERROR: no such table: users"),
    (ValueError("bad\nvalue"), "bad"),
    (KeyError(), "KeyError"),
    # Strings: the first newline must come before the limit, and not at position 0.
    ("a" * 99 + "\nrest", "a" * 99),
    ("a" * 100 + "\nrest", "a" * 100 + "..."),
    ("a" * 100, "a" * 100),
    ("\nleading newline", "\nleading newline"),
    ("", ""),
    # Anything else: its JSON or str() form.
    ({"status": 500}, '{"status": 500}'),
    (12345, "12345"),
])
def test_summary_follows_the_spec_algorithm(raw: object, summary: str) -> None:
    assert summarize_error(raw) == summary


def test_first_line_branches() -> None:
    assert first_line("ab\ncd", 3) == "ab"
    assert first_line("abc\nd", 3) == "abc..."  # newline at the limit: cut instead
    assert first_line("abc", 3) == "abc"
    assert first_line("abcd", 3) == "abc..."


# --- storing and reading errors ------------------------------------------------------


async def test_store_then_get_round_trips(errors: ErrorStore) -> None:
    raw = {"code": "SQL_ERROR", "message": "Syntax error\n" + "trace line\n" * 300,
           "details": {"affected_resources": ["users"]}}
    stored = await errors.store("s1", "run_sql", raw)
    assert ERROR_ID_RE.fullmatch(stored.id)
    assert stored.id.startswith("err_20241121_230334_")
    assert len(stored.id) == 26
    assert (stored.timestamp, stored.session_id, stored.tool_name) == (T0, "s1", "run_sql")
    assert stored.raw_error == raw
    assert stored.short_summary == "Code SQL_ERROR: Syntax error"
    assert stored.iso_timestamp() == "2024-11-21T23:03:34Z"
    assert await errors.get(stored.id) == stored
    assert await errors.get(stored.id, session_id="s1") == stored
    assert await errors.get(stored.id, session_id="s2") is None
    assert await errors.get("err_20241121_230334_000000") is None


async def test_explicit_summary_wins(errors: ErrorStore) -> None:
    stored = await errors.store("s", "t", "raw", summary="custom")
    assert (await errors.get(stored.id)) == stored
    assert stored.short_summary == "custom"


@pytest.mark.parametrize(("raw", "expected"), [
    ("plain text\nwith trace", {"message": "plain text\nwith trace"}),
    ("[1, 2]", {"message": "[1, 2]"}),
    ('"quoted"', {"message": '"quoted"'}),
    ("{not json", {"message": "{not json"}),
    ('{"code": "X", "message": "m"}', {"code": "X", "message": "m"}),
])
async def test_raw_errors_that_are_not_json_objects_are_wrapped(
        errors: ErrorStore, sessions: SessionStore, raw: str, expected: dict[str, Any]) -> None:
    assert normalize_raw_error(raw) == expected
    stored = await errors.store("s", "t", raw)
    assert stored.raw_error == expected
    rows = list(await sessions.db.execute_fetchall(
        "SELECT raw_error FROM agent_errors WHERE id = ?", (stored.id,)))
    assert json.loads(rows[0][0]) == expected


async def test_unserializable_values_are_stored_as_text(errors: ErrorStore) -> None:
    when = datetime(2024, 1, 2, tzinfo=UTC)
    stored = await errors.store("s", "t", {"message": "m", "at": when, "path": Path("/x")})
    assert stored.raw_error == {"message": "m", "at": str(when), "path": "/x"}
    assert await errors.get(stored.id) == stored


async def test_list_filters_and_orders_newest_first(errors: ErrorStore, clock: Clock) -> None:
    made: list[StoredError] = []
    for i, (session, tool) in enumerate([("a", "sql"), ("a", "http"), ("b", "sql"),
                                         ("a", "sql"), ("b", "http"), ("a", "sql")]):
        clock.now = T0 + i * 10
        made.append(await errors.store(session, tool, f"error {i}"))
    clock.now = T0 + 50  # same second as the last: insertion order breaks the tie
    made.append(await errors.store("a", "sql", "error 6"))

    def ids(found: list[StoredError]) -> list[int]:
        return [made.index(e) for e in found]

    assert ids(await errors.list()) == [6, 5, 4, 3, 2, 1, 0]
    assert ids(await errors.list(session_id="a")) == [6, 5, 3, 1, 0]
    assert ids(await errors.list(tool_name="sql")) == [6, 5, 3, 2, 0]
    assert ids(await errors.list(session_id="a", tool_name="sql")) == [6, 5, 3, 0]
    assert ids(await errors.list(since=T0 + 10, until=T0 + 40)) == [3, 2, 1]
    since = datetime.fromtimestamp(T0 + 30, UTC)
    assert ids(await errors.list(session_id="a", since=since)) == [6, 5, 3]
    assert ids(await errors.list(limit=2)) == [6, 5]
    assert ids(await errors.list(session_id="b", limit=1)) == [4]
    assert len(await errors.list(limit=None)) == len(await errors.list(limit=0)) == 7
    assert await errors.list(session_id="nobody") == []
    assert await errors.list(tool_name="x'; DROP TABLE agent_errors; --") == []
    with pytest.raises(ValueError, match="limit must be >= 0"):
        await errors.list(limit=-1)


async def test_list_default_limit_is_50(errors: ErrorStore) -> None:
    await asyncio.gather(*(errors.store("s", "t", f"e{i}") for i in range(60)))
    assert len(await errors.list()) == 50


# --- IDs ---------------------------------------------------------------------------


async def test_ten_thousand_ids_are_unique_and_well_formed(
        errors: ErrorStore, sessions: SessionStore) -> None:
    # Six hex digits in one second: ~3 collisions are expected among 10k random
    # suffixes, so uniqueness here depends on the store, not on luck.
    stored = await asyncio.gather(*(errors.store(f"s{i % 7}", "t", f"e{i}")
                                    for i in range(10_000)))
    ids = {e.id for e in stored}
    assert len(ids) == 10_000
    assert all(re.fullmatch(r"err_20241121_230334_[0-9a-f]{6}", i) for i in ids)
    assert await count(sessions, "agent_errors") == 10_000


async def test_ids_use_utc_and_the_store_time(errors: ErrorStore, clock: Clock) -> None:
    clock.now = datetime(2025, 1, 1, 0, 0, 59, tzinfo=UTC).timestamp()
    assert (await errors.store("s", "t", "e")).id.startswith("err_20250101_000059_")


async def test_an_id_taken_in_the_database_is_replaced(
        sessions: SessionStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two stores on one database (as two processes would be) draw the same suffix.
    suffixes = iter(["aaaaaa", "aaaaaa", "bbbbbb", "cccccc", "dddddd"])
    monkeypatch.setattr(error_store, "random_suffix", lambda: next(suffixes))
    first = ErrorStore(sessions.db, sessions.lock, clock=clock)
    second = ErrorStore(sessions.db, sessions.lock, clock=clock)
    assert (await first.store("s", "t", "one")).id == "err_20241121_230334_aaaaaa"
    # Three at once go into one transaction; the collision is found and only the
    # colliding row gets a new ID.
    batch = await asyncio.gather(*(second.store("s", "t", f"two {i}") for i in range(3)))
    assert [e.id[-6:] for e in batch] == ["dddddd", "bbbbbb", "cccccc"]
    assert await count(sessions, "agent_errors") == 4
    for e in batch:
        assert await second.get(e.id) == e


async def test_a_write_finishes_even_if_its_caller_is_cancelled(
        errors: ErrorStore, sessions: SessionStore) -> None:
    task = asyncio.create_task(errors.store("s", "t", "e"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await errors.flush()
    assert await count(sessions, "agent_errors") == 1


# --- retention -----------------------------------------------------------------------


async def test_retention_deletes_only_old_rows(
        errors: ErrorStore, results: ResultStore, sessions: SessionStore, clock: Clock) -> None:
    kept_errors, kept_results = [], []
    for age in (40, 31, 30.5, 29.9, 1, 0):
        clock.now = T0 - age * DAY
        e = await errors.store("s", "t", f"{age} days")
        r = await results.put("s", "t", f"{age} days")
        if age < 30:
            kept_errors.append(e.id)
            kept_results.append(r)
    clock.now = T0
    assert await errors.delete_older_than(30) == 3
    assert await results.delete_older_than(30) == 3
    assert sorted(e.id for e in await errors.list()) == sorted(kept_errors)
    rows = await sessions.db.execute_fetchall("SELECT id FROM tool_results")
    assert sorted(r[0] for r in rows) == sorted(kept_results)
    assert await errors.delete_older_than(30) == 0


async def test_startup_prunes_by_error_retention_days(
        make_app: AppFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = await SessionStore.open(Settings(data_dir=tmp_path / "data").db_path)
    old = ErrorStore(store.db, store.lock, clock=lambda: time.time() - 8 * DAY)
    await old.store("s", "t", "old")
    await ResultStore(store.db, store.lock, clock=lambda: time.time() - 8 * DAY).put(
        "s", "t", "old")
    recent = await ErrorStore(store.db, store.lock).store("s", "t", "recent")
    await store.close()

    with caplog.at_level(logging.INFO, "roost"):
        app, _, _ = await make_app(scripted({"reply": "ok"}), error_retention_days=7)
    errors = app.services.errors
    assert errors is not None
    assert [e.id for e in await errors.list()] == [recent.id]
    assert await count(app.store, "tool_results") == 0
    assert "deleted 1 stored errors older than 7 days" in caplog.text
    assert {"get_error_detail", "get_tool_result"} <= set(app.engine.tools)


async def test_trace_retention_days_prunes_old_runs_at_startup_and_daily(
        make_app: AppFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = "default:test:direct:u1"

    async def run(store: SessionStore, run_id: str, days_ago: float) -> None:
        ended = time.time() - days_ago * DAY
        await store.record_run(RunRecord(run_id, key, "completed", ended - 5, ended),
                               [Span(run_id, "agent", "agent", ended - 5)])

    store = await SessionStore.open(Settings(data_dir=tmp_path / "data").db_path)
    await run(store, "ten-days-old", 10)
    await run(store, "yesterday", 1)
    await store.close()

    with caplog.at_level(logging.INFO, "roost"):
        app, _, _ = await make_app(scripted({"reply": "ok"}), trace_retention_days=7)
    assert [r.run_id for r in await app.store.runs(key)] == ["yesterday"]
    assert "deleted 1 runs and 1 spans older than 7 days" in caplog.text
    # The daily job (with replicas: once per deployment) prunes by the same setting.
    await run(app.store, "eight-days-old", 8)
    await error_tools._retention(app.runtime)
    assert [r.run_id for r in await app.store.runs(key)] == ["yesterday"]
    assert await app.store.spans("eight-days-old") == []


# --- a locked database ---------------------------------------------------------------


@pytest.fixture
async def blocker(sessions: SessionStore, tmp_path: Path) -> AsyncIterator[sqlite3.Connection]:
    """A second connection holding the write lock; the store's connection waits 50 ms."""
    await sessions.db.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(tmp_path / "roost.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield other
    if other.in_transaction:
        other.execute("ROLLBACK")
    other.close()


class _OnRetry(logging.Handler):
    def __init__(self, blocker: sqlite3.Connection | None) -> None:
        super().__init__()
        self.blocker = blocker
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying once" in record.getMessage():
            self.retries += 1
            if self.blocker is not None:
                self.blocker.execute("ROLLBACK")  # the other writer finishes


@pytest.fixture
def on_retry() -> Iterator[list[_OnRetry]]:
    handlers: list[_OnRetry] = []
    yield handlers
    for h in handlers:
        logging.getLogger("roost.storage.errors").removeHandler(h)


def watch(handlers: list[_OnRetry], blocker: sqlite3.Connection | None) -> _OnRetry:
    handler = _OnRetry(blocker)
    logging.getLogger("roost.storage.errors").addHandler(handler)
    handlers.append(handler)
    return handler


async def test_a_locked_database_is_retried_once_and_the_retry_can_succeed(
        errors: ErrorStore, blocker: sqlite3.Connection, on_retry: list[_OnRetry]) -> None:
    handler = watch(on_retry, blocker)  # the lock goes away just before the retry
    stored = await errors.store("s", "t", "boom")
    assert handler.retries == 1
    assert await errors.get(stored.id) == stored


async def test_a_database_locked_twice_fails_after_one_retry(
        errors: ErrorStore, blocker: sqlite3.Connection, on_retry: list[_OnRetry]) -> None:
    handler = watch(on_retry, None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        await errors.store("s", "t", "boom")
    assert handler.retries == 1
    blocker.execute("ROLLBACK")
    assert (await errors.store("s", "t", "after")).raw_error == {"message": "after"}


# --- the LLM-facing text -------------------------------------------------------------


async def test_format_failure_with_a_stored_error(errors: ErrorStore) -> None:
    stored = await errors.store("s", "run_sql", {"code": "SQL_ERROR", "message": "bad\nmore"})
    assert format_failure("run_sql", stored, "ignored") == (
        f"Tool 'run_sql' failed: Code SQL_ERROR: bad\n[Error ID: {stored.id}]\n"
        "Call get_error_detail with this ID if you need the full error.")


def test_format_failure_without_a_store_truncates_and_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "roost.storage.errors"):
        assert format_failure("t", None, "x" * 600) == "Tool 't' failed: " + "x" * 500 + "..."
        assert format_failure("t", None, "short") == "Tool 't' failed: short"
    assert "not stored" in caplog.text


def test_format_large_result() -> None:
    text = format_large_result("t", "res_20241121_230334_abc123", "a" * 100, 10)
    assert text == ("a" * 10 + "\n\n[Result stored as res_20241121_230334_abc123: 100 "
                    "characters, the first 10 shown; call get_tool_result with result_id and "
                    "offset 10 to read more]")


# --- results -------------------------------------------------------------------------


async def test_results_are_read_in_slices(results: ResultStore) -> None:
    content = "".join(f"{i:05d}é\n" for i in range(3000))
    rid = await results.put("s", "t", content)
    assert re.fullmatch(r"res_20241121_230334_[0-9a-f]{6}", rid)
    assert await results.get_slice(rid, 0, 10) == (content[:10], len(content))
    assert len(content) == 21_000
    assert await results.get_slice(rid, 20_995, 100) == (content[20_995:], 21_000)
    assert await results.get_slice(rid, 9_000, 7) == (content[9_000:9_007], 21_000)
    assert await results.get_slice(rid, 50_000, 10) == ("", len(content))
    assert await results.get_slice(rid, 0, 10, session_id="other") is None
    assert await results.get_slice("res_20241121_230334_000000") is None
    with pytest.raises(ValueError, match="need offset >= 0"):
        await results.get_slice(rid, -1, 10)


async def test_nul_characters_keep_offsets(results: ResultStore) -> None:
    rid = await results.put("s", "t", "ab\x00cd")
    assert await results.get_slice(rid, 1, 3) == ("b\ufffdc", 5)


# --- the built-in tools ----------------------------------------------------------------


def ctx(session: str = "telegram:42") -> ToolContext:
    return ToolContext(user_id="42", channel="telegram", chat_id="42", session_key=session,
                       run_id="run-1", workspace=Path("/nonexistent"),
                       deadline=time.monotonic() + 30)


@pytest.fixture
def tools(sessions: SessionStore, errors: ErrorStore, results: ResultStore) -> dict[str, Tool]:
    services = Services(sessions, errors=errors, results=results)
    return {t.name: t for t in error_tools.roost_tools(Settings(), services)}


async def call(tools: dict[str, Tool], name: str, session: str = "telegram:42",
               **args: Any) -> str:
    result = await tools[name].execute(ctx(session), args)
    assert isinstance(result, str)
    return result


async def fails(tools: dict[str, Tool], name: str, session: str = "telegram:42",
                **args: Any) -> ToolError:
    with pytest.raises(ToolError) as exc:
        await tools[name].execute(ctx(session), args)
    return exc.value


def test_tools_are_offered_only_with_their_store(
        sessions: SessionStore, errors: ErrorStore, results: ResultStore) -> None:
    def names(services: Services | None) -> list[str]:
        return sorted(t.name for t in error_tools.roost_tools(Settings(), services))

    assert names(Services(sessions, errors=errors, results=results)) == [
        "get_error_detail", "get_tool_result"]
    assert names(Services(sessions, errors=errors)) == ["get_error_detail"]
    assert names(Services(sessions, results=results)) == ["get_tool_result"]
    assert names(Services(sessions)) == []
    assert names(None) == []


def test_tool_schemas_are_strict(tools: dict[str, Tool]) -> None:
    assert tools["get_error_detail"].input_schema["required"] == ["error_id"]
    assert tools["get_tool_result"].input_schema["required"] == ["result_id"]
    for tool in tools.values():
        assert tool.input_schema["additionalProperties"] is False
        assert len(tool.description) > 80


async def test_get_error_detail_returns_the_full_error(
        tools: dict[str, Tool], errors: ErrorStore) -> None:
    raw = {"code": "SQL_ERROR", "message": "no such table\n" + "  frame\n" * 400,
           "retryable": False, "details": {"affected_resources": ["users"]}}
    stored = await errors.store("telegram:42", "run_sql", raw)
    detail = json.loads(await call(tools, "get_error_detail", error_id=f" {stored.id} "))
    assert detail == {"error_id": stored.id, "timestamp": "2024-11-21T23:03:34Z",
                      "tool_name": "run_sql", "short_summary": "Code SQL_ERROR: no such table",
                      "raw_error": raw}


async def test_get_error_detail_never_shows_another_sessions_error(
        tools: dict[str, Tool], errors: ErrorStore) -> None:
    stored = await errors.store("telegram:99", "run_sql", "secret stuff")
    exc = await fails(tools, "get_error_detail", error_id=stored.id)
    assert exc.code == "ERROR_NOT_FOUND"
    assert "secret" not in str(exc)
    assert json.loads(await call(tools, "get_error_detail", session="telegram:99",
                                 error_id=stored.id))["raw_error"] == {"message": "secret stuff"}


@pytest.mark.parametrize("error_id", ["err_20241121_230334_abc123", "err_123", "abc", ""])
async def test_unknown_error_ids_are_not_found(tools: dict[str, Tool], error_id: str) -> None:
    exc = await fails(tools, "get_error_detail", error_id=error_id)
    assert exc.code == "ERROR_NOT_FOUND"
    assert "not found" in str(exc)
    assert "err_20241121_230334_abc123" in str(exc)  # what an ID looks like


async def test_bad_arguments_are_refused(tools: dict[str, Tool]) -> None:
    assert (await fails(tools, "get_error_detail")).code == "INVALID_ARGUMENT"
    assert (await fails(tools, "get_error_detail", error_id=5)).code == "INVALID_ARGUMENT"
    assert (await fails(tools, "get_error_detail", error_id="x", extra=1)).code \
        == "INVALID_ARGUMENT"
    rid = "res_20241121_230334_abc123"
    for bad in ({"offset": -1}, {"offset": "x"}, {"length": 0}, {"offset": True}):
        assert (await fails(tools, "get_tool_result", result_id=rid, **bad)).code \
            == "INVALID_ARGUMENT"


async def test_database_failures_are_reported_as_such(
        tools: dict[str, Tool], sessions: SessionStore) -> None:
    await sessions.db.execute("DROP TABLE agent_errors")
    await sessions.db.execute("DROP TABLE tool_results")
    exc = await fails(tools, "get_error_detail", error_id="err_20241121_230334_abc123")
    assert exc.code == "DATABASE_ERROR"
    exc = await fails(tools, "get_tool_result", result_id="res_20241121_230334_abc123")
    assert exc.code == "DATABASE_ERROR"


async def test_get_tool_result_pages_through_a_result(
        tools: dict[str, Tool], results: ResultStore) -> None:
    content = "".join(f"line {i}\n" for i in range(3000))  # 25,890 characters
    rid = await results.put("telegram:42", "fetch", content)
    first = await call(tools, "get_tool_result", result_id=rid)
    assert first == (f"{content[:8000]}\n\n[{rid}: characters 0-8000 of {len(content)}; "
                     f"next offset 8000; {len(content) - 8000} characters left]")
    pages, offset = [], 0
    while True:
        text = await call(tools, "get_tool_result", result_id=rid, offset=offset)
        body, marker = text.rsplit("\n\n", 1)
        pages.append(body)
        found = re.search(r"next offset (\d+)", marker)
        if found is None:
            assert marker.endswith("end of result]")
            break
        offset = int(found[1])
    assert "".join(pages) == content
    short = await call(tools, "get_tool_result", result_id=rid, offset="10", length=5.0)
    assert short.startswith(content[10:15] + "\n\n[")
    capped = await call(tools, "get_tool_result", result_id=rid, length=100_000)
    assert capped.startswith(content[:16_000] + "\n\n")  # at most large_result_chars
    past = await fails(tools, "get_tool_result", result_id=rid, offset=len(content))
    assert past.code == "INVALID_ARGUMENT"


async def test_get_tool_result_never_shows_another_sessions_result(
        tools: dict[str, Tool], results: ResultStore) -> None:
    rid = await results.put("telegram:99", "fetch", "private")
    exc = await fails(tools, "get_tool_result", result_id=rid)
    assert exc.code == "RESULT_NOT_FOUND"
    assert "res_20241121_230334_abc123" in str(exc)
    assert (await call(tools, "get_tool_result", session="telegram:99", result_id=rid)) \
        .startswith("private\n\n")
