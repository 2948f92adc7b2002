"""Reading a file from an HTTP response without holding more of it than allowed.

Discord's CDN and Slack's ``url_private`` are read with aiohttp; the core gives
each download a byte limit, and a file past it must cost at most ``limit + 1``
bytes of memory, whatever the server declares (or does not).
"""

from __future__ import annotations

import aiohttp

from bot.contracts.media import MediaTooLarge

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
    data = bytearray()
    while True:
        chunk = await response.content.read(min(CHUNK, limit + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise MediaTooLarge(len(data), limit)
