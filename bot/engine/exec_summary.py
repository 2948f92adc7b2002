"""A short summary of the current turn's tool calls, shown to the model before each LLM call.

The run loop records every tool execution of a user turn in an
:class:`ExecutionSummary` and, before each LLM call, adds
:meth:`ExecutionSummary.render` for the model to read::

    <TOOL_EXECUTION_SUMMARY>
    Recent tool executions this turn (oldest first):
    - sql: DROP TABLE customers → FAILED (foreign_key_constraint; blocked by: sales)
    - sql: DROP TABLE sales → SUCCESS (dropped table sales)
    State changes: dropped table sales.
    After sql "DROP TABLE customers" failed (blocked by sales): dropped table sales.
    </TOOL_EXECUTION_SUMMARY>

It lists facts only (what ran, what failed and why, what changed); deciding
whether to retry is the model's job. It keeps the last :data:`MAX_ENTRIES`
executions and is reset when a new user message starts a turn.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.tools.structured_errors import UNKNOWN, StructuredError, extract

MAX_ENTRIES = 5
"""Executions shown in the summary."""
MAX_CHANGES = 10
"""State changes of the turn listed (the latest ones)."""
MAX_KEY_CHARS = 80
"""The key argument is cut to this many characters."""
MAX_ERROR_CHARS = 100
"""An unclassified error is shown by its first line, cut to this many characters."""

KEY_ARGUMENTS = ("query", "sql", "statement", "command", "path", "url", "name", "file",
                 "target", "key", "id", "pattern")
"""Argument names tried in order for the one that best tells what a call did."""

_REMOVING = frozenset({"delete", "remove", "rm", "unlink", "drop"})
_CHANGING = frozenset({"write", "create", "save", "put", "edit", "update", "append", "move",
                       "rename", "mkdir", "set", "insert", "upload"})


# --- SQL statements -------------------------------------------------------------------

_NAME = r"""(?:"[^"]+"|`[^`]+`|\[[^\]]+\]|[\w$]+)(?:\.(?:"[^"]+"|`[^`]+`|\[[^\]]+\]|[\w$]+))?"""
_KINDS = (r"TABLE|INDEX|VIEW|TRIGGER|DATABASE|SCHEMA|SEQUENCE|FUNCTION|PROCEDURE|TYPE|"
          r"MATERIALIZED\s+VIEW")
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_STATEMENTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (verb, re.compile(pattern, re.IGNORECASE)) for verb, pattern in (
        ("CREATE", rf"CREATE\s+(?:OR\s+REPLACE\s+)?(?:(?:GLOBAL|LOCAL)\s+)?"
                   rf"(?:TEMP(?:ORARY)?\s+)?(?:UNIQUE\s+)?(?:VIRTUAL\s+)?(?P<kind>{_KINDS})\s+"
                   rf"(?:IF\s+NOT\s+EXISTS\s+)?(?P<names>{_NAME})"),
        ("DROP", rf"DROP\s+(?:TEMPORARY\s+)?(?P<kind>{_KINDS})\s+(?:IF\s+EXISTS\s+)?"
                 rf"(?P<names>{_NAME}(?:\s*,\s*{_NAME})*)"),
        ("ALTER", rf"ALTER\s+(?P<kind>TABLE)\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(?P<names>{_NAME})"
                  rf"(?:\s+RENAME\s+TO\s+(?P<new>{_NAME}))?"),
        ("INSERT", rf"(?:INSERT|REPLACE)\s+(?:OR\s+\w+\s+|IGNORE\s+)?INTO\s+(?P<names>{_NAME})"),
        ("UPDATE", rf"UPDATE\s+(?:OR\s+\w+\s+)?(?:ONLY\s+)?(?P<names>{_NAME})"),
        ("DELETE", rf"DELETE\s+FROM\s+(?:ONLY\s+)?(?P<names>{_NAME})"),
        ("TRUNCATE", rf"TRUNCATE\s+(?:TABLE\s+)?(?P<names>{_NAME})"),
    )
)


@dataclass(frozen=True, slots=True)
class SqlStatement:
    """What one SQL statement does to which object (names unquoted and unqualified)."""

    verb: str
    """``CREATE``, ``DROP``, ``ALTER``, ``INSERT``, ``UPDATE``, ``DELETE`` or ``TRUNCATE``."""
    kind: str
    """``table``, ``index``, ``view``...; ``table`` for row changes."""
    names: tuple[str, ...]
    new_name: str = ""
    """For ``ALTER TABLE x RENAME TO y``: ``y``."""


def parse_statement(query: str) -> SqlStatement | None:
    """The change a statement makes, or ``None`` for reads and anything unrecognised."""
    text = _COMMENTS.sub(" ", query).strip()
    for verb, pattern in _STATEMENTS:
        m = pattern.match(text)
        if m:
            kind = " ".join((m.groupdict().get("kind") or "table").lower().split())
            names = tuple(_unquote(n) for n in re.findall(_NAME, m["names"]))
            return SqlStatement(verb, kind, names, _unquote(m.groupdict().get("new") or ""))
    return None


def _unquote(name: str) -> str:
    last = re.findall(r""""[^"]+"|`[^`]+`|\[[^\]]+\]|[\w$]+""", name)
    part = last[-1] if last else name
    return part[1:-1] if part[:1] in {'"', "`", "["} else part


# --- the summary ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateChange:
    """One change a successful call made: ``text`` for the model, ``target`` to match on."""

    text: str
    target: str


@dataclass(slots=True)
class Execution:
    """One recorded tool call."""

    seq: int
    tool: str
    key: str
    ok: bool
    outcome: str
    changes: tuple[StateChange, ...] = ()
    dependencies: tuple[str, ...] = ()


@dataclass(slots=True)
class ExecutionSummary:
    """The last :data:`MAX_ENTRIES` tool executions of the current user turn."""

    max_entries: int = MAX_ENTRIES
    _entries: deque[Execution] = field(init=False)
    _changes: deque[tuple[int, StateChange]] = field(init=False)
    _seq: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._entries = deque(maxlen=self.max_entries)
        self._changes = deque(maxlen=MAX_CHANGES)

    @property
    def entries(self) -> list[Execution]:
        """The recorded executions, oldest first."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def reset(self) -> None:
        """Forget everything: a new user message starts a new turn."""
        self._entries.clear()
        self._changes.clear()

    def record(self, tool_name: str, arguments: Mapping[str, Any] | None, ok: bool,
               result_or_error: str, structured: StructuredError | None = None) -> None:
        """Note one execution.

        ``structured`` is the failure's facts; when omitted they are read from
        ``result_or_error``: the error JSON object in it (``{"status": "error",
        "error": ..., "dependencies": [...]}``) if there is one, else its text.
        """
        self._seq += 1
        args: Mapping[str, Any] = arguments if isinstance(arguments, Mapping) else {}
        arg_name, key_value = _key_argument(args)
        key = _shorten(key_value, MAX_KEY_CHARS)
        text = result_or_error if isinstance(result_or_error, str) else str(result_or_error)
        if ok:
            changes = tuple(_state_changes(tool_name, arg_name, key_value, text))
            detail = "; ".join(c.text for c in changes)
            entry = Execution(self._seq, tool_name, key, True,
                              f"SUCCESS ({detail})" if detail else "SUCCESS", changes)
            self._changes.extend((self._seq, c) for c in changes)
        else:
            error = structured if structured is not None else _structured(text)
            entry = Execution(self._seq, tool_name, key, False, _failure(error),
                              dependencies=tuple(error.dependencies))
        self._entries.append(entry)

    def render(self) -> str:
        """The ``<TOOL_EXECUTION_SUMMARY>`` block, or ``''`` when nothing ran this turn."""
        if not self._entries:
            return ""
        lines = ["<TOOL_EXECUTION_SUMMARY>", "Recent tool executions this turn (oldest first):"]
        for e in self._entries:
            call = f"{e.tool}: {e.key}" if e.key else e.tool
            lines.append(f"- {call} → {e.outcome}")
        if self._changes:
            lines.append("State changes: " + "; ".join(c.text for _, c in self._changes) + ".")
        lines += self._resolved()
        lines.append("</TOOL_EXECUTION_SUMMARY>")
        return "\n".join(lines)

    def _resolved(self) -> list[str]:
        """Failures whose dependencies changed later (and that were not redone since)."""
        notes = []
        entries = list(self._entries)
        for i, e in enumerate(entries):
            if e.ok or not e.dependencies:
                continue
            if any(later.ok and later.tool == e.tool and later.key == e.key
                   for later in entries[i + 1:]):
                continue
            deps = {d.lower() for d in e.dependencies}
            later_changes = [c.text for seq, c in self._changes
                             if seq > e.seq and c.target.lower() in deps]
            if later_changes:
                notes.append(f'After {e.tool} "{e.key}" failed (blocked by '
                             f"{', '.join(e.dependencies)}): {'; '.join(later_changes)}.")
        return notes


