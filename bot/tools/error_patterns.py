"""The message patterns behind :func:`bot.tools.structured_errors.extract`.

One table of rules, most specific first: the usual wording of SQLite,
PostgreSQL and MySQL errors, Python and POSIX OS errors, HTTP client errors
and a few generic fallbacks. :func:`match` returns what the first matching
rule found (a category, the resources named, what they depend on, next steps);
:mod:`bot.tools.structured_errors` combines it with codes and a tool's details.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "CONNECTION",
    "ERROR_TYPES",
    "EXISTS",
    "FOREIGN_KEY",
    "NOT_FOUND",
    "PERMISSION",
    "SYNTAX",
    "TIMEOUT",
    "UNKNOWN",
    "Hit",
    "dedup",
    "match",
]

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
"""Every ``error_type`` :func:`bot.tools.structured_errors.extract` can return."""

# --- patterns -----------------------------------------------------------------

_ID1 = r"""(?:"[^"\n]+"|`[^`\n]+`|'[^'\n]+'|\[[^\]\n]+\]|[\w$]+)"""
_QID = rf"{_ID1}(?:\.{_ID1})*"
"""A possibly quoted, possibly qualified SQL name: ``x``, ``"x"``, ```db`.`x```, ``'db.x'``."""
_I = re.IGNORECASE


@dataclass(slots=True)
class Hit:
    """What a rule found in a message."""

    error_type: str
    affected: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    code: str = ""


_Build = Callable[[re.Match[str], str], Hit]


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: str
    flags: int
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
    return lambda _m, _t: Hit(error_type, actions=list(actions))


def _rule(pattern: str, build: _Build, flags: int = _I) -> _Rule:
    return _Rule(pattern, flags, build)


# Foreign keys --------------------------------------------------------------------


def _drop_blocked(parent: str, children: list[str], constraint: str = "") -> Hit:
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
    return Hit(FOREIGN_KEY, [parent] if parent else [], children, actions)


def _mysql_drop(m: re.Match[str], _t: str) -> Hit:
    return _drop_blocked(_name(m["a"]), _names([m["b"]]), _name(m["fk"]))


def _pg_drop(m: re.Match[str], text: str) -> Hit:
    parent = _name(m["a"])
    children, constraints = [], []
    for dep in re.finditer(rf"constraint ({_QID}) on table ({_QID}) depends on", text, _I):
        constraints.append(_name(dep[1]))
        children.append(_name(dep[2]))
    hit = _drop_blocked(parent, dedup(children), constraints[0] if constraints else "")
    hit.actions.insert(min(2, len(hit.actions) - 1), f"Or use DROP TABLE {parent} CASCADE")
    return hit


def _parent_row(parent: str, child: str, constraint: str = "") -> Hit:
    fk = f" {constraint}" if constraint else ""
    actions = [
        f"Delete or update the rows in {child} that reference {parent} first"
        if child else "Delete or update the referencing rows first",
        f"Or define the foreign key{fk} with ON DELETE CASCADE",
    ]
    return Hit(FOREIGN_KEY, [parent] if parent else [], [child] if child else [], actions)


def _pg_parent(m: re.Match[str], _t: str) -> Hit:
    return _parent_row(_name(m["a"]), _name(m["b"]), _name(m["fk"]))


def _mysql_parent(m: re.Match[str], _t: str) -> Hit:
    return _parent_row(_name(m["a"]), _name(m["b"]), _name(m["fk"]))


def _child_row(child: str, parent: str) -> Hit:
    target = parent or "the referenced table"
    return Hit(FOREIGN_KEY, [child] if child else [], [parent] if parent else [], [
        f"Insert the referenced row into {target} first",
        f"Or use a key value that exists in {target}",
    ])


def _pg_child(m: re.Match[str], text: str) -> Hit:
    parent = re.search(rf"is not present in table ({_QID})", text, _I)
    return _child_row(_name(m["b"]), _name(parent[1]) if parent else "")


def _mysql_child(m: re.Match[str], _t: str) -> Hit:
    return _child_row(_name(m["b"]), _name(m["a"]))


def _fk_mismatch(m: re.Match[str], _t: str) -> Hit:
    child, parent = _name(m["b"]), _name(m["a"])
    return Hit(FOREIGN_KEY, [child], [parent], [
        f"Fix the foreign key of {child}: the columns it references in {parent} "
        "must exist and be its PRIMARY KEY or UNIQUE",
    ])


# Syntax --------------------------------------------------------------------------


def _near(token: str, line: str | None = None) -> Hit:
    where = f" (line {line})" if line else ""
    return Hit(SYNTAX, actions=[
        f"Fix the statement near {token}{where}: check keywords, quoting, commas and "
        "parentheses",
    ])


def _syntax_near(m: re.Match[str], _t: str) -> Hit:
    return _near(m["tok"].strip(), m.groupdict().get("line"))


def _syntax_near_mysql(m: re.Match[str], _t: str) -> Hit:
    token = m["tok"].strip()
    return _near(f"'{token}'" if token else "the end of the statement", m["line"])


# Missing and existing resources ---------------------------------------------------

_KIND_ALIASES = {"relation": "table"}


def _missing(m: re.Match[str], _t: str) -> Hit:
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
    return Hit(NOT_FOUND, [a for a in affected if a], actions=actions)


def _existing(m: re.Match[str], _t: str) -> Hit:
    groups = m.groupdict()
    kind = _KIND_ALIASES.get((groups.get("kind") or "table").lower(),
                             (groups.get("kind") or "table").lower())
    name = _name(groups.get("n"))
    owner = _name(groups.get("rel"))
    if kind == "column":
        resource = f"{owner}.{name}" if owner else name
        actions = [f"The column {resource} already exists: use it, or pick another name"]
        return Hit(EXISTS, [resource], actions=actions)
    guard = " (or CREATE ... IF NOT EXISTS)" if kind in {"table", "index", "view"} else ""
    actions = [f"The {kind} {name} already exists: use it, or pick another name{guard}",
               "Drop it first only if it should really be replaced"]
    return Hit(EXISTS, [name] if name else [], actions=actions)


