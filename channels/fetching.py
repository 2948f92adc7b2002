"""Downloading a file over HTTP for a channel: byte-capped, transient failures retried.

Discord's CDN and Slack's ``url_private`` are read with aiohttp. The core gives
each download a byte limit, and a file past it must cost at most ``limit + 1``
bytes of memory whatever the server declares (or does not). A 5xx, a 429 or a
dropped connection is retried through :func:`channels.delivery.deliver`, as
posts are; what the platform means for good (a missing file, a refused token)
is the adapter's to say, through ``check``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

from bot.contracts.media import MediaError, MediaTooLarge
from bot.resilience.retry import parse_retry_after
from channels.delivery import DeliveryPolicy, RateLimited, Transient, deliver
from channels.logline import short

CHUNK = 64 * 1024


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of ``response``, or :class:`MediaTooLarge` once it passes ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before reading;
    otherwise the body is read in chunks and the reading stops at ``limit + 1``
    bytes (the size reported is then a lower bound).
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        raise MediaTooLarge(declared, limit)
    # Chunks joined once at the end: a growing buffer copied a 3 MB photo two or three
    # times over (each copy a few hundred page faults on top).
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise MediaTooLarge(size, limit)


async def fetch_capped(session: aiohttp.ClientSession, url: str, limit: int, *,
                       check: Callable[[aiohttp.ClientResponse], None], what: str,
                       policy: DeliveryPolicy, headers: Mapping[str, str] | None = None,
                       allow_redirects: bool = True) -> bytes:
    """GET ``url`` and read at most ``limit`` bytes of it; transient failures are retried.

    ``check`` sees every answer that is not a 5xx or a 429 and raises
    :class:`MediaError` for one that is no file (a 404, a refused token). After
    the last try a transient failure becomes :class:`MediaError` too, with
    ``what`` ("downloading x.pdf from Slack") and the last reason in one line.
    """
    from aiohttp import ClientError  # the caller's session has imported it already

    async def attempt() -> bytes:
        try:
            async with session.get(url, headers=headers,
                                   allow_redirects=allow_redirects) as response:
                if response.status == 429:
                    raise RateLimited(parse_retry_after(response.headers.get("Retry-After"),
                                                        1.0))
                if response.status >= 500:
                    raise Transient(f"HTTP {response.status}")
                check(response)
                return await read_capped(response, limit)
        except (ClientError, TimeoutError, OSError) as exc:
            raise Transient(f"{type(exc).__name__}: {short(exc, 120)}") from exc

    try:
        return await deliver(attempt, what=what, policy=policy)
    except Transient as exc:
        raise MediaError(f"{what} failed ({exc})") from exc
    except RateLimited as exc:
        raise MediaError(f"{what} failed (still rate limited)") from exc
