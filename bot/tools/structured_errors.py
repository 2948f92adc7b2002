"""Structured facts pulled out of a tool's error message.

:func:`extract` turns an error message (plus the tool's error code and any
``details`` it attached) into a :class:`StructuredError`: a category
(``error_type``), the resources it names, what they depend on, and concrete
next steps. The fields are additive: the original message always travels with
them unchanged, so when a pattern misses, the model still reads the text.

Patterns cover the usual wording of SQLite, PostgreSQL and MySQL, Python and
POSIX OS errors, and HTTP client errors. What a tool says in ``details`` wins
over any pattern, field by field. :func:`extract` never raises: anything that
goes wrong yields ``error_type="unknown"`` with the message intact.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

log = logging.getLogger("roost.tools.structured_errors")

FOREIGN_KEY: Final = "foreign_key_constraint"
SYNTAX: Final = "syntax_error"
PERMISSION: Final = "permission_denied"
NOT_FOUND: Final = "resource_not_found"
EXISTS: Final = "resource_exists"
CONNECTION: Final = "connection_error"
TIMEOUT: Final = "timeout"
UNKNOWN: Final = "unknown"

ERROR_TYPES: Final = frozenset(
    {FOREIGN_KEY, SYNTAX, PERMISSION, NOT_FOUND, EXISTS, CONNECTION, TIMEOUT, UNKNOWN}
)
"""Every ``error_type`` :func:`extract` can return."""

MAX_ITEMS = 10
"""Each list field keeps at most this many entries."""
MAX_ITEM_CHARS = 200
"""Each list entry is cut to this many characters."""

GENERIC_CODES: Final = frozenset({"", "TOOL_ERROR"})
"""Tool error codes that say nothing a message pattern could not say better."""


@dataclass(slots=True)
class StructuredError:
    """An error message with the facts a model needs to decide what to do next."""

    error_code: str
    error_type: str
    message: str
    """The original error message, unchanged."""
    affected_resources: list[str] = field(default_factory=list)
    """What the failed operation was about (tables, columns, files, URLs)."""
    dependencies: list[str] = field(default_factory=list)
    """What must change before a retry can succeed (e.g. tables referencing a table)."""
    suggested_actions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The additive fields of the error JSON, every key always present.

        The executor adds ``status`` and ``error`` (the original message)::

            {"status": "error", "error": message, **structured.to_dict()}
        """
        return {
            "error_code": self.error_code,
            "error_type": self.error_type,
            "affected_resources": list(self.affected_resources),
            "dependencies": list(self.dependencies),
            "suggested_actions": list(self.suggested_actions),
        }


def extract(
    message: str, *, code: str | None = None, details: Mapping[str, Any] | None = None
) -> StructuredError:
    """Categorise ``message``; ``code`` is the tool's error code, ``details`` its own facts.

    Precedence for each field: ``details`` > a message pattern > ``code``.
    Never raises.
    """
    try:
        text = message if isinstance(message, str) else str(message)
    except Exception:
        text = "<unprintable error>"
    try:
        found = _from_patterns(text, code)
    except Exception:
        log.debug("error extraction failed", exc_info=True)
        found = StructuredError(_clean_code(code), UNKNOWN, text)
    if details:
        try:
            _apply_details(found, details)
        except Exception:
            log.debug("ignoring malformed error details", exc_info=True)
        if "suggested_actions" not in details and not found.suggested_actions \
                and found.error_type in _DEFAULT_ACTIONS:
            found.suggested_actions = [_DEFAULT_ACTIONS[found.error_type]]
    return found


# --- patterns -----------------------------------------------------------------

_ID1 = r"""(?:"[^"\n]+"|`[^`\n]+`|'[^'\n]+'|\[[^\]\n]+\]|[\w$]+)"""
_QID = rf"{_ID1}(?:\.{_ID1})*"
"""A possibly quoted, possibly qualified SQL name: ``x``, ``"x"``, ```db`.`x```, ``'db.x'``."""
_I = re.IGNORECASE


