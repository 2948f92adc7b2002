"""The one mapping of discord.py's and aiohttp's failures for :func:`channels.delivery.deliver`."""

from __future__ import annotations

import aiohttp
import discord

from bot.resilience.retry import parse_retry_after
from channels.delivery import RateLimited, Transient


def delivery_error(exc: BaseException) -> BaseException:
    """What a REST failure means to :func:`deliver`; ``exc`` itself if it is for good.

    The one mapping of what discord.py and aiohttp raise:

    * ``discord.RateLimited`` (a 429 longer than ``max_ratelimit_timeout``) and
      an ``HTTPException`` with status 429 (a limit discord.py did not wait
      out) → :class:`RateLimited`;
    * ``DiscordServerError`` and any ``HTTPException`` with a 5xx, whatever
      the body (an HTML error page included) → :class:`Transient`;
    * aiohttp's ``ClientError`` (resets, server disconnects), ``TimeoutError``
      (a stalled call) and ``OSError`` → :class:`Transient`;
    * ``Forbidden``, ``NotFound``, any other ``HTTPException`` and everything
      else → permanent.
    """
    if isinstance(exc, discord.RateLimited):
        return RateLimited(exc.retry_after)
    if isinstance(exc, discord.HTTPException):
        if exc.status == 429:
            return RateLimited(_retry_after(exc))
        if exc.status >= 500:
            return Transient(f"Discord answered HTTP {exc.status}")
        return exc
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return Transient(f"{type(exc).__name__}: {exc}")
    return exc


def _retry_after(exc: discord.HTTPException) -> float:
    header = exc.response.headers.get("Retry-After") if exc.response is not None else None
    return parse_retry_after(header, 1.0)
