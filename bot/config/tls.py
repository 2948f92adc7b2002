"""The TLS context Roost's outgoing clients verify servers with.

One per process, made on first use: building a context loads the whole CA bundle,
and an ``ssl.SSLContext`` is meant to be shared by every connection that trusts the
same authorities. It is certifi's bundle (as aiogram and httpx use by default), with
certificates and host names checked.
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["client_tls"]


@functools.cache
def client_tls() -> ssl.SSLContext:
    """The shared client context: certifi's CAs, certificate and host name required."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())
