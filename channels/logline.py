"""Platform values as safe, short log text."""

from __future__ import annotations


def short(value: object, limit: int = 200) -> str:
    """``value`` as one short log line: a hostile payload must not flood the log,
    nor break a UTF-8 log stream with a lone surrogate."""
    text = str(value)
    text = text if len(text) <= limit else text[:limit] + "…"
    return text.replace("\n", " ").encode("utf-8", "backslashreplace").decode("utf-8")
