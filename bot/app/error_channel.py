"""The engine's error channel: failed and oversized tool results into their stores."""

from __future__ import annotations

import logging

from bot.app.services import AppServices as Services
from bot.contracts.llm import ToolCall
from bot.engine.requests import FailureHandler, LargeResultHandler
from bot.storage.errors import format_failure, format_large_result
from bot.tools.outcomes import RawError
from bot.tools.structured_errors import extract, structured_hint

log = logging.getLogger("roost.app.error_channel")

LARGE_RESULT_PREVIEW = 2_000
"""Characters of a stored large result the model sees at once."""


def error_channel(services: Services) -> tuple[
        FailureHandler | None, LargeResultHandler | None]:
    """The engine's hooks into the error and result stores (``None`` where absent)."""
    errors, results = services.errors, services.results

    async def on_failure(call: ToolCall, raw: RawError, session_key: str) -> str:
        assert errors is not None
        structured = extract(raw.message, code=raw.code, details=raw.details)
        detail = {**raw.as_dict(), **structured.to_dict()}
        try:
            stored = await errors.store(session_key, call.name, detail)
        except Exception:
            log.exception("the error store is unavailable; the model gets the error inline")
            stored = None
        text = format_failure(call.name, stored, raw.message)
        hint = structured_hint(structured)
        return f"{text}\n{hint}" if hint else text

    async def on_large(session_key: str, tool_name: str, content: str) -> str:
        assert results is not None
        result_id = await results.put(session_key, tool_name, content)
        return format_large_result(tool_name, result_id, content, LARGE_RESULT_PREVIEW)

    return (on_failure if errors else None), (on_large if results else None)