def _key_argument(args: Mapping[str, Any]) -> tuple[str, str]:
    for name in KEY_ARGUMENTS:
        value = args.get(name)
        if isinstance(value, str) and value.strip():
            return name, value
    for name, value in args.items():
        if isinstance(value, str) and value.strip():
            return str(name), value
    if not args:
        return "", ""
    try:
        return "", json.dumps(args, ensure_ascii=False, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        return "", ""


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _structured(text: str) -> StructuredError:
    """The facts of a failure from its text: an error JSON object if it has one."""
    start = text.find("{")
    if start >= 0:
        try:
            data, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            code = data.get("error_code")
            return extract(data["error"], code=code if isinstance(code, str) else None,
                           details=data)
    return extract(text)


def _failure(error: StructuredError) -> str:
    if error.error_type == UNKNOWN:
        text = error.message
        first = next((line for line in text.strip().splitlines() if line.strip()), "error")
        return f"FAILED: {_shorten(first, MAX_ERROR_CHARS)}"
    parts = [error.error_type]
    if error.dependencies:
        parts.append("blocked by: " + ", ".join(error.dependencies))
    elif error.affected_resources:
        parts.append(", ".join(error.affected_resources))
    return f"FAILED ({'; '.join(parts)})"


_ROWS = re.compile(r"\b(\d+) rows? (?:affected|changed)", re.IGNORECASE)


def _state_changes(tool: str, arg_name: str, key: str, result: str) -> list[StateChange]:
    lowered = tool.lower()
    if not key:
        return []
    words = set(re.split(r"[_\W]+", lowered))
    if "sql" in lowered or words & {"db", "database"} or arg_name in {"sql", "statement"}:
        return _sql_changes(key, result)
    path = _shorten(key, MAX_KEY_CHARS)
    if lowered == "write_file":
        verb = "created" if result.lstrip().startswith("Created") else "overwrote"
        return [StateChange(f"{verb} {path}", key)]
    if lowered == "edit_file":
        return [StateChange(f"edited {path}", key)]
    if words & _REMOVING:
        return [StateChange(f"{tool} removed {path}", key)]
    if words & _CHANGING:
        return [StateChange(f"{tool} changed {path}", key)]
    return []


def _sql_changes(query: str, result: str) -> list[StateChange]:
    stmt = parse_statement(query)
    if stmt is None:
        return []
    rows = _ROWS.search(result)
    count = int(rows[1]) if rows else None
    if stmt.verb in {"INSERT", "UPDATE", "DELETE"} and count == 0:
        return []
    n = f"{count} row{'s' if count != 1 else ''} " if count is not None else ""
    changes = []
    for name in stmt.names:
        if stmt.verb == "CREATE":
            text = f"created {stmt.kind} {name}"
        elif stmt.verb == "DROP":
            text = f"dropped {stmt.kind} {name}"
        elif stmt.verb == "ALTER":
            text = (f"renamed table {name} to {stmt.new_name}" if stmt.new_name
                    else f"altered table {name}")
        elif stmt.verb == "INSERT":
            text = f"inserted {n}into {name}"
        elif stmt.verb == "UPDATE":
            text = f"updated {n}in {name}"
        elif stmt.verb == "DELETE":
            text = f"deleted {n}from {name}"
        else:
            text = f"emptied table {name}"
        changes.append(StateChange(text, name))
    return changes
