"""The HTTP client of Roost's OpenAI SDK clients (chat provider, transcription).

The SDK's default client, except that its TLS context is made once per process and
shared: the SDK builds one per client, loading the whole CA store each time. The
context is the one the SDK makes by default (the same CAs, ``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` honoured; certificates and host names checked).
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

__all__ = ["http_client", "sdk_tls"]


@functools.cache
def sdk_tls() -> ssl.SSLContext:
    """The TLS context the SDK's HTTP package makes by default, made once per process."""
    import openai._base_client as base  # the SDK's HTTP package: httpx2 (3.x) or httpx

    http: Any = getattr(base, "httpx2", None) or getattr(base, "httpx")  # noqa: B009
    context: ssl.SSLContext = http.create_ssl_context()
    return context


def http_client() -> openai.DefaultAsyncHttpxClient:
    """A new SDK default HTTP client (its timeout, limits, redirects) on :func:`sdk_tls`."""
    import openai

    return openai.DefaultAsyncHttpxClient(verify=sdk_tls())
