"""Is a tool's failure worth retrying? The tool's view on :mod:`bot.resilience.retry`.

The shared classifier reads statuses, codes, exception types and text; this
module adds what only tools have: a :class:`~bot.contracts.tools.ToolError`'s
own ``code`` and ``retryable`` flag, the tool's ``permanent_codes`` and
``transient_codes``, and the rule that a tool's own report (a ``ToolError`` or
an ``is_error`` result) with no transient sign is permanent. Tools retry
rate limits like any transient failure, so the answer has two values.
"""

from __future__ import annotations

from typing import Literal

from bot.contracts.tools import Tool, ToolError
from bot.resilience import retry

__all__ = ["TOOL_ERROR", "Classification", "classify", "error_code"]

Classification = Literal["transient", "permanent"]

TOOL_ERROR = "TOOL_ERROR"
"""The code of a tool's report that names no code of its own."""


def error_code(error: BaseException | str) -> str:
    """The machine-readable code of ``error``, upper-case.

    An explicit :class:`ToolError` code first; then what
    :func:`bot.resilience.retry.code_of` finds (an HTTP status, the exception
    type, a telling phrase); else ``TOOL_ERROR`` for tool reports
    (``ToolError``, ``is_error`` text) and :func:`bot.resilience.retry.error_code`'s
    answer (``OS_ERROR``, the type name) for anything else.
    """
    if isinstance(error, ToolError) and error.code and error.code != TOOL_ERROR:
        return error.code.upper()
    if isinstance(error, str | ToolError):
        return retry.code_of(error) or TOOL_ERROR
    return retry.error_code(error)


def classify(error: BaseException | str, tool: Tool | None = None, *,
             code: str | None = None) -> Classification:
    """``transient`` (worth retrying) or ``permanent``.

    ``error`` is an exception or the text of an ``is_error`` result. In order:
    the tool's ``permanent_codes``/``transient_codes`` (matched case-insensitively
    against :func:`error_code`, so a tool may also name a type such as
    ``"ValueError"``); ``ToolError(retryable=True)``; the shared classifier's
    codes and HTTP statuses (408/425/429/5xx transient, other 4xx permanent); a
    tool's own report with no transient sign is permanent; anything unknown is
    transient.
    """
    code = (code or error_code(error)).upper()
    if tool is not None:
        if code in {c.upper() for c in tool.permanent_codes}:
            return "permanent"
        if code in {c.upper() for c in tool.transient_codes}:
            return "transient"
    if isinstance(error, ToolError) and error.retryable:
        return "transient"
    unknown: retry.Classification | None = "permanent" if isinstance(error, ToolError) else None
    found = retry.classify(error, code=code, unknown=unknown)
    return "permanent" if found == "permanent" else "transient"
