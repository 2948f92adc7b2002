"""Built-in plugin: fetch a stored tool error, or read a stored large tool result.

A failed tool call reaches the model as a short summary with an error ID, and
a very long result as a preview with a result ID (its format: ``roost.RESULT_ID_RE``).
These tools fetch the rest on demand:

- ``get_error_detail {error_id}``: the full stored error as JSON; offered only
  when ``services.errors`` is set;
- ``get_tool_result {result_id, offset?, length?}``: one slice of a stored
  result; offered only when ``services.results`` is set.

Both only see the current conversation's records (``context.session_key``): an
ID from another session is reported as not found. Failure codes:
``INVALID_ARGUMENT``, ``ERROR_NOT_FOUND``, ``RESULT_NOT_FOUND``,
``DATABASE_ERROR``.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from roost import (
    ERROR_ID_EXAMPLE,
    ERROR_ID_RE,
    RESULT_ID_EXAMPLE,
    RESULT_ID_RE,
    ErrorsView,
    JobSpec,
    ResultsView,
    Services,
    Settings,
    StoredErrorView,
    Tool,
    ToolContext,
    ToolError,
    check_keys,
    hookimpl,
    int_arg,
    str_arg,
)

if TYPE_CHECKING:
    from roost import Runtime

log = logging.getLogger("roost.plugins.error_tools")

DEFAULT_SLICE_CHARS = 8_000
"""``get_tool_result`` returns this many characters unless asked for another length."""


@hookimpl
def roost_tools(settings: Settings, services: Services | None) -> list[Tool]:
    """``get_error_detail`` and ``get_tool_result``, each only if its store is configured."""
    if services is None:
        return []
    tools: list[Tool] = []
    if services.errors is not None:
        tools.append(_error_detail_tool(services.errors))
    if services.results is not None:
        tools.append(_tool_result_tool(services.results, max(settings.large_result_chars,
                                                             DEFAULT_SLICE_CHARS)))
    return tools


def error_detail_json(stored: StoredErrorView) -> str:
    """What ``get_error_detail`` returns for one error."""
    return json.dumps({
        "error_id": stored.id,
        "timestamp": stored.iso_timestamp(),
        "tool_name": stored.tool_name,
        "short_summary": stored.short_summary,
        "raw_error": stored.raw_error,
    }, ensure_ascii=False, indent=2)


def _error_detail_tool(errors: ErrorsView) -> Tool:
    async def get_error_detail(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("error_id",))
        error_id = str_arg(args, "error_id").strip()
        stored = None
        if ERROR_ID_RE.fullmatch(error_id):
            try:
                stored = await errors.get(error_id, session_id=context.session_key)
            except (sqlite3.Error, ValueError) as exc:
                log.exception("get_error_detail %s failed", error_id)
                raise ToolError(f"could not read the error store: {exc}",
                                code="DATABASE_ERROR", retryable=True) from exc
        if stored is None:
            raise ToolError(
                f"error ID {error_id!r} was not found in this conversation. Error IDs look "
                f"like {ERROR_ID_EXAMPLE} and come from the '[Error ID: ...]' line of a "
                "failed tool call; copy one exactly.",
                code="ERROR_NOT_FOUND",
            )
        return error_detail_json(stored)

    return Tool(
        name="get_error_detail",
        read_only=True,
        description=(
            "Fetch the complete stored information about an earlier failed tool call in this "
            "conversation: full message, stack trace and any structured fields. Failed calls "
            "show only a short summary and an '[Error ID: ...]' line; most can be handled from "
            "the summary, so call this only when you need the detail to decide what to do. "
            "Returns JSON with error_id, timestamp, tool_name, short_summary and raw_error."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "error_id": {
                    "type": "string",
                    "description": f"The error ID from the failure message, e.g. "
                                   f"'{ERROR_ID_EXAMPLE}'.",
                },
            },
            "required": ["error_id"],
            "additionalProperties": False,
        },
        execute=get_error_detail,
    )


def _tool_result_tool(results: ResultsView, max_length: int) -> Tool:
    async def get_tool_result(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("result_id",), optional=("offset", "length"))
        result_id = str_arg(args, "result_id").strip()
        offset = int_arg(args, "offset", 0, minimum=0)
        length = min(int_arg(args, "length", DEFAULT_SLICE_CHARS, minimum=1), max_length)
        found = None
        if RESULT_ID_RE.fullmatch(result_id):
            try:
                found = await results.get_slice(result_id, offset, length,
                                                session_id=context.session_key)
            except (sqlite3.Error, ValueError) as exc:
                log.exception("get_tool_result %s failed", result_id)
                raise ToolError(f"could not read the result store: {exc}",
                                code="DATABASE_ERROR", retryable=True) from exc
        if found is None:
            raise ToolError(
                f"result ID {result_id!r} was not found in this conversation. Result IDs look "
                f"like {RESULT_ID_EXAMPLE} and come from the '[Result stored as ...]' line of "
                "a tool result; copy one exactly.",
                code="RESULT_NOT_FOUND",
            )
        text, total = found
        if offset >= total and total > 0:
            raise ToolError(
                f"offset {offset} is past the end of {result_id} ({total} characters); "
                f"use an offset from 0 to {total - 1}",
                code="INVALID_ARGUMENT",
            )
        end = offset + len(text)
        more = (f"next offset {end}; {total - end} characters left" if end < total
                else "end of result")
        return f"{text}\n\n[{result_id}: characters {offset}-{end} of {total}; {more}]"

    return Tool(
        name="get_tool_result",
        read_only=True,
        description=(
            "Read part of a large tool result that was stored instead of shown in full "
            "(its preview ends with '[Result stored as res_...: N characters ...]'). Returns "
            f"up to 'length' characters (default {DEFAULT_SLICE_CHARS}, at most {max_length}) "
            "starting at 'offset' (default 0), then a line with the total length and the "
            "next offset to ask for."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "result_id": {
                    "type": "string",
                    "description": f"The result ID, e.g. '{RESULT_ID_EXAMPLE}'.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Character offset to start at (default 0).",
                },
                "length": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": max_length,
                    "description": f"How many characters to return "
                                   f"(default {DEFAULT_SLICE_CHARS}).",
                },
            },
            "required": ["result_id"],
            "additionalProperties": False,
        },
        execute=get_tool_result,
    )







async def _retention(app: Runtime) -> None:
    await app.prune_stores()


@hookimpl
def roost_scheduled_jobs(settings: Settings) -> JobSpec:
    """Delete errors, stored results and answered inbox entries older than
    ``error_retention_days`` and run traces older than ``trace_retention_days``, daily."""
    return JobSpec("error-retention", "every 24h", _retention)
