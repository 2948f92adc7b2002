"""Built-in plugin: ``sql``, one SQL statement per call on the user's own SQLite database.

The database is ``data.sqlite3`` in the user's workspace (fixed; the model
never names a file). Every call opens its own connection in a worker thread
with foreign keys enforced, runs one statement in autocommit mode, and closes
it; calls are serialised with ``exec`` calls on the same workspace by
``roost.workspace_lock``.

Race-free file access: SQLite opens its files by path, following links, so
while the lock is held (no ``exec`` sandbox can then create links in the
workspace) the tool checks through a workspace descriptor that ``data.sqlite3``
and ``data.sqlite3-journal``/``-wal``/``-shm`` are regular files or absent,
opens the database itself without following links, and refuses unless the file
SQLite opened is that same inode. Every connection keeps its rollback journal
in memory (``journal_mode=MEMORY``, ``temp_store=MEMORY``; the model cannot
change ``journal_mode`` or ``locking_mode``), so SQLite creates no file next to
the database. The cost: a process killed in the middle of a write statement can
leave that user's database inconsistent or corrupt.

Confinement: an authorizer refuses ``ATTACH`` (a file other than the temporary
one ``VACUUM`` uses), ``DETACH``, ``load_extension()``, directory pragmas and
``journal_mode``/``locking_mode``,
so no statement reaches another file. A progress handler stops a statement
that runs past its time limit, or whose call was cancelled, so a runaway query
cannot pin a worker thread.

Failures raise :class:`~bot.contracts.tools.ToolError` whose ``details`` are the
structured fields of ``roost.structure_error``; the code is SQLite's
extended result name (``SQLITE_CONSTRAINT_FOREIGNKEY``, ``SQLITE_ERROR``...)
or one of ``INVALID_ARGUMENT``, ``MULTIPLE_STATEMENTS``, ``NOT_ALLOWED``,
``TRANSACTION_CONTROL``, ``TIMEOUT``, ``CANCELLED``, ``UNSAFE_FILE`` (a database
or journal name in the workspace that is a link or not a regular file). SQLite's
foreign-key error names no table, so the tool looks the dependencies up itself.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from roost import (
    ERROR_TYPE_FOREIGN_KEY,
    ERROR_TYPE_PERMISSION,
    ERROR_TYPE_TIMEOUT,
    Settings,
    SqlStatement,
    Tool,
    ToolContext,
    ToolError,
    hookimpl,
    lstat_at,
    open_beneath,
    open_root,
    parse_statement,
    structure_error,
    workspace_lock,
)

DB_FILE = "data.sqlite3"
"""The database file, relative to the user's workspace."""
MAX_ROWS = 200
"""A query returns at most this many rows; the result says when there were more."""
MAX_CELL_CHARS = 1_000
"""Longer text values are cut in the result."""
QUERY_TIMEOUT = 10.0
"""Seconds a statement may run (less if the tool or run deadline is nearer)."""
BUSY_TIMEOUT = 5.0
"""Seconds to wait for another connection's lock before ``database is locked``."""
DEPENDENCY_LOOKUP_TIMEOUT = 1.0
"""Seconds spent finding the tables behind a foreign-key failure."""

_PROGRESS_OPS = 1_000
"""SQLite VM instructions between two checks of the deadline."""