@dataclass(slots=True)
class _Hit:
    error_type: str
    affected: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    code: str = ""


_Build = Callable[[re.Match[str], str], _Hit]


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    build: _Build


def _name(raw: str | None) -> str:
    """A SQL name without quotes or qualifier: ```db`.`b``` → ``b``, ``'db.x'`` → ``x``."""
    if not raw:
        return ""
    parts = re.findall(_ID1, raw.strip())
    last = parts[-1] if parts else raw.strip()
    last = _unquote(last)
    return last.rsplit(".", 1)[-1] if raw.strip()[:1] in "'" else last


def _unquote(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and (raw[0], raw[-1]) in {('"', '"'), ("`", "`"), ("'", "'"), ("[", "]")}:
        return raw[1:-1]
    return raw


def _names(raws: Iterable[str | None]) -> list[str]:
    return [n for n in (_name(r) for r in raws) if n]


def _fixed(error_type: str, *actions: str) -> _Build:
    return lambda _m, _t: _Hit(error_type, actions=list(actions))


def _rule(pattern: str, build: _Build, flags: int = _I) -> _Rule:
    return _Rule(re.compile(pattern, flags), build)


# Foreign keys --------------------------------------------------------------------


def _drop_blocked(parent: str, children: list[str], constraint: str = "") -> _Hit:
    actions = []
    if children:
        actions.append(f"Drop dependent tables first: {', '.join(children)}")
        fk = f" {constraint}" if constraint else ""
        actions.append(f"Or drop the foreign key constraint{fk} on {children[0]} "
                       "(or define it with ON DELETE CASCADE)")
    else:
        actions.append("Drop or alter the tables that reference it first")
    if parent:
        actions.append(f"Then retry dropping {parent}")
    return _Hit(FOREIGN_KEY, [parent] if parent else [], children, actions)


def _mysql_drop(m: re.Match[str], _t: str) -> _Hit:
    return _drop_blocked(_name(m["a"]), _names([m["b"]]), _name(m["fk"]))


def _pg_drop(m: re.Match[str], text: str) -> _Hit:
    parent = _name(m["a"])
    children, constraints = [], []
    for dep in re.finditer(rf"constraint ({_QID}) on table ({_QID}) depends on", text, _I):
        constraints.append(_name(dep[1]))
        children.append(_name(dep[2]))
    hit = _drop_blocked(parent, _dedup(children), constraints[0] if constraints else "")
    hit.actions.insert(min(2, len(hit.actions) - 1), f"Or use DROP TABLE {parent} CASCADE")
    return hit


def _parent_row(parent: str, child: str, constraint: str = "") -> _Hit:
    fk = f" {constraint}" if constraint else ""
    actions = [
        f"Delete or update the rows in {child} that reference {parent} first"
        if child else "Delete or update the referencing rows first",
        f"Or define the foreign key{fk} with ON DELETE CASCADE",
    ]
    return _Hit(FOREIGN_KEY, [parent] if parent else [], [child] if child else [], actions)


def _pg_parent(m: re.Match[str], _t: str) -> _Hit:
    return _parent_row(_name(m["a"]), _name(m["b"]), _name(m["fk"]))


def _mysql_parent(m: re.Match[str], _t: str) -> _Hit:
    return _parent_row(_name(m["a"]), _name(m["b"]), _name(m["fk"]))


def _child_row(child: str, parent: str) -> _Hit:
    target = parent or "the referenced table"
    return _Hit(FOREIGN_KEY, [child] if child else [], [parent] if parent else [], [
        f"Insert the referenced row into {target} first",
        f"Or use a key value that exists in {target}",
    ])


def _pg_child(m: re.Match[str], text: str) -> _Hit:
    parent = re.search(rf"is not present in table ({_QID})", text, _I)
    return _child_row(_name(m["b"]), _name(parent[1]) if parent else "")


def _mysql_child(m: re.Match[str], _t: str) -> _Hit:
    return _child_row(_name(m["b"]), _name(m["a"]))


def _fk_mismatch(m: re.Match[str], _t: str) -> _Hit:
    child, parent = _name(m["b"]), _name(m["a"])
    return _Hit(FOREIGN_KEY, [child], [parent], [
        f"Fix the foreign key of {child}: the columns it references in {parent} "
        "must exist and be its PRIMARY KEY or UNIQUE",
    ])


# Syntax --------------------------------------------------------------------------


def _near(token: str, line: str | None = None) -> _Hit:
    where = f" (line {line})" if line else ""
    return _Hit(SYNTAX, actions=[
        f"Fix the statement near {token}{where}: check keywords, quoting, commas and "
        "parentheses",
    ])


def _syntax_near(m: re.Match[str], _t: str) -> _Hit:
    return _near(m["tok"].strip(), m.groupdict().get("line"))


def _syntax_near_mysql(m: re.Match[str], _t: str) -> _Hit:
    token = m["tok"].strip()
    return _near(f"'{token}'" if token else "the end of the statement", m["line"])


# Missing and existing resources ---------------------------------------------------

_KIND_ALIASES = {"relation": "table"}


def _missing(m: re.Match[str], _t: str) -> _Hit:
    groups = m.groupdict()
    kind = _KIND_ALIASES.get((groups.get("kind") or "table").lower(),
                             (groups.get("kind") or "table").lower())
    name = _name(groups.get("n"))
    owner = _name(groups.get("rel") or groups.get("where"))
    if kind == "column":
        where = f" of {owner}" if owner and owner not in {"field list", "where clause"} else ""
        actions = [f"Check the column name: list the columns{where} first"]
    elif kind in {"function", "module", "collation", "type"}:
        actions = [f"Check the {kind} name: {name or 'it'} is not available here"]
    else:
        actions = [f"Check the {kind} name: list the existing {kind}s first",
                   f"Create the {kind} first if it should exist"]
    affected = [f"{owner}.{name}" if kind == "column" and owner and "." not in name
                and owner not in {"field list", "where clause"} else name]
    return _Hit(NOT_FOUND, [a for a in affected if a], actions=actions)


def _existing(m: re.Match[str], _t: str) -> _Hit:
    groups = m.groupdict()
    kind = _KIND_ALIASES.get((groups.get("kind") or "table").lower(),
                             (groups.get("kind") or "table").lower())
    name = _name(groups.get("n"))
    owner = _name(groups.get("rel"))
    if kind == "column":
        resource = f"{owner}.{name}" if owner else name
        actions = [f"The column {resource} already exists: use it, or pick another name"]
        return _Hit(EXISTS, [resource], actions=actions)
    guard = " (or CREATE ... IF NOT EXISTS)" if kind in {"table", "index", "view"} else ""
    actions = [f"The {kind} {name} already exists: use it, or pick another name{guard}",
               "Drop it first only if it should really be replaced"]
    return _Hit(EXISTS, [name] if name else [], actions=actions)


def _duplicate_key(tables: list[str], what: str) -> _Hit:
    return _Hit(EXISTS, tables, actions=[
        f"A row with the same {what} already exists: update that row instead, "
        "or insert a different value",
        "Or use an upsert (INSERT ... ON CONFLICT / ON DUPLICATE KEY UPDATE)",
    ])


def _sqlite_unique(m: re.Match[str], _t: str) -> _Hit:
    columns = [c.strip() for c in m["cols"].split(",")]
    tables = _dedup(c.rsplit(".", 1)[0] for c in columns if "." in c)
    return _duplicate_key(tables, ", ".join(columns))


def _pg_unique(m: re.Match[str], text: str) -> _Hit:
    key = re.search(r"Key \((?P<cols>[^)]*)\)=\((?P<v>[^)]*)\) already exists", text, _I)
    what = f"{key['cols']} ({key['v']})" if key else f"key ({_name(m['c'])})"
    return _duplicate_key([], what)


def _mysql_duplicate(m: re.Match[str], _t: str) -> _Hit:
    key = _unquote(m["k"])  # MySQL 8 says 'table.key'
    tables = [key.rsplit(".", 1)[0]] if "." in key else []
    return _duplicate_key(tables, f"value {m['v']} for key {key}")


# Permissions -----------------------------------------------------------------------


def _pg_denied(m: re.Match[str], _t: str) -> _Hit:
    name = _name(m["n"])
    return _Hit(PERMISSION, [name], actions=[
        f"You lack the privilege on {name}: use another object or ask the user for access",
    ])


def _mysql_denied_cmd(m: re.Match[str], _t: str) -> _Hit:
    table = _name(m["t"])
    return _Hit(PERMISSION, [table], actions=[
        f"This account may not run {m['cmd'].upper()} on {table}: "
        "ask the user for the privilege or use another table",
    ])


def _mysql_access(m: re.Match[str], _t: str) -> _Hit:
    db = _name(m.groupdict().get("db"))
    return _Hit(PERMISSION, [db] if db else [], actions=[
        "The database account was refused: check the credentials and grants with the user",
    ])


# OS errors -------------------------------------------------------------------------

_QUOTED_PATH = re.compile(r"""(?:'([^']+)'|"([^"]+)")(?:\s*->\s*(?:'[^']+'|"[^"]+"))?\s*$""")
_NODE_PATH = re.compile(r""",\s*\w+\s+'([^']+)'""")


def _path(text: str) -> list[str]:
    """The file a Python or Node OS error names, if any."""
    for line in text.splitlines():
        m = _QUOTED_PATH.search(line.strip())
        if m:
            return [m[1] or m[2]]
        n = _NODE_PATH.search(line)
        if n:
            return [n[1]]
    return []


def _os_error(error_type: str, code: str, *actions: str) -> _Build:
    def build(_m: re.Match[str], text: str) -> _Hit:
        paths = _path(text)
        target = paths[0] if paths else "the path"
        named = re.search(rf"\b{code}\b", text)  # [Errno N] is read by _code_in
        return _Hit(error_type, paths, actions=[a.format(path=target) for a in actions],
                    code=code if named else "")

    return build


# HTTP --------------------------------------------------------------------------------

_URL = re.compile(r"""https?://[^\s'"<>)\]]+""")

_HTTP_EXPLICIT = r"\b(?:HTTP(?:/[\d.]+)?|status(?:[ _]?code)?)\s*[:=]?\s*(?P<s>[45]\d\d)\b"
_HTTP_REASON = (
    r"\b(?P<s>[1-5]\d\d)\b[\s,:'\"-]*(?:message=['\"]?)?(?:Not Found|Gone|Unauthori[sz]ed|"
    r"Forbidden|Conflict|Too Many Requests|Internal Server Error|Bad Gateway|"
    r"Service (?:Temporarily )?Unavailable|Gateway Time-?out|Request Time-?out|"
    r"Proxy Authentication Required|Client Error|Server Error)"
)


def _http(m: re.Match[str], text: str) -> _Hit:
    status = int(m["s"])
    urls = [u.rstrip(".,;:") for u in _URL.findall(text)][:1]
    code = f"HTTP_{status}"
    target = urls[0] if urls else "the URL"
    if status in (404, 410):
        return _Hit(NOT_FOUND, urls, actions=[f"Check {target}: it does not exist"], code=code)
    if status in (401, 403, 407):
        return _Hit(PERMISSION, urls, actions=[
            "Check the credentials or token; ask the user if access is missing"], code=code)
    if status == 409:
        return _Hit(EXISTS, urls, actions=[
            "The request conflicts with the current state (it may already exist): "
            "fetch the current state, then retry"], code=code)
    if status in (408, 504):
        return _Hit(TIMEOUT, urls, actions=["Retry later, or ask for less at once"], code=code)
    if status == 429:
        return _Hit(CONNECTION, urls, actions=[
            "Rate limited: wait before retrying (honour Retry-After if given)"], code=code)
    if status >= 500:
        return _Hit(CONNECTION, urls, actions=[
            "The remote service failed: retry later"], code=code)
    return _Hit(UNKNOWN, urls, code=code)


# Connection ---------------------------------------------------------------------------


_HOST = re.compile(
    r"""(?:server (?:on|at)|connection to server at)\s+(?P<h>'[^']+'|"[^"]+"|[\w.:-]+)""", _I)


def _connection(m: re.Match[str], text: str) -> _Hit:
    urls = _URL.findall(text)[:1]
    host = _HOST.search(text)
    affected = urls or ([_unquote(host["h"])] if host else [])
    return _Hit(CONNECTION, affected, actions=[
        "Check that the server or service is running and reachable, then retry",
    ])


# The table, most specific first --------------------------------------------------------

_RULES: tuple[_Rule, ...] = (
    # Foreign keys.
    _rule(rf"Cannot drop table (?P<a>{_QID}) referenced by (?:a )?foreign key constraint "
          rf"(?P<fk>{_QID}) on table (?P<b>{_QID})", _mysql_drop),
    _rule(rf"cannot drop (?:table|relation) (?P<a>{_QID}) because other objects depend on it",
          _pg_drop),
    _rule(rf"(?:update or delete|delete|update) on table (?P<a>{_QID}) violates foreign key "
          rf"constraint (?P<fk>{_QID}) on table (?P<b>{_QID})", _pg_parent),
    _rule(rf"insert or update on table (?P<b>{_QID}) violates foreign key constraint "
          rf"(?P<fk>{_QID})", _pg_child),
    _rule(rf"Cannot delete or update a parent row: a foreign key constraint fails"
          rf"(?: \((?P<b>{_QID}), CONSTRAINT (?P<fk>{_QID}) FOREIGN KEY \([^)]*\) "
          rf"REFERENCES (?P<a>{_QID}))?", _mysql_parent),
    _rule(rf"Cannot add or update a child row: a foreign key constraint fails"
          rf"(?: \((?P<b>{_QID}), CONSTRAINT (?P<fk>{_QID}) FOREIGN KEY \([^)]*\) "
          rf"REFERENCES (?P<a>{_QID}))?", _mysql_child),
    _rule(rf"foreign key mismatch - (?P<b>{_QID}) referencing (?P<a>{_QID})", _fk_mismatch),
    _rule(r"foreign key constraint|violates foreign key|FOREIGN KEY constraint failed",
          _fixed(FOREIGN_KEY, "Find the rows or tables that reference it (or that it "
                 "references) and resolve them first, then retry")),
    # Syntax.
    _rule(r"You have an error in your SQL syntax.*?near '(?P<tok>.*?)' at line (?P<line>\d+)",
          _syntax_near_mysql, _I | re.DOTALL),
    _rule(r"syntax error at or near (?P<tok>\"[^\"]*\"|\S+)", _syntax_near),
    _rule(r"near (?P<tok>\"[^\"]*\"|'[^']*'|\S+): syntax error", _syntax_near),
    _rule(r"unrecognized token: (?P<tok>.+)", _syntax_near),
    _rule(r"syntax error at end of input|incomplete input|unexpected end of (?:input|statement)",
          _fixed(SYNTAX, "The statement is incomplete: close quotes and parentheses "
                 "and finish the statement")),
    _rule(r"You have an error in your SQL syntax|\bsyntax error\b",
          _fixed(SYNTAX, "Fix the statement's syntax and retry")),
    # SQL resources that do not exist.
    _rule(r"\bno such (?P<kind>table|column|index|view|trigger|function|module|collation): "
          r"(?P<n>\S+)", _missing),
    _rule(rf"\b(?P<kind>relation|table|column|database|schema|index|view|function|role|type|"
          rf"sequence) (?P<n>{_QID})(?: of relation (?P<rel>{_QID}))? does not exist",
          _missing),
    _rule(rf"\b(?P<kind>Table) (?P<n>{_QID}) doesn't exist", _missing),
    _rule(rf"Unknown (?P<kind>column|table|database) (?P<n>{_QID})(?: in (?P<where>{_QID}))?",
          _missing),
    # SQL resources that already exist.
    _rule(rf"\b(?P<kind>column) (?P<n>{_QID}) of relation (?P<rel>{_QID}) already exists",
          _existing),
    _rule(rf"\b(?P<kind>table|relation|index|view|trigger|database|schema|role|type|function|"
          rf"sequence) (?P<n>{_QID}) already exists", _existing),
    _rule(rf"duplicate (?P<kind>column) name:? (?P<n>{_QID})", _existing),
    _rule(r"UNIQUE constraint failed: (?P<cols>[\w$.]+(?:, [\w$.]+)*)", _sqlite_unique),
    _rule(rf"duplicate key value violates unique constraint (?P<c>{_QID})", _pg_unique),
    _rule(rf"Duplicate entry (?P<v>'.*?') for key (?P<k>{_QID})", _mysql_duplicate),
    # SQL permissions.
    _rule(rf"permission denied for (?:table|relation|schema|database|sequence|view|function) "
          rf"(?P<n>{_QID})", _pg_denied),
    _rule(rf"must be owner of (?:table|relation|\w+) (?P<n>{_QID})", _pg_denied),
    _rule(rf"(?P<cmd>\w+) command denied to user (?P<u>{_QID})(?:@(?P<h>{_QID}))? for table "
          rf"(?P<t>{_QID})", _mysql_denied_cmd),
    _rule(rf"Access denied for user (?P<u>{_QID})(?:@(?P<h>{_QID}))?"
          rf"(?: to database (?P<db>{_QID}))?", _mysql_access),
    _rule(r"attempt to write a readonly database|readonly database",
          _fixed(PERMISSION, "The database is read-only here: only read from it, or ask "
                 "the user to make it writable")),
    _rule(r"\bnot authorized\b",
          _fixed(PERMISSION, "This operation is not allowed here: do it another way")),
    # Busy and timeouts.
    _rule(r"database (?:table )?is locked|SQLITE_BUSY|Lock wait timeout exceeded|"
          r"deadlock detected|Deadlock found",
          _fixed(TIMEOUT, "Another operation holds a lock: retry shortly")),
    _rule(r"canceling statement due to statement timeout|maximum statement execution time",
          _fixed(TIMEOUT, "The statement ran too long: narrow it (WHERE, LIMIT, an index) "
                 "and retry")),
    # HTTP (before OS errors and the generic fallbacks, for the status and URL).
    _rule(_HTTP_EXPLICIT, _http),
    _rule(_HTTP_REASON, _http),
    # OS errors.
    _rule(r"\[Errno 2\]|\bENOENT\b|No such file or directory",
          _os_error(NOT_FOUND, "ENOENT", "Check {path}: list the directory to find the "
                    "right name")),
    _rule(r"\[Errno 17\]|\bEEXIST\b|File exists",
          _os_error(EXISTS, "EEXIST", "{path} already exists: use it, or pick another name")),
    _rule(r"\[Errno 13\]|\bEACCES\b|Permission denied",
          _os_error(PERMISSION, "EACCES", "No permission for {path}: use another location "
                    "or ask the user")),
    _rule(r"\[Errno 1\]|\bEPERM\b|Operation not permitted",
          _os_error(PERMISSION, "EPERM", "The operation on {path} is not permitted")),
    _rule(r"\[Errno 111\]|\bECONNREFUSED\b|Connection refused", _connection),
    _rule(r"\[Errno 110\]|\bETIMEDOUT\b|\btimed? ?out\b",
          _fixed(TIMEOUT, "Retry later, or make the operation smaller")),
    _rule(r"\bECONNRESET\b|Connection reset|\bEHOSTUNREACH\b|\bENETUNREACH\b|No route to host|"
          r"Network is unreachable|Name or service not known|nodename nor servname|"
          r"Temporary failure in name resolution|getaddrinfo failed|could not connect to server|"
          r"Can't connect to (?:local )?MySQL server|Lost connection to MySQL server|"
          r"server closed the connection unexpectedly|unable to open database file|"
          r"connection (?:error|failed|closed)", _connection),
    # Generic fallbacks.
    _rule(r"(?P<n>'[^'\n]+'|\"[^\"\n]+\") (?:does not exist|doesn't exist|not found|is missing)",
          lambda m, _t: _Hit(NOT_FOUND, [_unquote(m["n"])], actions=[
              f"Check the name {m['n']}: list what exists first"])),
    _rule(r"\bdoes not exist\b|\bdoesn't exist\b|\bnot found\b",
          _fixed(NOT_FOUND, "Check the name: list what exists first")),
    _rule(r"\balready exists\b", _fixed(EXISTS, "Use the existing one, or pick another name")),
    _rule(r"\bpermission denied\b|\baccess denied\b|\bforbidden\b|\bunauthori[sz]ed\b",
          _fixed(PERMISSION, "Access was refused: use another resource or ask the user")),
)

_CODE_TYPES: tuple[tuple[str, str], ...] = (
    ("FOREIGNKEY", FOREIGN_KEY), ("FOREIGN_KEY", FOREIGN_KEY),
    ("SYNTAX", SYNTAX),
    ("NOT_FOUND", NOT_FOUND), ("NOTFOUND", NOT_FOUND), ("ENOENT", NOT_FOUND),
    ("HTTP_404", NOT_FOUND), ("HTTP_410", NOT_FOUND),
    ("EXISTS", EXISTS), ("EEXIST", EXISTS), ("DUPLICATE", EXISTS), ("UNIQUE", EXISTS),
    ("PRIMARYKEY", EXISTS), ("HTTP_409", EXISTS),
    ("PERMISSION", PERMISSION), ("DENIED", PERMISSION), ("FORBIDDEN", PERMISSION),
    ("UNAUTHORI", PERMISSION), ("PATH_ESCAPE", PERMISSION), ("READONLY", PERMISSION),
    ("EACCES", PERMISSION), ("EPERM", PERMISSION), ("AUTH", PERMISSION),
    ("HTTP_401", PERMISSION), ("HTTP_403", PERMISSION),
    ("TIMEOUT", TIMEOUT), ("TIMED_OUT", TIMEOUT), ("ETIMEDOUT", TIMEOUT), ("BUSY", TIMEOUT),
    ("LOCKED", TIMEOUT), ("INTERRUPT", TIMEOUT), ("HTTP_408", TIMEOUT), ("HTTP_504", TIMEOUT),
    ("CONNECT", CONNECTION), ("NETWORK", CONNECTION), ("UNAVAILABLE", CONNECTION),
    ("HTTP_5", CONNECTION), ("HTTP_429", CONNECTION), ("CANTOPEN", CONNECTION),
)
"""Substrings of a tool's error code that imply a type when no message pattern matched."""

_DEFAULT_ACTIONS = {
    FOREIGN_KEY: "Resolve the dependent rows or tables first, then retry",
    SYNTAX: "Fix the syntax and retry",
    PERMISSION: "Use a resource you have access to, or ask the user for access",
    NOT_FOUND: "Check the name: list what exists first",
    EXISTS: "Use the existing resource, or pick another name",
    CONNECTION: "Check that the service is reachable, then retry",
    TIMEOUT: "Retry later, or make the operation smaller",
}

_MYSQL_CODE = re.compile(r"\b(?:ERROR\s+)?(?P<c>[1-9]\d{3})\s*\((?P<state>[0-9A-Z]{5})\)")
_PYMYSQL_CODE = re.compile(r"^\s*\(\s*(?P<c>[1-9]\d{3}),\s*['\"]")
_SQLSTATE = re.compile(r"SQLSTATE\s*[\[:=]?\s*(?P<c>[0-9A-Z]{5})")
_ERRNO = re.compile(r"\[Errno (?P<n>\d+)\]")
_SQLITE_CODE = re.compile(r"\bSQLITE_[A-Z_]+\b")


def _from_patterns(text: str, code: str | None) -> StructuredError:
    hit = None
    for rule in _RULES:
        m = rule.pattern.search(text)
        if m:
            hit = rule.build(m, text)
            break
    given = _clean_code(code)
    error_code = (given if given not in GENERIC_CODES else "") or (hit.code if hit else "") \
        or _code_in(text) or given
    error_type = hit.error_type if hit else UNKNOWN
    if error_type == UNKNOWN:
        error_type = _type_from_code(given) or _type_from_code(error_code) or UNKNOWN
    actions = list(hit.actions) if hit else []
    if not actions and error_type in _DEFAULT_ACTIONS:
        actions = [_DEFAULT_ACTIONS[error_type]]
    return StructuredError(
        error_code=error_code,
        error_type=error_type,
        message=text,
        affected_resources=_bounded(hit.affected if hit else []),
        dependencies=_bounded(hit.dependencies if hit else []),
        suggested_actions=_bounded(actions),
    )


def _clean_code(code: object) -> str:
    if code is None:
        return ""
    return str(code).strip()[:MAX_ITEM_CHARS]


def _code_in(text: str) -> str:
    """An error code the message itself carries (MySQL number, SQLSTATE, errno name)."""
    for pattern in (_MYSQL_CODE, _PYMYSQL_CODE, _SQLSTATE):
        m = pattern.search(text)
        if m:
            return m["c"]
    m = _ERRNO.search(text)
    if m:
        return errno.errorcode.get(int(m["n"]), f"ERRNO_{m['n']}")
    m = _SQLITE_CODE.search(text)
    return m[0] if m else ""


def _type_from_code(code: str) -> str:
    upper = code.upper()
    if not upper or upper in GENERIC_CODES:
        return ""
    for needle, error_type in _CODE_TYPES:
        if needle in upper:
            return error_type
    return ""


def _apply_details(found: StructuredError, details: Mapping[str, Any]) -> None:
    error_type = details.get("error_type")
    if isinstance(error_type, str) and error_type in ERROR_TYPES:
        found.error_type = error_type
    error_code = details.get("error_code")
    if isinstance(error_code, (str, int)) and not isinstance(error_code, bool) \
            and str(error_code).strip():
        found.error_code = _clean_code(error_code)
    for key in ("affected_resources", "dependencies", "suggested_actions"):
        if key not in details:
            continue
        value = details[key]
        if isinstance(value, str):
            items: list[str] = [value]
        elif isinstance(value, (list, tuple)):
            items = [str(v) for v in value if v is not None and str(v).strip()]
        else:
            continue
        setattr(found, key, _bounded(items))


def _bounded(items: Iterable[str]) -> list[str]:
    return [item[:MAX_ITEM_CHARS] for item in _dedup(items)][:MAX_ITEMS]


def _dedup(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        if item and item not in seen:
            seen[item] = None
    return list(seen)


def structured_hint(error: StructuredError) -> str:
    """One line of what is known about a failure, for the model's short error result.

    Empty when nothing beyond the message is known, so unknown errors cost no tokens.
    """
    if error.error_type == "unknown":
        return ""
    parts = [f"type: {error.error_type}"]
    if error.dependencies:
        parts.append("depends on: " + ", ".join(error.dependencies[:5]))
    if error.suggested_actions:
        parts.append("suggested: " + error.suggested_actions[0])
    return "[" + "; ".join(parts) + "]"
