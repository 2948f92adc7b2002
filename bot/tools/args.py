"""Checking a tool's arguments: small helpers for tool authors.

Models send arguments that do not match the schema often enough that every
tool should check them and answer with a precise ``INVALID_ARGUMENT`` error the
model can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.contracts.tools import ToolError


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