_TRANSACTION = re.compile(r"(?:BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})
_DENIED_PRAGMAS = frozenset({"temp_store_directory", "data_store_directory", "journal_mode",
                             "locking_mode"})
_SIDE_FILES = tuple(DB_FILE + suffix for suffix in ("-journal", "-wal", "-shm"))
"""The files SQLite opens by path next to the database (absent with an in-memory journal)."""
_SETUP = ("PRAGMA journal_mode = MEMORY", "PRAGMA temp_store = MEMORY", "PRAGMA foreign_keys = ON")
_RETRYABLE = ("SQLITE_BUSY", "SQLITE_LOCKED")

Param = str | int | float | None


@hookimpl
def roost_tools(settings: Settings) -> list[Tool]:
    """The ``sql`` tool, its time limit inside ``settings.tool_timeout``."""
    return [make_sql_tool(query_timeout=min(QUERY_TIMEOUT, settings.tool_timeout * 0.9))]


def make_sql_tool(*, max_rows: int = MAX_ROWS, query_timeout: float = QUERY_TIMEOUT) -> Tool:
    """The ``sql`` tool with a row cap and a per-statement time limit."""

    async def sql(context: ToolContext, args: Mapping[str, Any]) -> str:
        query, params = _arguments(args)
        async with workspace_lock(context.workspace):
            budget = min(query_timeout, context.remaining())
            if budget <= 0:
                raise ToolError("no time left in this run for the query", code="TIMEOUT",
                                details=_details("no time left", "TIMEOUT", ERROR_TYPE_TIMEOUT))
            stop = threading.Event()
            work = asyncio.ensure_future(asyncio.to_thread(
                _run, Path(context.workspace), query, params, budget, max_rows, stop))
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                stop.set()  # the worker's progress handler interrupts the statement
                # Keep the workspace locked until SQLite has let go of its files.
                await asyncio.wait([work])
                if not work.cancelled():
                    work.exception()  # retrieved: the call is cancelled whatever it raised
                raise

    return Tool(
        name="sql",
        description=(
            "Run ONE SQL statement on your private SQLite database (a file in your workspace "
            "that persists between conversations; foreign keys are enforced). Each call "
            "commits on its own: BEGIN/COMMIT are not available. Queries return JSON "
            f"(columns, rows; at most {max_rows} rows, so aggregate or add LIMIT/WHERE); "
            "other statements report rows affected. List tables with "
            "SELECT name, sql FROM sqlite_master. Pass values with ? placeholders and "
            "'params'. Errors come with error_type, dependencies and suggested_actions."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Exactly one SQLite statement."},
                "params": {
                    "type": "array",
                    "description": "Values for the ? placeholders, in order.",
                    "items": {"anyOf": [{"type": "string"}, {"type": "number"},
                                        {"type": "boolean"}, {"type": "null"}]},
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        execute=sql,
        transient_codes=frozenset(_RETRYABLE),
    )


def _arguments(args: Mapping[str, Any]) -> tuple[str, tuple[Param, ...]]:
    if not isinstance(args, Mapping):
        raise ToolError("arguments must be a JSON object", code="INVALID_ARGUMENT")
    unknown = sorted(str(k) for k in args if k not in ("query", "params"))
    if unknown:
        raise ToolError(f"unknown arguments: {', '.join(unknown)}; expected query, params",
                        code="INVALID_ARGUMENT")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("'query' must be a non-empty string with one SQL statement",
                        code="INVALID_ARGUMENT")
    raw = args.get("params", [])
    if raw is None:
        raw = []
    if not isinstance(raw, (list, tuple)):
        raise ToolError("'params' must be an array of values", code="INVALID_ARGUMENT")
    params: list[Param] = []
    for i, value in enumerate(raw):
        if isinstance(value, bool):
            params.append(int(value))
        elif value is None or isinstance(value, (str, int, float)):
            params.append(value)
        else:
            raise ToolError(f"params[{i}] must be a string, number, boolean or null",
                            code="INVALID_ARGUMENT")
    if _TRANSACTION.match(_COMMENTS.sub(" ", query).strip()):
        raise ToolError(
            "transaction statements are not available: every sql call commits on its own",
            code="TRANSACTION_CONTROL",
            details=_details("transaction control", "TRANSACTION_CONTROL", ERROR_TYPE_PERMISSION,
                             actions=["Run the statements one call at a time; each commits "
                                      "immediately"]),
        )
    return query, tuple(params)


# --- the worker thread ---------------------------------------------------------------


def _unsafe(name: str, what: str) -> ToolError:
    message = (f"refused: {name} in your workspace is {what}, not a regular file; the sql "
               f"tool never opens it. Remove or rename {name} and retry")
    return ToolError(message, code="UNSAFE_FILE", details=_details(
        message, "UNSAFE_FILE", ERROR_TYPE_PERMISSION, affected=[name],
        actions=[f"Remove or rename {name} in your workspace"]))


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a special file"


def _open_checked(workspace: Path) -> tuple[int, os.stat_result]:
    """The database opened below ``workspace`` without following links (created when
    absent), after checking that it and its side files are regular files or absent."""
    root = open_root(workspace)
    try:
        for name in (DB_FILE, *_SIDE_FILES):
            try:
                status = lstat_at(root, name)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(status.st_mode):
                raise _unsafe(name, _kind(status.st_mode))
            if status.st_nlink > 1:
                raise _unsafe(name, "a hard link to another file")
        try:
            fd = open_beneath(root, (DB_FILE,), os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise _unsafe(DB_FILE, "a symbolic link or special file") from exc
    finally:
        os.close(root)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise _unsafe(DB_FILE, _kind(status.st_mode))
    return fd, status


def _open_fds() -> set[int]:
    """This process's open descriptors (without the one used to list them)."""
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return {int(name) for name in os.listdir(listing)} - {listing}
    finally:
        os.close(listing)


def _opened_same_file(before: set[int], checked: os.stat_result) -> bool:
    """Whether a descriptor opened since ``before`` is the ``checked`` file."""
    for fd in _open_fds() - before:
        try:
            status = os.fstat(fd)
        except OSError:  # closed meanwhile (another thread's)
            continue
        if (status.st_dev, status.st_ino) == (checked.st_dev, checked.st_ino):
            return True
    return False


def _connect(workspace: Path, timeout: float) -> sqlite3.Connection:
    """A connection to the workspace's database, proved to be the file checked race-free."""
    try:
        fd, checked = _open_checked(workspace)
    except OSError as exc:
        raise ToolError(f"cannot open the database: {exc.strerror or exc}",
                        code="SQLITE_CANTOPEN") from None
    try:
        before = _open_fds()
        try:
            conn = sqlite3.connect(os.path.join(os.path.realpath(workspace), DB_FILE),
                                   timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, f"cannot open the database: {exc}") from None
        if not _opened_same_file(before, checked):
            conn.close()
            raise _unsafe(DB_FILE, "replaced while it was opened (a link or another file)")
    finally:
        # Before SQLite takes a lock: closing another descriptor of the file drops its locks.
        os.close(fd)
    try:
        for pragma in _SETUP:
            conn.execute(pragma)
    except sqlite3.Error as exc:
        conn.close()
        raise _sqlite_error(exc, f"cannot use the database: {exc}") from None
    return conn


def _run(workspace: Path, query: str, params: Sequence[Param], budget: float, max_rows: int,
         stop: threading.Event) -> str:
    deadline = time.monotonic() + budget
    denied: list[str] = []
    conn = _connect(workspace, min(BUSY_TIMEOUT, budget))
    try:
        conn.set_authorizer(lambda *a: _authorize(denied, *a))
        conn.set_progress_handler(
            lambda: 1 if stop.is_set() or time.monotonic() > deadline else 0, _PROGRESS_OPS)
        try:
            cursor = conn.execute(query, params)
            if cursor.description is None:
                return _changed(cursor, query)
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchmany(max_rows + 1)
        except (sqlite3.Error, sqlite3.Warning) as exc:
            conn.set_progress_handler(None, 0)
            conn.set_authorizer(None)
            raise _failure(conn, exc, query, denied, budget, stop) from None
        return _table(columns, rows, max_rows)
    finally:
        conn.close()


def _authorize(denied: list[str], action: int, arg1: str | None, arg2: str | None,
               _db: str | None, _trigger: str | None) -> int:
    reason = ""
    if action == sqlite3.SQLITE_ATTACH and arg1:  # VACUUM attaches '' (a temporary file)
        reason = "ATTACH DATABASE is not allowed: only your own database is reachable"
    elif action == sqlite3.SQLITE_DETACH:
        reason = "DETACH DATABASE is not allowed"
    elif action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        reason = f"{arg2}() is not allowed"
    elif action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _DENIED_PRAGMAS:
        reason = f"PRAGMA {arg1} is not allowed"
    if reason:
        denied.append(reason)
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _changed(cursor: sqlite3.Cursor, query: str) -> str:
    if cursor.rowcount < 0:
        return "OK."
    n = cursor.rowcount
    text = f"OK: {n} row{'s' if n != 1 else ''} affected."
    stmt = parse_statement(query)
    if stmt is not None and stmt.verb == "INSERT" and n and cursor.lastrowid:
        text += f" Last inserted rowid: {cursor.lastrowid}."
    return text


def _table(columns: list[str], rows: list[Any], max_rows: int) -> str:
    shown = rows[:max_rows]
    result: dict[str, Any] = {
        "columns": columns,
        "rows": [[_cell(v) for v in row] for row in shown],
        "row_count": len(shown),
    }
    if len(rows) > max_rows:
        result["truncated"] = True
        result["note"] = (f"only the first {max_rows} rows are shown; add LIMIT/OFFSET or "
                          "WHERE, or aggregate")
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def _cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<blob, {len(value)} bytes>"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and len(value) > MAX_CELL_CHARS:
        return value[:MAX_CELL_CHARS] + f"… [{len(value) - MAX_CELL_CHARS} more characters]"
    return value


# --- errors ---------------------------------------------------------------------------


def _details(message: str, code: str, error_type: str, *, affected: Sequence[str] = (),
             dependencies: Sequence[str] = (), actions: Sequence[str] = ()) -> dict[str, Any]:
    given: dict[str, Any] = {"error_type": error_type}
    if affected:
        given["affected_resources"] = list(affected)
    if dependencies:
        given["dependencies"] = list(dependencies)
    if actions:
        given["suggested_actions"] = list(actions)
    return structure_error(message, code=code, details=given).to_dict()


def _sqlite_error(exc: BaseException, message: str | None = None) -> ToolError:
    code = getattr(exc, "sqlite_errorname", None) or "SQLITE_ERROR"
    text = message or str(exc) or type(exc).__name__
    return ToolError(text, code=code, retryable=code.startswith(_RETRYABLE),
                     details=structure_error(text, code=code).to_dict())


def _failure(conn: sqlite3.Connection, exc: BaseException, query: str, denied: list[str],
             budget: float, stop: threading.Event) -> ToolError:
    code = getattr(exc, "sqlite_errorname", None) or ""
    text = str(exc)
    if denied:
        message = f"refused: {denied[0]}"
        return ToolError(message, code="NOT_ALLOWED", details=_details(
            message, "NOT_ALLOWED", ERROR_TYPE_PERMISSION,
            actions=["Work only with tables in your own database"]))
    if code == "SQLITE_INTERRUPT" or text == "interrupted":
        if stop.is_set():
            return ToolError("the query was cancelled", code="CANCELLED")
        message = f"the statement was stopped after its {budget:g}s time limit"
        return ToolError(message, code="TIMEOUT", details=_details(
            message, "TIMEOUT", ERROR_TYPE_TIMEOUT,
            actions=["Make the statement cheaper: add WHERE or LIMIT, bound recursive CTEs, "
                     "avoid cross joins, or add an index"]))
    if "one statement at a time" in text:
        message = "only one SQL statement per call: send each statement in its own sql call"
        return ToolError(message, code="MULTIPLE_STATEMENTS")
    if "number of bindings" in text:
        return ToolError(f"{text} Pass one value in 'params' per ? placeholder.",
                         code="INVALID_ARGUMENT")
    if code == "SQLITE_CONSTRAINT_FOREIGNKEY":
        return _foreign_key_failure(conn, text, query)
    return _sqlite_error(exc)


def _foreign_key_failure(conn: sqlite3.Connection, text: str, query: str) -> ToolError:
    """SQLite names no table in its message; find the tables involved."""
    code = "SQLITE_CONSTRAINT_FOREIGNKEY"
    stmt = parse_statement(query)
    if stmt is None or not stmt.names:
        return ToolError(text, code=code, details=structure_error(text, code=code).to_dict())
    target = stmt.names[0]
    deadline = time.monotonic() + DEPENDENCY_LOOKUP_TIMEOUT
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, _PROGRESS_OPS)
    try:
        referencing, referenced = _foreign_keys(conn, target)
    except sqlite3.Error:
        referencing, referenced = [], []
    finally:
        conn.set_progress_handler(None, 0)
    message, dependencies, actions = _explain(stmt, target, referencing, referenced, text)
    return ToolError(message, code=code, details=_details(
        message, code, ERROR_TYPE_FOREIGN_KEY, affected=[target], dependencies=dependencies,
        actions=actions))


def _explain(stmt: SqlStatement, target: str, referencing: list[str], referenced: list[str],
             text: str) -> tuple[str, list[str], list[str]]:
    if stmt.verb in {"DROP", "DELETE", "TRUNCATE"} or (stmt.verb == "UPDATE" and referencing):
        if not referencing:
            return text, [], ["Find the rows that reference it and remove them first"]
        deps = ", ".join(referencing)
        message = f"{text}: rows in {deps} still reference {target}"
        if stmt.verb == "DROP":
            return message, referencing, [
                f"Drop dependent tables first: {deps}",
                f"Or delete the rows in {deps} that reference {target}",
                f"Then retry: DROP TABLE {target}",
            ]
        return message, referencing, [
            f"Delete or update the rows in {deps} that reference these {target} rows first",
            "Or recreate the foreign key with ON DELETE CASCADE",
        ]
    if referenced:
        deps = ", ".join(referenced)
        message = f"{text}: a value in {target} has no matching row in {deps}"
        return message, referenced, [
            f"Insert the referenced row into {deps} first",
            f"Or use a key value that exists in {deps}",
        ]
    return text, [], ["Check the foreign keys of the table (PRAGMA foreign_key_list)"]


def _foreign_keys(conn: sqlite3.Connection, target: str) -> tuple[list[str], list[str]]:
    """Tables with rows referencing ``target``, and the tables ``target`` references."""
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name")]
    wanted = target.lower()
    parent = next((t for t in tables if t.lower() == wanted), target)
    referencing = []
    for table in tables:
        if table.lower() == wanted:
            continue
        keys = _keys_to(conn, table, parent)
        if keys and any(_has_referencing_rows(conn, table, parent, cols) for cols in keys):
            referencing.append(table)
    referenced = sorted({str(r[0]) for r in conn.execute(
        'SELECT "table" FROM pragma_foreign_key_list(?)', (parent,))
        if str(r[0]).lower() != wanted})
    return referencing, referenced


def _keys_to(conn: sqlite3.Connection, child: str, parent: str) -> list[list[tuple[str, str]]]:
    """Each foreign key of ``child`` on ``parent``, as (child column, parent column) pairs."""
    by_id: dict[int, list[tuple[str, str | None]]] = {}
    for row in conn.execute(
        'SELECT id, seq, "table", "from", "to" FROM pragma_foreign_key_list(?) ORDER BY id, seq',
        (child,),
    ):
        if str(row[2]).lower() == parent.lower():
            by_id.setdefault(row[0], []).append((row[3], row[4]))
    if not by_id:
        return []
    primary = [r[0] for r in conn.execute(
        "SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", (parent,))]
    keys = []
    for pairs in by_id.values():
        implicit = len(primary) == len(pairs)
        keys.append([(frm, to if to is not None else (primary[i] if implicit else "rowid"))
                     for i, (frm, to) in enumerate(pairs)])
    return keys


def _has_referencing_rows(conn: sqlite3.Connection, child: str, parent: str,
                          columns: list[tuple[str, str]]) -> bool:
    match = " AND ".join(f"p.{_quote(to)} = c.{_quote(frm)}" for frm, to in columns)
    query = (f"SELECT 1 FROM {_quote(child)} AS c WHERE EXISTS "
             f"(SELECT 1 FROM {_quote(parent)} AS p WHERE {match}) LIMIT 1")
    try:
        return conn.execute(query).fetchone() is not None
    except sqlite3.Error:
        return True  # cannot tell: name it rather than hide it


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