def _duplicate_key(tables: list[str], what: str) -> Hit:
    return Hit(EXISTS, tables, actions=[
        f"A row with the same {what} already exists: update that row instead, "
        "or insert a different value",
        "Or use an upsert (INSERT ... ON CONFLICT / ON DUPLICATE KEY UPDATE)",
    ])


def _sqlite_unique(m: re.Match[str], _t: str) -> Hit:
    columns = [c.strip() for c in m["cols"].split(",")]
    tables = dedup(c.rsplit(".", 1)[0] for c in columns if "." in c)
    return _duplicate_key(tables, ", ".join(columns))


def _pg_unique(m: re.Match[str], text: str) -> Hit:
    key = re.search(r"Key \((?P<cols>[^)]*)\)=\((?P<v>[^)]*)\) already exists", text, _I)
    what = f"{key['cols']} ({key['v']})" if key else f"key ({_name(m['c'])})"
    return _duplicate_key([], what)


def _mysql_duplicate(m: re.Match[str], _t: str) -> Hit:
    key = _unquote(m["k"])  # MySQL 8 says 'table.key'
    tables = [key.rsplit(".", 1)[0]] if "." in key else []
    return _duplicate_key(tables, f"value {m['v']} for key {key}")


# Permissions -----------------------------------------------------------------------


def _pg_denied(m: re.Match[str], _t: str) -> Hit:
    name = _name(m["n"])
    return Hit(PERMISSION, [name], actions=[
        f"You lack the privilege on {name}: use another object or ask the user for access",
    ])


def _mysql_denied_cmd(m: re.Match[str], _t: str) -> Hit:
    table = _name(m["t"])
    return Hit(PERMISSION, [table], actions=[
        f"This account may not run {m['cmd'].upper()} on {table}: "
        "ask the user for the privilege or use another table",
    ])


def _mysql_access(m: re.Match[str], _t: str) -> Hit:
    db = _name(m.groupdict().get("db"))
    return Hit(PERMISSION, [db] if db else [], actions=[
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
    def build(_m: re.Match[str], text: str) -> Hit:
        paths = _path(text)
        target = paths[0] if paths else "the path"
        named = re.search(rf"\b{code}\b", text)  # [Errno N] is read by _code_in
        return Hit(error_type, paths, actions=[a.format(path=target) for a in actions],
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


def _http(m: re.Match[str], text: str) -> Hit:
    status = int(m["s"])
    urls = [u.rstrip(".,;:") for u in _URL.findall(text)][:1]
    code = f"HTTP_{status}"
    target = urls[0] if urls else "the URL"
    if status in (404, 410):
        return Hit(NOT_FOUND, urls, actions=[f"Check {target}: it does not exist"], code=code)
    if status in (401, 403, 407):
        return Hit(PERMISSION, urls, actions=[
            "Check the credentials or token; ask the user if access is missing"], code=code)
    if status == 409:
        return Hit(EXISTS, urls, actions=[
            "The request conflicts with the current state (it may already exist): "
            "fetch the current state, then retry"], code=code)
    if status in (408, 504):
        return Hit(TIMEOUT, urls, actions=["Retry later, or ask for less at once"], code=code)
    if status == 429:
        return Hit(CONNECTION, urls, actions=[
            "Rate limited: wait before retrying (honour Retry-After if given)"], code=code)
    if status >= 500:
        return Hit(CONNECTION, urls, actions=[
            "The remote service failed: retry later"], code=code)
    return Hit(UNKNOWN, urls, code=code)


# Connection ---------------------------------------------------------------------------


_HOST = re.compile(
    r"""(?:server (?:on|at)|connection to server at)\s+(?P<h>'[^']+'|"[^"]+"|[\w.:-]+)""", _I)


def _connection(m: re.Match[str], text: str) -> Hit:
    urls = _URL.findall(text)[:1]
    host = _HOST.search(text)
    affected = urls or ([_unquote(host["h"])] if host else [])
    return Hit(CONNECTION, affected, actions=[
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
          lambda m, _t: Hit(NOT_FOUND, [_unquote(m["n"])], actions=[
              f"Check the name {m['n']}: list what exists first"])),
    _rule(r"\bdoes not exist\b|\bdoesn't exist\b|\bnot found\b",
          _fixed(NOT_FOUND, "Check the name: list what exists first")),
    _rule(r"\balready exists\b", _fixed(EXISTS, "Use the existing one, or pick another name")),
    _rule(r"\bpermission denied\b|\baccess denied\b|\bforbidden\b|\bunauthori[sz]ed\b",
          _fixed(PERMISSION, "Access was refused: use another resource or ask the user")),
)


@functools.cache
def _compiled() -> tuple[tuple[re.Pattern[str], _Build], ...]:
    """The rules' patterns, compiled when a tool first fails rather than at start."""
    return tuple((re.compile(rule.pattern, rule.flags), rule.build) for rule in _RULES)


def match(text: str) -> Hit | None:
    """What the first rule matching ``text`` found, or ``None``."""
    for pattern, build in _compiled():
        m = pattern.search(text)
        if m:
            return build(m, text)
    return None


def dedup(items: Iterable[str]) -> list[str]:
    """``items`` without blanks and repeats, in first-seen order."""
    seen: dict[str, None] = {}
    for item in items:
        if item and item not in seen:
            seen[item] = None
    return list(seen)
