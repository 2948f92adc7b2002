"""Checking a tool's arguments: the executor's schema check and helpers for tool authors.

Models send arguments that do not match the schema often enough that every
tool should check them and answer with a precise ``INVALID_ARGUMENT`` error the
model can act on. :func:`check_arguments` is the executor's own check against
the tool's ``input_schema`` before it runs; :func:`check_keys`, :func:`str_arg`
and :func:`int_arg` are for tool authors (exported by :mod:`roost`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bot.contracts.tools import Tool, ToolError

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool,
    "object": dict, "array": list,
}


def check_arguments(tool: Tool, args: Mapping[str, Any]) -> str:
    """A one-line problem with ``args`` against the tool's schema, or ''."""
    if not isinstance(args, Mapping):
        return "arguments must be a JSON object"
    if "_invalid_arguments" in args:
        return "the arguments were not valid JSON"
    schema = tool.input_schema
    missing = [k for k in schema.get("required", ()) if k not in args]
    if missing:
        return "missing " + ", ".join(repr(k) for k in missing)
    props: Mapping[str, Any] = schema.get("properties", {})
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"unexpected argument {key!r}"
            continue
        expected = _JSON_TYPES.get(spec.get("type", ""))
        if expected and (not isinstance(value, expected) or
                         (expected is not bool and isinstance(value, bool))):
            return f"{key!r} must be {spec['type']}, got {json.dumps(value)[:40]}"
    return ""


def check_keys(args: Mapping[str, Any], *, required: tuple[str, ...],
               optional: tuple[str, ...] = ()) -> None:
    """Refuse missing required keys and keys the tool does not know."""
    if not isinstance(args, Mapping):
        raise ToolError("arguments must be a JSON object", code="INVALID_ARGUMENT")
    allowed = (*required, *optional)
    missing = [k for k in required if k not in args]
    unknown = sorted(str(k) for k in args if k not in allowed)
    if missing or unknown:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown {', '.join(unknown)}")
        raise ToolError(f"bad arguments ({'; '.join(problems)}); expected {', '.join(allowed)}",
                        code="INVALID_ARGUMENT")


def str_arg(args: Mapping[str, Any], name: str, default: str | None = None) -> str:
    """The string argument ``name`` (or ``default`` when absent and given)."""
    value = args.get(name, default)
    if not isinstance(value, str):
        raise ToolError(f"'{name}' must be a string, got {type(value).__name__}",
                        code="INVALID_ARGUMENT")
    return value


def int_arg(args: Mapping[str, Any], name: str, default: int, *, minimum: int) -> int:
    """The integer argument ``name``, at least ``minimum``; ``default`` when absent."""
    value = args.get(name)
    if value is None:
        return default
    # Models sometimes send 8000.0 or "8000"; accept what is plainly an integer.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolError(f"'{name}' must be an integer, got {type(value).__name__}",
                        code="INVALID_ARGUMENT")
    if value < minimum:
        raise ToolError(f"'{name}' must be at least {minimum}, got {value}",
                        code="INVALID_ARGUMENT")
    return value
