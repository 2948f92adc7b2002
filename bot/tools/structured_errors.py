"""Structured facts pulled out of a tool's error message.

:func:`extract` turns an error message (plus the tool's error code and any
``details`` it attached) into a :class:`StructuredError`: a category
(``error_type``), the resources it names, what they depend on, and concrete
next steps. The fields are additive: the original message always travels with
them unchanged, so when a pattern misses, the model still reads the text.

Patterns (:mod:`bot.tools.error_patterns`) cover the usual wording of SQLite,
PostgreSQL and MySQL, Python and POSIX OS errors, and HTTP client errors. What a
tool says in ``details`` wins over any pattern, field by field. :func:`extract`
never raises: anything that goes wrong yields ``error_type="unknown"`` with the
message intact.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bot.tools.error_patterns import (
    CONNECTION,
    ERROR_TYPES,
    EXISTS,
    FOREIGN_KEY,
    NOT_FOUND,
    PERMISSION,
    SYNTAX,
    TIMEOUT,
    UNKNOWN,
    dedup,
    match,
)

__all__ = [
    "CONNECTION",
    "ERROR_TYPES",
    "EXISTS",
    "FOREIGN_KEY",
    "GENERIC_CODES",
    "MAX_ITEMS",
    "MAX_ITEM_CHARS",
    "NOT_FOUND",
    "PERMISSION",
    "SYNTAX",
    "TIMEOUT",
    "UNKNOWN",
    "StructuredError",
    "extract",
    "structured_hint",
]

log = logging.getLogger("roost.tools.structured_errors")

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
    hit = match(text)
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
    return [item[:MAX_ITEM_CHARS] for item in dedup(items)][:MAX_ITEMS]


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
