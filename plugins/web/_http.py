"""How HTTP failures of the web tools read to the model: :class:`ToolError` with a code.

Transient ones (timeouts, dropped connections, 408/425/429 and 5xx answers) are
``retryable``, so the executor tries again and the model knows it may; the rest
are permanent.
"""

from __future__ import annotations

import ssl
from http import HTTPStatus
from typing import TYPE_CHECKING

from roost import ToolError

if TYPE_CHECKING:
    import httpx

__all__ = ["USER_AGENT", "status_error", "transport_error", "web_error"]

USER_AGENT = "Mozilla/5.0 (compatible; Roost/0.1; agent web tools)"
"""Sent with every request: some sites refuse clients that name none."""

_RETRYABLE_STATUSES = frozenset({408, 425, 429})


def web_error(message: str, code: str, *, retryable: bool = False, error_type: str = "",
              url: object = None, action: str = "", **facts: object) -> ToolError:
    """A :class:`ToolError` with the structured facts Roost's error channel shows.

    Put what matters first in ``message``: the model's summary keeps 80 characters.
    ``error_type`` is one of the error channel's (``permission_denied``,
    ``resource_not_found``, ``connection_error``, ``timeout``); ``url`` becomes the
    affected resource and ``action`` the suggested next step.
    """
    details: dict[str, object] = dict(facts)
    if error_type:
        details["error_type"] = error_type
    if url is not None:
        details["affected_resources"] = [str(url)]
    if action:
        details["suggested_actions"] = [action]
    return ToolError(message, code=code, retryable=retryable, details=details)


def status_error(what: str, response: httpx.Response) -> ToolError:
    """A :class:`ToolError` for an error answer: ``HTTP_<status>``, ``RATE_LIMITED``."""
    status = response.status_code
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    retryable = status >= 500 or status in _RETRYABLE_STATUSES
    message = f"HTTP {status} {phrase}".rstrip() + f" from {what}"
    facts: dict[str, object] = {"status": status}
    action = "Try again later" if retryable else "Check the URL; the server refuses it"
    if status == 429:
        retry_after = response.headers.get("retry-after", "")
        message += f" (rate limited; retry after {retry_after} s)" if retry_after \
            else " (rate limited)"
        if retry_after:
            facts["retry_after"] = retry_after
    elif retryable:
        message += " (a temporary failure; it may work if tried again)"
    code = "RATE_LIMITED" if status == 429 else f"HTTP_{status}"
    error_type = "resource_not_found" if status in (404, 410) else \
        "permission_denied" if status in (401, 403) else ""
    return web_error(message, code, retryable=retryable, error_type=error_type,
                     action=action, **facts)


def transport_error(what: str, exc: httpx.HTTPError, timeout: float) -> ToolError:
    """A :class:`ToolError` for a request that got no (complete) answer."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return web_error(f"timed out after {timeout:g} s: {what}", "TIMEOUT", retryable=True,
                         error_type="timeout", action="Try again, or another source")
    if _tls_failure(exc):
        # A certificate that does not match or is not trusted will not change on a retry.
        return web_error(f"TLS certificate refused: {what}: {exc}", "TLS_ERROR",
                         error_type="connection_error")
    if isinstance(exc, httpx.DecodingError):
        return web_error(f"undecodable body: {what} sent a body that cannot be decoded "
                         f"({exc})", "BAD_RESPONSE")
    reason = str(exc) or type(exc).__name__
    return web_error(f"connection failed: {what}: {reason}", "NETWORK", retryable=True,
                     error_type="connection_error", action="Try again later")


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # httpx wraps httpcore's error, which wraps the ssl module's
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError) \
                or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
