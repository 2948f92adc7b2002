"""Secrets never reach a log: every record of every logger is redacted as it is made.

Third-party libraries put secrets in their messages (aiogram's errors carry
``…/bot<TOKEN>/getUpdates``; an HTTP client's names a URL with credentials).
:func:`install` wraps the logging record factory, so each record, whatever
logger made it and whichever handler writes it, has every configured secret
replaced by ``***`` in its message, its exception text and its stack before
any handler or formatter sees it. Credentials inside URLs
(``scheme://user:password@host``, ``?api_key=``) are masked whether configured or
not, by :func:`bot.config.masking.mask_text`, the function ``roost config show`` and
every CLI command use: a secret looks the same wherever Roost shows it.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from collections.abc import Iterable
from typing import Any

from pydantic import SecretStr

from bot.config.masking import SECRET_MASK, mask_text

MASK = SECRET_MASK
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MIN_SECRET = 6
"""Shorter values are not treated as secrets: masking them would mangle ordinary words."""

_state: dict[str, Any] = {"pattern": None, "base": None}


def secrets_of(settings: Any) -> list[str]:
    """Every secret value in ``settings``.

    Its ``SecretStr`` fields, secret-named plugin keys, and the ``env`` and ``headers``
    values of MCP servers (``${VAR}`` references resolved from the environment).
    """
    found: list[str] = []
    for _, value in settings:
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
    _walk(getattr(settings, "plugins", {}) or {}, found)
    servers = getattr(getattr(settings, "mcp", None), "servers", None) or {}
    for server in servers.values():
        for table in (getattr(server, "env", None) or {}, getattr(server, "headers", None) or {}):
            for value in map(str, table.values()):
                found.append(_REFERENCE.sub(lambda m: os.environ.get(m[1], ""), value))
                found.extend(os.environ.get(name, "") for name in _REFERENCE.findall(value))
    return found


def _walk(tree: Any, found: list[str], key: str = "") -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            _walk(v, found, str(k))
    elif isinstance(tree, str) and any(w in key.lower()
                                       for w in ("token", "secret", "key", "password")):
        found.append(tree)


def install(secrets: Iterable[str]) -> None:
    """Redact ``secrets`` (and URL credentials) from every log record from now on.

    Calling it again replaces the set of secrets.
    """
    values = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len, reverse=True)
    _state["pattern"] = re.compile("|".join(re.escape(v) for v in values)) if values else None
    if _state["base"] is None:
        base = logging.getLogRecordFactory()
        _state["base"] = base

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = base(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)


def redact(text: str) -> str:
    """``text`` with every installed secret and URL credential masked."""
    pattern = _state["pattern"]
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return mask_text(text)


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: let logging report it as usual
        return
    clean = redact(message)
    if clean != message or record.args:
        # Formatted once here, so a secret inside an argument is gone too.
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact(text)
        # The traceback is kept as text only: a formatter would otherwise
        # render the live exception again, secrets included.
        record.exc_info = None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
